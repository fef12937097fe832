"""minite_kernels.capture: the quantizers' capture-safe non-finite path gives the eager bytes, and captures."""
from __future__ import annotations

import pytest
import torch

from minite_kernels import capture
from minite_kernels.formats.mxfp8 import quantize_mxfp8
from minite_kernels.formats.nvfp4 import quantize_nvfp4


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g)
    bad = x.clone()
    bad[1, 3], bad[4, 40] = float("nan"), float("inf")
    return {"finite": x, "non-finite": bad}


def _fields(q):
    """The quantized tensor's stored bytes (NaN-safe to compare): data, scales and, for NVFP4, the amax."""
    ts = [q.data, q.scales] + ([q.amax] if hasattr(q, "amax") else [])
    return [t.contiguous().view(torch.uint8) for t in ts]


def _same(want, got):
    return all(torch.equal(a, b) for w, g in zip(want, got) for a, b in zip(w, g))


@pytest.mark.parametrize("kind", ["finite", "non-finite"])
@pytest.mark.parametrize("quant", [lambda x: quantize_nvfp4(x, scaling="per_token"),
                                   lambda x: quantize_nvfp4(x, scaling="per_tensor", tile=(16, 16)),
                                   quantize_mxfp8], ids=["nvfp4_token", "nvfp4_tensor_16x16", "mxfp8"])
def test_path_taken_under_capture_gives_the_eager_bytes(monkeypatch, kind, quant):
    x = _inputs()[kind]
    eager = _fields(quant(x))
    monkeypatch.setattr(capture, "capturing", lambda: True)
    assert capture.any_or_capturing(torch.zeros(3, dtype=torch.bool))
    assert _same([eager], [_fields(quant(x))])


def test_any_or_capturing_reads_the_mask_eagerly():
    assert not capture.capturing()
    assert capture.any_or_capturing(torch.tensor([False, True]))
    assert not capture.any_or_capturing(torch.tensor([False, False]))


@pytest.mark.parametrize("quant", [lambda x: quantize_nvfp4(x, scaling="per_token"),
                                   lambda x: quantize_nvfp4(x, scaling="per_tensor", tile=(16, 16)),
                                   quantize_mxfp8], ids=["nvfp4_token", "nvfp4_tensor_16x16", "mxfp8"])
def test_quantize_and_dequantize_make_no_host_trip_while_capturing(monkeypatch, quant):
    """The CPU stand-in for a capture: after a warm-up (which builds the cached tables), quantizing and
    dequantizing under capture neither makes a tensor from host data nor reads one on the host."""
    x = _inputs()["finite"]
    quant(x).dequantize(torch.float32)  # warm-up
    monkeypatch.setattr(capture, "capturing", lambda: True)
    with capture.HostTrips() as trips:
        quant(x).dequantize(torch.float32)
    assert trips.seen == []


@pytest.mark.gpu
def test_gpu_quantizers_capture_and_replay_the_eager_bytes():
    x = torch.randn(32, 256, device="cuda")
    want = [_fields(quantize_nvfp4(x, scaling="per_token")), _fields(quantize_mxfp8(x))]
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the default stream, as capture requires
        quantize_nvfp4(x, scaling="per_token"), quantize_mxfp8(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = [_fields(quantize_nvfp4(x, scaling="per_token")), _fields(quantize_mxfp8(x))]
    graph.replay()
    torch.cuda.synchronize()
    assert _same(want, got)

"""TensorMonitor and quantization_stats on small nn.Linear models (report §4.4)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from minite_kernels.formats import quantize_nvfp4
from minite_kernels.metrics import rel_l2, snr_db
from minite_kernels.monitors import TensorMonitor, quantization_stats, tensor_stats


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))


def test_quantization_stats_hand_built_cases():
    # block 0: [1e-3, 1, 0 x 14]; block 1: [2688, 0 x 15]. Per-tensor S_enc = 1; block 0 scale = e4m3(1/6) = 0.171875,
    # enc = 1/0.171875 = 5.818...; 1e-3 * 5.8 = 0.0058 -> code 0: one underflow out of 3 nonzero inputs.
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 16] = 1e-3, 1.0, 2688.0
    s = quantization_stats(x)
    assert s["underflow_frac"] == pytest.approx(1 / 3)
    assert s["zero_scale_frac"] == 0.0
    q = quantize_nvfp4(x)
    assert s["rel_l2"] == rel_l2(x, q.dequantize()) and s["snr_db"] == snr_db(x, q.dequantize())
    # a block whose scale underflows to 0 (notes §1.9): its 16 nonzero values all decode to 0
    y = torch.zeros(1, 32)
    y[0, :16] = 0.001
    y[0, 16] = 2688.0
    t = quantization_stats(y)
    assert t["zero_scale_frac"] == 0.5 and t["underflow_frac"] == pytest.approx(16 / 17)


def test_saturation_counts_elements_the_clamp_changed():
    # S_enc = 1 (amax 2688 in block 2). Block 0 max v = 1.4*2^-9*6: pre = 1.4*2^-9 -> subnormal E4M3 2^-9,
    # enc = 512, v*enc = 8.4 >= 7: the clamp to 6 changed its rounding -> saturated.
    # Block 1 max 6.2: pre = 1.0333 -> 1.0, 6.2*1 = 6.2 < 7 -> still rounds to 6, not counted.
    # Block 2: 2688 * fl(1/448) is a hair above 6 -> not counted.
    x = torch.zeros(1, 48)
    x[0, 0], x[0, 16], x[0, 32] = 1.4 * 2**-9 * 6, 6.2, 2688.0
    s = quantization_stats(x)
    assert s["saturation_frac"] == pytest.approx(1 / 48)
    assert quantize_nvfp4(x).scales[0, 0].float().item() == 2**-9


def test_tensor_stats_basic_and_nonfinite():
    x = torch.tensor([[1.0, -3.0, 2.0, 0.0] * 4])
    s = tensor_stats(x)
    assert (s["amax"], s["min"], s["max"], s["mean"]) == (3.0, -3.0, 2.0, 0.0)
    assert s["norm"] == pytest.approx(math.sqrt(14 * 4)) and s["nonfinite_frac"] == 0.0
    assert "nvfp4_rel_l2" not in s
    s2 = tensor_stats(x, {"scaling": "per_token"})
    assert "nvfp4_snr_db" in s2
    x[0, 0] = float("nan")
    s3 = tensor_stats(x, {})
    assert s3["nonfinite_frac"] == 1 / 16 and "nvfp4_rel_l2" not in s3 and s3["amax"] == 3.0


def test_monitor_records_namespaced_stats_every_n_steps():
    model = make_model()
    mon = TensorMonitor(model, include=["2"], every=2)
    assert list(mon.modules) == ["2"]
    x = torch.randn(8, 32)
    for step in range(3):
        model(x).pow(2).sum().backward()
        rec = mon.collect()
        if step % 2 == 0:
            assert rec["monitor/2/weight/amax"] == model[2].weight.abs().max().item()
            with torch.no_grad():  # layer 2's output without calling the hooked module again
                out = nn.functional.linear(torch.relu(model[0](x)), model[2].weight, model[2].bias)
            assert rec["monitor/2/output/max"] == pytest.approx(out.max().item())
            # gradient of sum(y^2) w.r.t. y is 2y
            assert rec["monitor/2/grad_output/norm"] == pytest.approx(2 * out.norm().item(), rel=1e-5)
            # layer 2 has K = 64: NVFP4 stats present for its input; its output (16 wide) too
            assert "monitor/2/input/nvfp4_snr_db" in rec and rec["monitor/2/input/nvfp4_snr_db"] > 10
            assert not any(k.startswith("monitor/0/") for k in rec)
        else:
            assert rec == {}
        mon.step()
    mon.detach()
    model(x)
    assert mon.collect() == {}


def test_monitor_reduces_over_micro_batches():
    model = make_model()
    mon = TensorMonitor(model, include=["0"], kinds=["input"], nvfp4=None)
    a, b = torch.ones(2, 32), -3 * torch.ones(2, 32)
    model(a)
    model(b)
    rec = mon.collect()
    assert rec["monitor/0/input/amax"] == 3.0 and rec["monitor/0/input/min"] == -3.0
    assert rec["monitor/0/input/mean"] == pytest.approx(-1.0)  # mean of (1, -3)
    assert not any("nvfp4" in k for k in rec)


def test_monitor_dumps_nonfinite_tensors(tmp_path):
    model = make_model()
    mon = TensorMonitor(model, include=["0"], kinds=["input"], dump_dir=tmp_path)
    x = torch.randn(2, 32)
    x[1, 3] = float("inf")
    with torch.no_grad():
        model(x)
    rec = mon.collect()
    assert rec["monitor/0/input/nonfinite_frac"] == 1 / 64
    assert len(mon.dumped) == 1
    saved = torch.load(mon.dumped[0])
    assert torch.equal(saved, x)
    assert not list(tmp_path.glob("*.tmp"))


def test_monitor_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError, match=r"no module matches.*candidate modules: \['0', '2'\]"):
        TensorMonitor(model, include=["layers.*"])
    with pytest.raises(ValueError, match="every=0"):
        TensorMonitor(model, every=0)
    with pytest.raises(ValueError, match="'grad_input' is not a tensor kind"):
        TensorMonitor(model, kinds=["grad_input"])

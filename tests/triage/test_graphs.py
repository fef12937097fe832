"""The padded pass behind the CUDA graphs (triage.graphs, triage.fused._padded), on the CPU.

The CPU never captures a graph, but it runs everything around it: buckets, zero-padded static buffers, the
crop back to the caller's shape, and the cache. The GPU tests (``tests/triage/test_gpu.py``) add the capture.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triage_cases import CONFIGS, inputs

import triage.fused
from triage import TriageConfig, triage_policy_loss
from triage.fused import fused_terms
from triage.graphs import PaddedGraphs, bucket
from triage.inputs import as_advantages


@pytest.fixture
def padded_route(monkeypatch, force_sync_free):
    """Route ``fused_terms`` through the padded pass on the CPU, as CUDA does (its sync-free code path too),
    with an empty cache."""
    monkeypatch.setattr(triage.fused, "usable", lambda device: True)
    monkeypatch.setattr(triage.fused, "GRAPHS", PaddedGraphs())
    return triage.fused


def eager(cfg: TriageConfig) -> TriageConfig:
    return TriageConfig(**{**cfg.to_dict(), "cuda_graphs": False})


def test_bucket_examples():
    assert [bucket(n) for n in (1, 2, 7, 8, 9, 10, 11, 17, 48, 300, 1000, 8192)] == [
        1, 2, 7, 8, 10, 10, 12, 20, 48, 320, 1024, 8192]
    assert bucket(300, 128) == 384
    assert bucket(5, 35) == 35
    with pytest.raises(ValueError, match="n >= 1"):
        bucket(0)


@given(st.integers(1, 1 << 20), st.sampled_from([1, 35, 64, 128]))
@settings(max_examples=300, deadline=None)
def test_bucket_invariants(n, multiple):
    m = bucket(n)
    assert n <= m < 1.25 * n + 1  # at most 25% padding
    assert m.bit_count() <= 3  # few buckets: four per octave
    assert bucket(m) == m and bucket(n + 1) >= m  # idempotent, monotone (multiple=1)
    mm = bucket(n, multiple)
    assert mm % multiple == 0 and mm >= m and mm - m < multiple


def loss_and_grad(cfg, logp0, old, sampler, adv, mask):
    x = logp0.clone().requires_grad_()
    loss, metrics = triage_policy_loss(x, old, sampler, adv, mask, cfg)
    loss.backward()
    return loss.detach(), x.grad, metrics


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.repair_segment_len == 128])
def test_bucket_shape_is_bit_equal_to_the_eager_pass(padded_route, cfg):
    # 8 x 256 is a bucket: nothing is padded
    assert (bucket(8), bucket(256, math.lcm(cfg.gate_segment_len, cfg.repair_segment_len))) == (8, 256)
    args = inputs(0, 8, 256, nonfinite=True)
    for _ in range(2):
        got = loss_and_grad(cfg, *args)
        want = loss_and_grad(eager(cfg), *args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert got[2] == want[2]
    assert len(padded_route.GRAPHS) == 1


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("shape", [(5, 300), (9, 1000), (1, 1), (3, 37)])
@pytest.mark.parametrize("adv_2d", [False, True])
def test_padded_pass_equals_the_unpadded_one(padded_route, cfg, shape, adv_2d):
    args = inputs(1, *shape, adv_2d=adv_2d, nonfinite=shape[1] > 3)
    loss, grad, metrics = loss_and_grad(cfg, *args)
    loss_e, grad_e, metrics_e = loss_and_grad(eager(cfg), *args)
    # only the order of fp32 sums differs
    torch.testing.assert_close(loss, loss_e, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, grad_e, rtol=1e-6, atol=1e-9)
    assert metrics.keys() == metrics_e.keys()
    for k in metrics:
        assert metrics[k] == pytest.approx(metrics_e[k], rel=1e-5, abs=1e-7), k


def zero_pad(x: torch.Tensor, b: int, t: int) -> torch.Tensor:
    out = torch.zeros((b, t) if x.dim() == 2 else (b,), dtype=x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


@pytest.mark.parametrize("cfg", [TriageConfig(), CONFIGS[5]])
def test_padded_pass_is_the_eager_pass_of_zero_padded_inputs_whatever_came_before(padded_route, cfg):
    """The fused pass's buffers and metrics are those of the eager pass on the zero-padded inputs, bit for bit,
    also after a larger input of the same bucket left other values in the padding."""
    seg = math.lcm(cfg.gate_segment_len, cfg.repair_segment_len)
    bp, tp = bucket(10), bucket(1000, seg)
    assert (bucket(9), bucket(900, seg)) == (bp, tp)
    big = inputs(5, 10, 1000, nonfinite=True)
    fused_terms(big[0], big[1], big[3], big[4], cfg, sampler_logp=big[2])
    logp, old, sampler, adv, mask = inputs(6, 9, 900, nonfinite=True)
    got = fused_terms(logp, old, adv, mask, cfg, sampler_logp=sampler)
    padded = [zero_pad(x, bp, tp) for x in (logp, old, sampler, adv, mask)]
    want = fused_terms(padded[0], padded[1], padded[3], padded[4], eager(cfg), sampler_logp=padded[2])
    for name in ("k_adv", "u", "r_active", "valid", "repair_member"):
        assert torch.equal(getattr(got, name), getattr(want, name)[:9, :900]), name
    for name in ("gate_sum", "row_tokens"):
        assert torch.equal(getattr(got, name), getattr(want, name)[:9]), name
    assert torch.equal(got.repair_seg_grad, want.repair_seg_grad[:9, : got.repair_seg_grad.shape[1]])
    for name in ("phi_sum", "num_segments", "num_active"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.metrics.keys() == want.metrics.keys()
    for k in got.metrics:
        assert torch.equal(got.metrics[k], want.metrics[k]), k


def test_broadcast_advantages_travel_as_rows(padded_route):
    logp, old, sampler, adv, mask = inputs(2, 4, 100)
    fused_terms(logp, old, adv, mask, TriageConfig(), sampler_logp=sampler)
    fused_terms(logp, old, adv.unsqueeze(-1).expand(4, 100).contiguous(), mask, TriageConfig(), sampler_logp=sampler)
    keys = list(padded_route.GRAPHS._entries)
    assert [k[3] for k in keys] == [True, False]  # [B] advantages: a [B] buffer; [B, T]: a [B, T] one
    assert as_advantages(adv, "logp", logp).stride(-1) == 0


def test_cache_keeps_the_most_recent_entries():
    cache = PaddedGraphs(max_entries=2)
    x = torch.arange(6.0).view(2, 3)
    for key in ("a", "b", "a", "c"):
        out = cache.run(key, lambda buf: buf * 2, (x,), ((4, 4),), (torch.float32,))
        assert torch.equal(out[:2, :3], x * 2) and out[2:].abs().sum() == 0 and out[:, 3:].abs().sum() == 0
    assert list(cache._entries) == ["a", "c"]  # "b" was the least recently used
    assert not cache.captured("a")  # no capture off CUDA
    with pytest.raises(ValueError, match="max_entries"):
        PaddedGraphs(max_entries=0)


def test_config_switch():
    assert TriageConfig().cuda_graphs is True
    with pytest.raises(TypeError, match="cuda_graphs must be a bool"):
        TriageConfig(cuda_graphs=1)

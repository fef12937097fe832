"""The fused fast path (triage.loss / triage.fused) against the plain-autograd reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triage import TriageConfig, triage_policy_loss
from triage.reference import triage_policy_loss_reference

CONFIGS = [
    TriageConfig(),
    TriageConfig(gate=False),
    TriageConfig(repair=False),
    TriageConfig(tis=False),
    TriageConfig(diagnostics=False),
    TriageConfig(
        gate_segment_len=5, repair_segment_len=7, tis_cap=0.8, repair_boundary=0.3, gate_tail_threshold=0.5
    ),
    TriageConfig(clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=1.5, repair_huber_delta=0.3),
]


def inputs(seed, b, t, scale=2.0, adv_2d=False, nonfinite=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 4
    logp = old + 0.4 * torch.randn(b, t, generator=g)
    offset = 2.5 * torch.rand(b, 1, generator=g)
    sampler = old + scale * torch.randn(b, t, generator=g) + offset
    adv = torch.randn(b, generator=g)
    adv[torch.rand(b, generator=g) < 0.2] = 0.0
    mask = torch.rand(b, t, generator=g) > 0.2
    if adv_2d:
        adv = adv.unsqueeze(-1) * mask
    if nonfinite:
        idx = torch.randint(0, b * t, (3,), generator=g)
        logp.view(-1)[idx[0]] = float("nan")
        sampler.view(-1)[idx[1]] = float("-inf")
        old.view(-1)[idx[2]] = float("inf")
    return logp.to(dtype), old.to(dtype), sampler.to(dtype), adv, mask


def compare(cfg, logp0, old, sampler, adv, mask, rtol=1e-5):
    a = logp0.clone().requires_grad_()
    la, ma = triage_policy_loss(a, old, sampler, adv, mask, cfg)
    la.backward()
    b = logp0.clone().requires_grad_()
    lb, mb = triage_policy_loss_reference(b, old, sampler, adv, mask, cfg)
    lb.backward()
    torch.testing.assert_close(la, lb, rtol=rtol, atol=1e-6)
    # bf16 gradients: both are fp32 values rounded to bf16, so they may differ by one bf16 ulp (2^-8)
    grad_rtol = 8e-3 if logp0.dtype == torch.bfloat16 else rtol
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=grad_rtol, atol=1e-7)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("adv_2d", [False, True])
def test_fused_matches_reference(cfg, adv_2d):
    compare(cfg, *inputs(0, 7, 301, adv_2d=adv_2d))


def test_fused_matches_reference_nonfinite_and_bf16():
    compare(TriageConfig(), *inputs(1, 5, 200, nonfinite=True))
    compare(TriageConfig(), *inputs(2, 4, 256, dtype=torch.bfloat16))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 5),
    st.integers(1, 300),
    st.floats(0.01, 8.0),
    st.booleans(),
    st.sampled_from(range(len(CONFIGS))),
)
def test_property_fused_matches_reference(seed, b, t, scale, adv_2d, ci):
    compare(CONFIGS[ci], *inputs(seed, b, t, scale, adv_2d))

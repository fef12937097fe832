from __future__ import annotations

import math

import pytest
import torch

from triage import TriageConfig, repair_loss
from triage.repair import pseudo_huber

C2 = TriageConfig(repair_segment_len=2)  # 2-token segments; b = -0.5, c = 1, coef = 0.1


def run(d_rows, adv, cfg=C2, mask=None):
    """repair_loss with sampler_logp = 0 so that the current gap d = logp."""
    logp = torch.tensor(d_rows, dtype=torch.float32, requires_grad=True)
    sampler = torch.zeros_like(logp)
    m = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    loss, metrics = repair_loss(logp, sampler, torch.tensor(adv), m, cfg)
    loss.backward()
    return loss, logp.grad, metrics


def test_worked_example():
    # segment 0: gbar = (-1 - 2)/2 = -1.5, x = -0.5 + 1.5 = 1, phi = sqrt(2) - 1; segment 1: gbar = 0 -> x = 0
    # N_seg = 2 -> L = 0.1 * 0.41421 / 2 = 0.0207107
    loss, grad, metrics = run([[-1.0, -2.0, 0.0, 0.0]], [1.0])
    assert loss.item() == pytest.approx(0.1 * (math.sqrt(2) - 1) / 2, rel=1e-6)
    # dL/dd = coef / N_seg * phi'(x) * dx/dgbar * dgbar/dd = 0.05 * (1/sqrt2) * (-1) * 0.5
    g0 = -0.05 * (1 / math.sqrt(2)) * 0.5
    torch.testing.assert_close(grad, torch.tensor([[g0, g0, 0.0, 0.0]]))
    assert metrics["triage/repair_active_segment_frac"] == pytest.approx(0.5)
    assert metrics["triage/repair_loss"] == pytest.approx(loss.item())


@pytest.mark.parametrize("adv", [0.0, -1.0])
def test_zero_for_non_positive_advantage(adv):
    loss, grad, metrics = run([[-5.0, -5.0, -5.0, -5.0]], [adv])
    assert loss.item() == 0.0
    assert torch.all(grad == 0.0)
    assert metrics["triage/repair_active_segment_frac"] == 0.0


def test_zero_at_and_above_boundary():
    # gbar = -0.5 (x = 0 exactly) and gbar = -0.25, +3: all inactive
    loss, grad, _ = run([[-0.5, -0.5, -0.25, -0.25, 3.0, 3.0]], [1.0])
    assert loss.item() == 0.0
    assert torch.all(grad == 0.0)


def test_quadratic_just_below_linear_far_below():
    c = 1.0
    for x in (1e-3, 1e-2):
        # phi(x) = x^2/2 - x^4/8 + ...
        assert pseudo_huber(torch.tensor(x), c).item() == pytest.approx(x * x / 2, rel=1e-3)
    for x in (1e3, 1e4):
        # phi(x) = c|x| - c^2 + O(1/x)
        assert pseudo_huber(torch.tensor(x), c).item() == pytest.approx(c * x - c * c, rel=1e-3)
    # through repair_loss: gbar = b - x with one segment of 2 tokens, N_seg = 1
    for x in (1e-2, 5e-2):
        loss, _, _ = run([[-0.5 - x, -0.5 - x]], [1.0])
        assert loss.item() == pytest.approx(0.1 * x * x / 2, rel=1e-2)
    loss, _, _ = run([[-1000.5, -1000.5]], [1.0])
    assert loss.item() == pytest.approx(0.1 * (1000.0 - 1.0), rel=1e-4)


@pytest.mark.parametrize("x", [0.3, 3.0, 300.0, 1e6])
def test_derivative_bounded_by_c(x):
    for c in (0.5, 1.0, 2.0):
        cfg = TriageConfig(repair_segment_len=2, repair_huber_delta=c, repair_coef=1.0)
        _, grad, _ = run([[-0.5 - x, -0.5 - x]], [1.0], cfg)
        # |dL/dgbar| = |sum over the segment's tokens of dL/dd| = phi'(x) < c (up to fp32 rounding)
        total = grad.sum().abs().item()
        assert 0.0 < total <= c * (1 + 1e-6)
        assert total == pytest.approx(x / math.sqrt(1 + (x / c) ** 2), rel=1e-4)


def test_segments_counted_over_positive_responses_only():
    # response 0 (A > 0): segments [-1.5, -1.5] (x = 1) and [0, 0]; response 1 (A < 0) ignored; N_seg = 2
    loss, grad, metrics = run([[-1.5, -1.5, 0.0, 0.0], [-9.0, -9.0, -9.0, -9.0]], [1.0, -1.0])
    assert loss.item() == pytest.approx(0.1 * (math.sqrt(2) - 1) / 2, rel=1e-6)
    assert torch.all(grad[1] == 0)
    assert metrics["triage/repair_active_segment_frac"] == pytest.approx(0.5)


def test_partial_segment_empty_rows_and_all_masked():
    # T = 3, L = 2: segment 1 holds one token; row 1 has no valid token (not a segment)
    m = torch.tensor([[True, True, True], [False, False, False]])
    loss, _, _ = run([[0.0, 0.0, -1.5], [-9.0, -9.0, -9.0]], [1.0, 1.0], mask=m)
    # segment 1: gbar = -1.5, x = 1, phi = sqrt2 - 1; N_seg = 2 (row 1 contributes none)
    assert loss.item() == pytest.approx(0.1 * (math.sqrt(2) - 1) / 2, rel=1e-6)
    loss, grad, metrics = run([[-9.0, -9.0]], [1.0], mask=torch.zeros(1, 2, dtype=torch.bool))
    assert loss.item() == 0.0 and torch.all(grad == 0)
    assert metrics["triage/repair_active_segment_frac"] == 0.0


def test_switch_off_and_nonfinite():
    loss, grad, _ = run([[-5.0, -5.0]], [1.0], TriageConfig(repair_segment_len=2, repair=False))
    assert loss.item() == 0.0 and torch.all(grad == 0)
    # a NaN log-prob is dropped: segment = the remaining token, gbar = -1.5
    loss, grad, metrics = run([[float("nan"), -1.5]], [1.0])
    assert loss.item() == pytest.approx(0.1 * (math.sqrt(2) - 1), rel=1e-6)
    assert torch.isfinite(grad).all() and grad[0, 0] == 0
    assert metrics["triage/nonfinite_tokens"] == 1.0


def test_bf16_inputs_compute_in_fp32():
    logp = torch.tensor([[-1.0, -2.0, 0.0, 0.0]], dtype=torch.bfloat16, requires_grad=True)
    loss, _ = repair_loss(
        logp, torch.zeros_like(logp), torch.tensor([1.0]), torch.ones(1, 4, dtype=torch.bool), C2
    )
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(0.1 * (math.sqrt(2) - 1) / 2, rel=1e-6)

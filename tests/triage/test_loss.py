from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triage import TriageConfig, triage_policy_loss
from triage.config import CLIP_RATIO_C, CLIP_RATIO_HIGH, CLIP_RATIO_LOW

C4 = TriageConfig(gate_segment_len=4, repair_segment_len=4)


def test_hand_computed_gate_and_normalisation():
    # row 0: A = -1, delta = [-2, -2, -2, 0] -> mu = -1.5 -> g = [0.3, 0.3, 0.3, 1]
    #        logp = old -> ratio 1, l_ppo = -A = 1; w_tis = [e^-2 x3, 1]
    #        row loss = (3 * 0.3 * e^-2 + 1) / (3 * 0.3 + 1) = (0.9 * 0.135335 + 1) / 1.9 = 0.590420
    # row 1: A = +2, delta = 0 -> g = 1, w = 1, l = -2 per token -> row loss = -2; repair: gbar = 0 -> 0
    # L = (0.590420 - 2) / 2 = -0.704790
    old = torch.full((2, 4), -1.0)
    logp = old.clone().requires_grad_()
    sampler = old - torch.tensor([[-2.0, -2.0, -2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    loss, metrics = triage_policy_loss(
        logp, old, sampler, torch.tensor([-1.0, 2.0]), torch.ones(2, 4, dtype=torch.bool), C4
    )
    e2 = math.exp(-2)
    row0 = (0.9 * e2 + 1) / 1.9
    assert loss.item() == pytest.approx((row0 - 2) / 2, rel=1e-6)
    loss.backward()
    # dL/dlogp = g * w * (-A) * ratio / (sum g * rows): row 0 -> [0.3 e^-2, x3, 1] / 3.8; row 1 -> -2 / 8
    expected = torch.tensor([[0.3 * e2 / 3.8] * 3 + [1 / 3.8], [-0.25] * 4])
    torch.testing.assert_close(logp.grad, expected)
    assert metrics["triage/gated_token_frac"] == pytest.approx(3 / 8)
    assert metrics["triage/repair_loss"] == 0.0
    assert metrics["triage/pg_loss"] == pytest.approx(loss.item(), rel=1e-6)


def test_hand_computed_clipping_and_dual_clip():
    # default clip range [0.8, 1.28], dual clip 3
    # row 0: A = +1, ratio = 1.5 > 1.28 -> l = max(-1.5, -1.28) = -1.28 (clipped, no gradient)
    # row 1: A = -1, ratio = 4 -> c1 = max(4, 1.28) = 4, dual clip min(3, 4) = 3 (no gradient)
    old = torch.zeros(2, 1)
    logp = torch.log(torch.tensor([[1.5], [4.0]])).requires_grad_()
    cfg = TriageConfig(gate=False, repair=False)
    loss, metrics = triage_policy_loss(logp, old, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), cfg)
    assert loss.item() == pytest.approx((-1.28 + 3.0) / 2, rel=1e-6)
    loss.backward()
    assert torch.all(logp.grad == 0)
    # verl's pg_clipfrac counts l2 > l1: row 0 (-1.28 > -1.5) yes, row 1 (1.28 > 4) no -> 0.5
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    # pg_clipfrac_lower counts A < 0 and c1 > -A * clip_ratio_c: row 1 (4 > 3) -> 1 of 2 tokens
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.5)


def test_repair_adds_to_loss():
    # one response, A = +1, old = logp = sampler - 1.5 -> d = -1.5 in one 4-token segment: x = 1
    old = torch.full((1, 4), -2.0)
    logp = old.clone().requires_grad_()
    sampler = old + 1.5
    full, m = triage_policy_loss(logp, old, sampler, torch.tensor([1.0]), torch.ones(1, 4), C4)
    off, _ = triage_policy_loss(
        logp,
        old,
        sampler,
        torch.tensor([1.0]),
        torch.ones(1, 4),
        TriageConfig(gate_segment_len=4, repair_segment_len=4, repair=False),
    )
    assert (full - off).item() == pytest.approx(0.1 * (math.sqrt(2) - 1), rel=1e-5)
    assert m["triage/repair_loss"] == pytest.approx(0.1 * (math.sqrt(2) - 1), rel=1e-5)
    assert m["triage/repair_active_segment_frac"] == 1.0


def test_rows_without_tokens_and_all_masked_batch():
    old = torch.full((3, 4), -1.0)
    logp = old.clone().requires_grad_()
    m = torch.tensor([[True] * 4, [False] * 4, [True, True, False, False]])
    loss, _ = triage_policy_loss(logp, old, old, torch.tensor([1.0, 5.0, 1.0]), m, C4)
    # empty row 1 is excluded from the mean: rows 0 and 2 both give -1 -> L = -1
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert torch.all(logp.grad[1] == 0) and torch.all(logp.grad[2, 2:] == 0)
    logp2 = old.clone().requires_grad_()
    loss2, metrics = triage_policy_loss(logp2, old, old, torch.ones(3), torch.zeros(3, 4), C4)
    loss2.backward()
    assert loss2.item() == 0.0 and torch.all(logp2.grad == 0)
    assert all(math.isfinite(v) for v in metrics.values())


def test_nonfinite_logprobs_are_masked_and_counted():
    old = torch.full((1, 4), -1.0)
    logp = old.clone()
    logp[0, 1] = float("nan")
    sampler = old.clone()
    sampler[0, 2] = float("-inf")
    logp.requires_grad_()
    loss, metrics = triage_policy_loss(logp, old, sampler, torch.tensor([1.0]), torch.ones(1, 4), C4)
    assert metrics["triage/nonfinite_tokens"] == 2.0
    # the two finite tokens: l = -1 each -> L = -1
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0


def test_bad_shapes_and_dtypes():
    x = torch.zeros(2, 5)
    m = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"old_logp has shape \(2, 4\) but logp has shape \(2, 5\)"):
        triage_policy_loss(x, torch.zeros(2, 4), x, torch.zeros(2), m)
    with pytest.raises(ValueError, match=r"mask has shape \(5, 2\) but logp has shape \(2, 5\)"):
        triage_policy_loss(x, x, x, torch.zeros(2), m.T)
    with pytest.raises(ValueError, match=r"advantages has shape \(2, 4\) but logp has shape \(2, 5\)"):
        triage_policy_loss(x, x, x, torch.zeros(2, 4), m)
    with pytest.raises(TypeError, match="sampler_logp must be a floating-point tensor"):
        triage_policy_loss(x, x, torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2), m)
    with pytest.raises(ValueError, match=r"must be \[B, T\]"):
        triage_policy_loss(torch.zeros(5), torch.zeros(5), torch.zeros(5), torch.zeros(1), torch.ones(5))


def test_bf16_inputs_give_fp32_loss_close_to_fp32():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 70, generator=g) * 3
    sampler = old - torch.randn(3, 70, generator=g)
    adv = torch.randn(3, generator=g)
    m = torch.ones(3, 70, dtype=torch.bool)
    lb, _ = triage_policy_loss(
        old.bfloat16().requires_grad_(), old.bfloat16(), sampler.bfloat16(), adv.bfloat16(), m
    )
    lf, _ = triage_policy_loss(
        old.bfloat16().float(), old.bfloat16().float(), sampler.bfloat16().float(), adv.bfloat16().float(), m
    )
    assert lb.dtype == torch.float32
    torch.testing.assert_close(lb, lf)


def _vanilla_tis(logp, old, sampler, adv, mask):
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(  # the clip ratios of TriageConfig's defaults (verl's own default 0.2 above)
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="seq-mean-token-mean",
        clip_ratio_low=CLIP_RATIO_LOW, clip_ratio_high=CLIP_RATIO_HIGH, clip_ratio_c=CLIP_RATIO_C,
    )
    w, _ = compute_rollout_correction_weights(
        old - sampler, mask, rollout_is="token", rollout_is_threshold=2.0
    )
    loss, _ = compute_policy_loss_vanilla(
        old, logp, adv.unsqueeze(-1) * mask, mask, "seq-mean-token-mean", cfg, w
    )
    return loss


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_verl_vanilla_times_token_tis_when_gate_and_repair_off(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 157
    old = -torch.rand(b, t, generator=g) * 4
    logp0 = old + 0.3 * torch.randn(b, t, generator=g)
    sampler = old - 1.5 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    mask = torch.rand(b, t, generator=g) > 0.2
    mask[2] = False
    mask[4, 100:] = False
    lv = logp0.clone().requires_grad_()
    ref = _vanilla_tis(lv, old, sampler, adv, mask)
    ref.backward()
    lt = logp0.clone().requires_grad_()
    ours, metrics = triage_policy_loss(lt, old, sampler, adv, mask, TriageConfig(gate=False, repair=False))
    ours.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lt.grad, lv.grad, rtol=1e-5, atol=1e-8)
    assert metrics["triage/mean_gate_weight"] == 1.0


def _random_inputs(seed, b, t, scale):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * scale
    logp = old + torch.randn(b, t, generator=g) * scale * 0.1
    sampler = old - torch.randn(b, t, generator=g) * scale
    adv = torch.randn(b, generator=g) * scale
    mask = torch.rand(b, t, generator=g) > 0.25
    return logp, old, sampler, adv, mask


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 300), st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_property_finite_loss_and_grad_for_finite_inputs(b, t, scale, seed):
    logp, old, sampler, adv, mask = _random_inputs(seed, b, t, scale)
    logp.requires_grad_()
    loss, metrics = triage_policy_loss(logp, old, sampler, adv, mask)
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 200), st.integers(1, 200), st.integers(0, 2**31 - 1))
def test_property_right_padding_invariance(b, t, pad, seed):
    logp, old, sampler, adv, mask = _random_inputs(seed, b, t, 3.0)
    gp = torch.Generator().manual_seed(seed + 1)

    def padded(x, fill):
        return torch.cat([x, fill(gp)], dim=1)

    junk = lambda g: torch.randn(b, pad, generator=g) * 50  # finite garbage under the mask
    lp = logp.clone().requires_grad_()
    lq = padded(logp, junk).requires_grad_()
    l1, m1 = triage_policy_loss(lp, old, sampler, adv, mask)
    l2, m2 = triage_policy_loss(
        lq,
        padded(old, junk),
        padded(sampler, junk),
        adv,
        torch.cat([mask, torch.zeros(b, pad, dtype=torch.bool)], 1),
    )
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l2, l1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lq.grad[:, :t], lp.grad, rtol=1e-5, atol=1e-7)
    assert torch.all(lq.grad[:, t:] == 0)
    assert m1.keys() == m2.keys()
    for k in m1:  # metrics are fp32 sums over all positions: padding may move them by ~1e-7 per pad token
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-5), k


def test_bench_baseline_matches_verl_vanilla_times_tis():
    from triage.baselines import vanilla_tis_loss

    logp0, old, sampler, adv, mask = _random_inputs(7, 5, 90, 2.0)
    mask[1] = False
    lv = logp0.clone().requires_grad_()
    ref = _vanilla_tis(lv, old, sampler, adv, mask)
    ref.backward()
    lb = logp0.clone().requires_grad_()
    ours, _ = vanilla_tis_loss(lb, old, sampler, adv.unsqueeze(-1) * mask, mask)
    ours.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(lb.grad, lv.grad)


@pytest.mark.parametrize("value", [0.5, 2.0, -1.0, float("nan")])
def test_a_mask_that_is_not_zero_or_one_is_refused(value):
    lp = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 0.0, value, 1.0]])
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        triage_policy_loss(lp, lp, lp, torch.ones(1), mask)
    loss, _ = triage_policy_loss(lp, lp, lp, torch.ones(1), torch.tensor([[1, 0, 1, 1]]))  # 0/1 ints are fine
    assert torch.isfinite(loss)


def test_on_a_gpu_the_mask_check_waits_for_the_single_read_back(monkeypatch):
    """Where TRIAGE avoids mid-pass host reads (every device but the CPU), a bad mask is counted on the device
    and reported at the loss's one read-back; simulated here by telling the input checks to avoid syncs."""
    import triage.inputs as inputs
    from triage import mismatch_metrics

    monkeypatch.setattr(inputs, "avoid_host_sync", lambda device: True)
    lp = torch.zeros(1, 4)
    bad = torch.tensor([[1.0, 0.5, 2.0, 1.0]])
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1 \(or be bool\); 2 position\(s\)"):
        triage_policy_loss(lp, lp, lp, torch.ones(1), bad)
    with pytest.raises(ValueError, match="2 position"):
        mismatch_metrics(lp, torch.ones(1), bad)
    _, metrics = triage_policy_loss(lp, lp, lp, torch.ones(1), torch.tensor([[1.0, 0.0, 1.0, 1.0]]))
    assert inputs.MASK_VIOLATIONS not in metrics

"""The estimators: GRPO advantages as verl computes them, every corrected arm equal to the on-policy estimate
when there is no mismatch, TRIAGE really gating under bursts, and the bias statistics on known cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainers.controlled.config import MismatchConfig
from trainers.controlled.gradient import (
    ARM_CONFIGS,
    gradient_stats,
    group_advantages,
    per_seed_gradients,
    rollout,
)
from trainers.controlled.mismatch import ON_POLICY, Mismatch, draw
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.task import ChainTask

TASK = ChainTask(8, 128)
X = TASK.features()


def test_group_advantages_equal_verls():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    r = torch.rand(12, generator=torch.Generator().manual_seed(0))
    r[4:8] = 0.5  # a group of equal rewards: advantage 0
    mask = torch.ones(12, 3)
    scores = torch.zeros(12, 3)
    scores[:, -1] = r
    ref, _ = compute_grpo_outcome_advantage(scores, mask, np.repeat(np.arange(3), 4))
    torch.testing.assert_close(group_advantages(r, 4), ref[:, 0])
    torch.testing.assert_close(group_advantages(r.view(2, 6), 3).flatten(),
                               torch.cat([group_advantages(r[:6], 3), group_advantages(r[6:], 3)]))


def _policy(seeds=4):
    pol = EnsembleMLP.init([0], 8, 32, base_seed=0)
    with torch.no_grad():
        pol.params["w3"].mul_(4.0)
    return pol.replicate(0, seeds)


def _grads(pol, mismatch, arms, seeds=range(4)):
    d = draw(TASK, list(seeds), 2, 4, mismatch, 0, "test", 0)
    batch = rollout(TASK, pol, X, mismatch, d, 4)
    return {a: per_seed_gradients(TASK, pol, X, batch, a) for a in arms}


def test_without_mismatch_every_arm_is_the_on_policy_estimate():
    pol = _policy()
    on = _grads(pol, ON_POLICY, ["on_policy"])["on_policy"][0]
    got = _grads(pol, ON_POLICY, ["none", "tis", "triage", "gate_only", "repair_only"])
    for arm, (g, metrics) in got.items():
        assert torch.equal(g, on), arm
    assert all(m["triage/gated_token_frac"] == 0 and m["triage/repair_loss"] == 0 for m in got["triage"][1])
    assert on.abs().sum() > 0


def test_under_bursts_triage_gates_and_differs_from_tis():
    pol = _policy()
    got = _grads(pol, Mismatch.of("burst", MismatchConfig(burst_prob=0.3)),
                 ["none", "tis", "triage", "gate_only", "repair_only"])
    assert not torch.equal(got["tis"][0], got["none"][0])
    assert not torch.equal(got["triage"][0], got["tis"][0])
    # each ablation is TIS plus one part: both differ from TIS, and from TRIAGE
    for part in ("gate_only", "repair_only"):
        assert not torch.equal(got[part][0], got["tis"][0]) and not torch.equal(got[part][0], got["triage"][0])
    assert np.mean([m["triage/gated_token_frac"] for m in got["triage"][1]]) > 0.01
    assert ARM_CONFIGS["triage"].gate and ARM_CONFIGS["triage"].repair and ARM_CONFIGS["triage"].tis
    assert not (ARM_CONFIGS["tis"].gate or ARM_CONFIGS["tis"].repair) and ARM_CONFIGS["tis"].tis
    assert not (ARM_CONFIGS["none"].gate or ARM_CONFIGS["none"].repair or ARM_CONFIGS["none"].tis)


def test_gradient_stats_worked_example():
    ref = torch.tensor([1.0, 0.0])
    g = ref + torch.tensor([[0.0, 1.0], [0.0, -1.0], [1.0, 0.0]])
    s = gradient_stats(g, ref, 0.0, 0.95)
    assert s["bias_raw"] == pytest.approx(1 / 3)
    assert s["bias2"]["value"] == pytest.approx(-1 / 3)
    assert s["bias"]["value"] == 0.0
    assert s["sq_err"] == pytest.approx([1.0, 1.0, 1.0])
    assert s["cosine"] == pytest.approx([2 ** -0.5, 2 ** -0.5, 1.0])


@pytest.mark.parametrize("true_bias", [0.0, 0.5])
def test_the_bias_is_found_without_the_noise_floor(true_bias):
    """400 noisy estimates (noise 3x |g*| per seed, 200 dimensions): the raw bias sits near the noise floor, the
    U-statistic recovers the true bias and its CI covers it."""
    gen = torch.Generator().manual_seed(1)
    d = 200
    ref = torch.zeros(d, dtype=torch.float64)
    ref[0] = 1.0
    offset = torch.zeros(d, dtype=torch.float64)
    offset[1] = true_bias
    g = ref + offset + torch.randn(400, d, generator=gen, dtype=torch.float64) * 3 / d ** 0.5
    s = gradient_stats(g, ref, 0.0, 0.95)
    assert s["noise_floor"] == pytest.approx(3 / 20, rel=0.1)
    lo, hi = s["bias"]["ci"]
    assert lo <= true_bias <= hi
    assert s["bias"]["value"] == pytest.approx(true_bias, abs=0.1)
    if true_bias:
        assert lo > 0.3

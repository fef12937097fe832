"""The estimators, the on-policy reference gradient, and how far an estimate is from it.

A batch is P prompts x G samples (GRPO groups) of T tokens. With ``A`` verl's GRPO advantage
(``(r - mean_group) / (std_group + 1e-6)``, sample std; :func:`group_advantages`), every arm's loss is the
project's own ``triage.triage_policy_loss`` on that batch (one call per seed), with ``old_logp = logp`` (one update
per batch, so the PPO ratio is 1):

    on_policy   tokens from the learner itself;            TriageConfig(gate=False, repair=False, tis=False)
    none        tokens from the mismatched sampler;        the same loss (vanilla GRPO, seq-mean-token-mean)
    tis         the sampler's tokens;                      TriageConfig(gate=False, repair=False)  (TIS, C = 2)
    triage      the sampler's tokens;                      TriageConfig()  (TIS + gate + repair, docs/TRIAGE.md)
    gate_only   the sampler's tokens;                      TriageConfig(repair=False)   (ablation: TIS + gate)
    repair_only the sampler's tokens;                      TriageConfig(gate=False)     (ablation: TIS + repair)

The estimate of seed s is ``g_s = d L_s / d theta`` (one batch). The reference is the expectation of the
on-policy estimate at the same parameters, ``g* = mean of R independent on-policy batches`` (its own noise,
``tr(Cov g_on) / R``, is taken out of ``|g*|^2``). For the seeds ``s = 1..n`` of one arm, ``e_s = g_s - g*``:

    cosine_s   = <g_s, g*> / (|g_s| |g*|)
    bias_raw   = |mean_s e_s| / |g*|                        (the relative norm of the mean error, as measured)
    bias^2     = [ sum_{s != t} <e_s, e_t> / (n (n - 1)) - tr(Cov g_on) / R ] / |g*|^2
    bias       = sqrt(max(bias^2, 0))
    rel_mse    = mean_s |e_s|^2 / |g*|^2
    mean_cosine, mean_norm_ratio = the direction and length of mean_s g_s against g* (is a bias a rescaling?)

``bias_raw`` of an unbiased estimator is not 0 with finite n: it is about its noise floor
``sqrt(tr(Cov g) / n) / |g*|``. ``bias^2`` is the U-statistic over pairs of seeds, unbiased for
``|E g - g*|^2 / |g*|^2``, so an unbiased estimator gives 0 up to its jackknife CI. Worked example: g* = (1, 0),
errors e = (0, 1), (0, -1), (1, 0): bias_raw = |(1/3, 0)| = 0.333; pairs <e1,e2> = -1, <e1,e3> = 0, <e2,e3> = 0
-> bias^2 = 2 * (-1) / 6 = -0.333 (no evidence of bias); rel_mse = (1 + 1 + 1) / 3 = 1.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainers import stats
from trainers.controlled.mismatch import Draws, Mismatch, sample, sampler_table
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.task import ChainTask
from triage import TriageConfig, triage_policy_loss

_VANILLA = TriageConfig(gate=False, repair=False, tis=False, diagnostics=False, cuda_graphs=False)
ARM_CONFIGS = {
    "on_policy": _VANILLA,
    "none": _VANILLA,
    "tis": TriageConfig(gate=False, repair=False, diagnostics=False, cuda_graphs=False),
    "triage": TriageConfig(cuda_graphs=False),
    "gate_only": TriageConfig(repair=False, cuda_graphs=False),
    "repair_only": TriageConfig(gate=False, cuda_graphs=False),
}
#: what the study keeps of the TRIAGE arm's metrics (TRIAGE.md §6), per seed
DIAGNOSTICS = ("mismatch/abs_gap_mean", "mismatch/gap_mean", "mismatch/gap_q05", "mismatch/k3_kl",
               "triage/gated_token_frac", "triage/gated_segment_frac", "triage/gate_grad_shift",
               "triage/repair_active_segment_frac", "triage/repair_loss", "tis/clip_frac", "tis/weight_mean")
GRPO_EPS = 1e-6


def group_advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """verl's GRPO outcome advantage, vectorised: ``rewards [..., P * G]`` (groups contiguous) -> same shape."""
    r = rewards.unflatten(-1, (-1, group))
    if group == 1:
        return rewards.clone()
    adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + GRPO_EPS)
    return adv.flatten(-2)


@dataclass
class Batch:
    """One batch per seed: everything ``[S, B]`` or ``[S, B, T]``."""

    states: torch.Tensor
    tokens: torch.Tensor
    sampler_logp: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor


def rollout(task: ChainTask, policy: EnsembleMLP, x: torch.Tensor, mismatch: Mismatch, draws: Draws,
            group: int) -> Batch:
    """Sample a batch from the policy's sampler under ``mismatch`` (no grad)."""
    with torch.no_grad():
        table = sampler_table(policy, x, mismatch)
        tokens, logq = sample(task, table, draws, mismatch)
        rewards = task.reward(tokens, draws.start, draws.stride)
        return Batch(task.state_index(tokens, draws.start, draws.stride), tokens, logq, rewards,
                     group_advantages(rewards, group))


def learner_logp(task: ChainTask, policy: EnsembleMLP, x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[S, B, T]`` learner log-probs of the batch's tokens (with grad), gathered from the policy's table."""
    table = policy.logp_table(x)  # [S, states, V]
    s, b, t = batch.tokens.shape
    idx = (batch.states * task.vocab + batch.tokens).view(s, -1)
    return table.reshape(s, -1).gather(1, idx).view(s, b, t)


def arm_loss(logp: torch.Tensor, batch: Batch, arm: str) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """The sum over seeds of each seed's ``triage_policy_loss`` under ``arm``, and each seed's metrics."""
    cfg = ARM_CONFIGS[arm]
    old = logp.detach()
    mask = torch.ones(logp.shape[1:], dtype=torch.bool)
    total = logp.new_zeros(())
    metrics = []
    for i in range(logp.shape[0]):
        loss, m = triage_policy_loss(logp[i], old[i], batch.sampler_logp[i], batch.advantages[i], mask, cfg)
        total = total + loss
        metrics.append(m)
    return total, metrics


def per_seed_gradients(task: ChainTask, policy: EnsembleMLP, x: torch.Tensor, batch: Batch, arm: str,
                       ) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """``[S, num_params]``: seed s's loss gradient with respect to member s (members are independent)."""
    for p in policy.parameters():
        p.grad = None
    loss, metrics = arm_loss(learner_logp(task, policy, x, batch), batch, arm)
    loss.backward()
    grads = policy.flat_grads()
    for p in policy.parameters():
        p.grad = None
    return grads, metrics


def gradient_stats(grads: torch.Tensor, ref: torch.Tensor, ref_var: float, level: float) -> dict:
    """Per-seed cosines, relative squared errors and norm ratios; the raw bias, its noise floor, and the squared
    bias by the U-statistic with jackknife CI (module docstring). ``ref_var`` = tr(Cov g_on_policy) / R."""
    g, r = grads.double(), ref.double()
    ref_sq = max(float(r @ r) - ref_var, 1e-300)  # |g*|^2: the reference's own noise taken out
    err = g - r
    mean_err = err.mean(0)
    n = g.shape[0]
    sq = stats.sq_bias((err @ err.T).numpy() / ref_sq, ref_var / ref_sq)
    se, lo, hi = stats.jackknife_ci(sq["value"], sq["jackknife"], level)
    return {"cosine": ((g @ r) / (g.norm(dim=1) * r.norm()).clamp(min=1e-300)).tolist(),
            "sq_err": ((err * err).sum(1) / ref_sq).tolist(), "norm_ratio": (g.norm(dim=1) / ref_sq ** 0.5).tolist(),
            "bias_raw": (float(mean_err @ mean_err) / ref_sq) ** 0.5,
            "mean_cosine": float(g.mean(0) @ r) / max(float(g.mean(0).norm() * r.norm()), 1e-300),
            "mean_norm_ratio": float(g.mean(0).norm()) / ref_sq ** 0.5,
            "noise_floor": (float(g.var(0).sum()) / n / ref_sq) ** 0.5,
            "bias2": {"value": sq["value"], "se": se, "ci": [lo, hi]},
            "bias": {"value": max(sq["value"], 0.0) ** 0.5, "ci": [max(lo, 0.0) ** 0.5, max(hi, 0.0) ** 0.5]},
            "jackknife": sq["jackknife"]}


def mean_metrics(metrics: Sequence[dict[str, float]], keys: Sequence[str] = DIAGNOSTICS) -> dict[str, list[float]]:
    """Per-seed values of the kept diagnostics."""
    return {k: [m[k] for m in metrics] for k in keys if metrics and k in metrics[0]}

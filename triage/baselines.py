"""Pure-torch baseline: verl's ``vanilla`` PPO loss x token TIS, ``seq-mean-token-mean`` (TRIAGE.md §5).

The same operations, in the same order, as ``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla``
followed by ``agg_loss(..., "seq-mean-token-mean")`` with ``rollout_is_weights = min(exp(delta), C)``, so
that benchmarks can time the baseline where verl is not installed (the GPU machine). A test checks it
against verl's own function on CPU.

    r = exp(clamp(logp - old, -20, 20));  l = max(-A r, -A clip(r, 1-lo, 1+hi));  A < 0: min(l, -A c)
    L = mean_i [ sum_t m w l / (sum_t m + 1e-8) ]  over rows with sum_t m > 0
"""

from __future__ import annotations

import torch

from triage.config import CLIP_RATIO_C, CLIP_RATIO_HIGH, CLIP_RATIO_LOW


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (torch.where(mask.bool(), x, 0.0) * mask).sum()


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _masked_sum(x, mask) / (mask.sum() + 1e-8)


def vanilla_tis_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = CLIP_RATIO_LOW,
    clip_ratio_high: float = CLIP_RATIO_HIGH,
    clip_ratio_c: float = CLIP_RATIO_C,
    tis_cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``advantages`` ``[B, T]`` (as verl passes them), ``mask`` bool ``[B, T]``."""
    with torch.no_grad():
        w = torch.exp((old_logp - sampler_logp).clamp(-20.0, 20.0)).clamp(max=tis_cap) * mask
    negative_approx_kl = torch.clamp(logp - old_logp, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = _masked_mean(-negative_approx_kl, mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = _masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1) * w
    seq_tokens = mask.sum(-1)
    seq_losses = (pg_losses * mask).sum(-1) / (seq_tokens + 1e-8)
    seq_mask = (seq_tokens > 0).float()
    loss = _masked_sum(seq_losses, seq_mask) / seq_mask.sum()
    metrics = {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
    return loss, metrics

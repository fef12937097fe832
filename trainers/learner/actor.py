"""The learner's algorithm pieces, all taken from verl and called the way verl calls them.

* GRPO advantages: ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` on outcome rewards placed
  on the last response token, ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``.
* Rollout correction (TIS, report §3.1 [10]): ``verl.trainer.ppo.rollout_corr_helper.
  compute_rollout_correction_weights(old - sampler, mask, rollout_is, threshold)``. A loss mode that corrects
  for the gap itself (``trainers.losses``: ``loss_mode=triage``) takes the sampler's log-probs themselves
  (``sampler_log_prob``: the gap without verl's exp/log route) and applies its own TIS cap; the §6 diagnostics
  are computed once per step on the whole batch (``triage.mismatch_metrics``, by the engine), so the loss skips
  them in every micro-batch.
* Policy loss: ``get_policy_loss_fn(loss_mode)(old_log_prob=..., log_prob=..., advantages=...,
  response_mask=..., loss_agg_mode=..., config=ActorConfig, rollout_is_weights=...)`` with
  ``config.global_batch_info`` holding the *mini-batch* token / sequence counts, exactly as
  ``verl.workers.utils.losses.ppo_loss`` fills it, so the summed micro-batch gradients equal the mini-batch
  gradient (micro-batching is invariant). The entropy bonus is added with ``agg_loss`` as ``ppo_loss`` does.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from trainers.config import AlgorithmConfig
from trainers.losses import loss_mode as get_loss_mode


def build_actor_config(alg: AlgorithmConfig, *, micro_batch_size: int, mini_batch_size: int, n: int):
    """A real verl ``ActorConfig`` carrying the policy-loss settings (the loss mode's: ``trainers.losses``)."""
    from verl.workers.config import ActorConfig

    policy_loss = get_loss_mode(alg.loss_mode).policy_loss_config(alg)
    return ActorConfig(strategy="fsdp", ppo_mini_batch_size=mini_batch_size,
                       ppo_micro_batch_size_per_gpu=micro_batch_size, rollout_n=n, clip_ratio=alg.clip_ratio,
                       clip_ratio_low=alg.clip_ratio_low, clip_ratio_high=alg.clip_ratio_high,
                       clip_ratio_c=alg.clip_ratio_c, loss_agg_mode=alg.loss_agg_mode,
                       entropy_coeff=alg.entropy_coeff, ppo_epochs=alg.ppo_epochs, policy_loss=policy_loss)


def policy_loss_fn(loss_mode: str):
    """verl's policy-loss function of ``loss_mode``; an unknown name is an error naming the valid choices."""
    return get_loss_mode(loss_mode).loss_fn()


def grpo_advantages(scores: torch.Tensor, response_mask: torch.Tensor, group_ids: list[int],
                    norm_by_std: bool = True) -> torch.Tensor:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    lengths = response_mask.sum(-1).long()
    rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    rows = torch.arange(len(scores))
    rewards[rows, (lengths - 1).clamp(min=0)] = scores.float() * (lengths > 0).float()
    adv, _ = compute_grpo_outcome_advantage(token_level_rewards=rewards, response_mask=response_mask,
                                            index=np.array(group_ids), norm_adv_by_std_in_grpo=norm_by_std)
    return adv


def rollout_is_weights(alg: AlgorithmConfig, old_logp: torch.Tensor, sampler_logp: torch.Tensor,
                       mask: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
    if get_loss_mode(alg.loss_mode).sampler_logp:  # the loss takes the sampler log-probs (micro_batch_loss)
        return None, {}
    rc = alg.rollout_correction
    if rc.rollout_is is None:
        return None, {}
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    w, m = compute_rollout_correction_weights(log_ratio=old_logp - sampler_logp, response_mask=mask,
                                              rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold)
    return w.detach(), {f"rollout_corr/{k}": float(v) for k, v in m.items() if _is_number(v)}


def _is_number(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.numel() == 1
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def set_global_batch_info(actor_cfg, *, num_tokens: int, num_seqs: int) -> None:
    actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=num_tokens, global_batch_size=num_seqs,
                                       loss_scale_factor=actor_cfg.loss_scale_factor)


def micro_batch_loss(actor_cfg, loss_fn, *, logp: torch.Tensor, entropy: torch.Tensor | None,
                     old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     weights: torch.Tensor | None, sampler_logp: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's ``ppo_loss`` body for one micro-batch (policy loss + entropy bonus). A loss that corrects for the
    gap itself (TRIAGE) gets ``sampler_logp``; the others get the rollout-correction ``weights``."""
    from verl.trainer.ppo.core_algos import agg_loss

    bmask = mask.bool()
    route = get_loss_mode(actor_cfg.policy_loss.loss_mode).loss_inputs(weights=weights, sampler_logp=sampler_logp)
    loss, metrics = loss_fn(old_log_prob=old_logp, log_prob=logp, advantages=advantages, response_mask=bmask,
                            loss_agg_mode=actor_cfg.loss_agg_mode, config=actor_cfg, **route)
    out = {k: float(v) for k, v in metrics.items() if _is_number(v)}
    out["actor/pg_loss"] = float(loss.detach())
    if entropy is not None and actor_cfg.entropy_coeff:
        ent = agg_loss(loss_mat=entropy, loss_mask=bmask, loss_agg_mode=actor_cfg.loss_agg_mode,
                       **actor_cfg.global_batch_info)
        loss = loss - actor_cfg.entropy_coeff * ent
        out["actor/entropy_loss"] = float(ent.detach())
    return loss, out


def is_finite(x: float | torch.Tensor) -> bool:
    return math.isfinite(float(x))

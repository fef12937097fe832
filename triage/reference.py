"""Reference TRIAGE policy loss: plain autograd, term by term (report §3.1, Appendix B; TRIAGE.md §1-§5).

This is the readable definition that the fused implementation (``triage.loss``) is tested against; it
computes the same loss, gradient and metrics with more memory traffic.

Per token (detached weights; ``delta = old_logp - sampler_logp``):

    r      = exp(clamp(logp - old_logp, -20, 20))
    l_ppo  = verl "vanilla": max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi)), and for A < 0 also
             min(that, -A * clip_ratio_c) (dual clip)
    l      = w_tis * l_ppo,            w_tis = min(exp(clamp(delta, -20, 20)), C)          (§1)
    g      = gate weight (§2, ``triage.gate``)

    L_pg     = mean over responses i with sum_t m > 0 of  sum_t m g l / sum_t m g           (§3)
    L        = L_pg + L_repair                                                              (§4, §5)

The response-level normalisation hands the share of attenuated tokens to the rest of their response.
With ``gate`` and ``repair`` off this is verl's ``vanilla`` loss x token TIS under ``seq-mean-token-mean``.

Worked example (one response, A = -1, old = sampler so delta = 0 except as noted, clip 0.2):
    logp = old -> r = 1, l_ppo = -A * 1 = 1 per token. Two tokens with g = [0.1, 1.0]:
    L_pg = (0.1 * 1 + 1.0 * 1) / (0.1 + 1.0) = 1.0  (an unweighted mean would also be 1.0; weights only
    change how the per-token gradients are shared: d L_pg / d logp = [0.1, 1.0] / 1.1 * (-A) * r).

Inputs: ``[B, T]`` log-probs (bf16/fp16/fp32), ``advantages`` ``[B]`` or ``[B, T]``, mask bool or 0/1.
Non-finite inputs: masked and counted in ``triage/nonfinite_tokens`` (see ``triage.inputs``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from triage.config import DEFAULT_CONFIG, TriageConfig
from triage.diagnostics import metric_tensors, to_floats
from triage.gate import compute_gate
from triage.inputs import as_advantages, as_mask, check_logprob, finite_valid
from triage.repair import RepairResult, compute_repair
from triage.tis import SAFETY_BOUND, tis_weights


class Terms(NamedTuple):
    l: torch.Tensor  # [B, T] per-token PPO loss (with grad), exactly 0 where invalid
    weight: torch.Tensor  # [B, T] detached g * w_tis, 0 where invalid
    weight_gate: torch.Tensor  # [B, T] detached g, 0 where invalid
    gate_sum: torch.Tensor  # [B] sum_t m g  (> 0 for every response with a valid token)
    row_tokens: torch.Tensor  # [B] sum_t m
    valid: torch.Tensor  # [B, T] bool
    repair: RepairResult | None
    metrics: dict[str, torch.Tensor]  # 0-dim tensors


def ppo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    valid: torch.Tensor,
    cfg: TriageConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's ``vanilla`` per-token clipped loss (fp32) and its metrics (masked means over ``valid``)."""
    neg_kl = torch.where(valid, logp.float() - old_logp.detach().float(), 0.0).clamp(
        -SAFETY_BOUND, SAFETY_BOUND
    )
    ratio = torch.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    c1 = torch.maximum(l1, l2)
    l3 = -adv * cfg.clip_ratio_c
    neg_adv = adv < 0
    loss = torch.where(neg_adv, torch.minimum(l3, c1), c1)
    with torch.no_grad():
        vf = valid.float()
        s = torch.stack(
            (
                (l2 > l1).float().mul(vf).sum(),
                (-neg_kl * vf).sum(),
                ((c1 > l3) & neg_adv).float().mul(vf).sum(),
            )
        )
        s = s / vf.sum().clamp(min=1.0)
    return loss, {"actor/pg_clipfrac": s[0], "actor/ppo_kl": s[1], "actor/pg_clipfrac_lower": s[2]}


def compute_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: TriageConfig,
) -> Terms:
    """Validated inputs -> per-token loss, detached weights, repair pieces and metric tensors."""
    check_logprob("logp", logp, "logp", logp)
    check_logprob("old_logp", old_logp, "logp", logp)
    check_logprob("sampler_logp", sampler_logp, "logp", logp)
    valid0 = as_mask(mask, "logp", logp)
    adv_raw = as_advantages(advantages, "logp", logp)
    valid, nonfinite = finite_valid(valid0, logp, old_logp, sampler_logp, adv_raw)
    with torch.no_grad():
        adv = torch.where(valid, adv_raw, 0.0)
        delta = torch.where(valid, old_logp.detach().float() - sampler_logp.detach().float(), 0.0)
        w_tis = tis_weights(delta, cfg.tis_cap) if cfg.tis else torch.ones_like(delta)
        gate = compute_gate(delta, adv, valid, cfg)
        gm = gate.g * valid
        weight = gm * w_tis
        gate_sum = gm.sum(-1)
        row_tokens = valid.sum(-1)
    l, metrics = ppo_token_loss(logp, old_logp, adv, valid, cfg)
    repair = compute_repair(logp, sampler_logp, adv, valid, cfg) if cfg.repair else None
    if cfg.diagnostics:
        metrics.update(metric_tensors(delta, adv, valid, gate, w_tis, cfg))
    metrics["triage/nonfinite_tokens"] = nonfinite.float()
    return Terms(l, weight, gm, gate_sum, row_tokens, valid, repair, metrics)


def triage_policy_loss_reference(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TriageConfig = DEFAULT_CONFIG,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TRIAGE loss ``L = L_pg + L_repair`` (fp32 scalar, grad through ``logp``) and float metrics.

    Metrics: ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (as verl's vanilla),
    ``triage/pg_loss``, ``triage/repair_loss``, ``triage/repair_active_segment_frac``,
    ``triage/gate_grad_shift`` (share of gradient weight the gate moves between tokens, ``fused.gate_grad_shift``),
    ``triage/nonfinite_tokens`` and, with ``config.diagnostics``, every key of
    :data:`triage.diagnostics.MISMATCH_KEYS`.
    """
    terms = compute_terms(logp, old_logp, sampler_logp, advantages, mask, config)
    with torch.no_grad():
        rows = (terms.row_tokens > 0).sum().clamp(min=1)
        coef = terms.weight / (terms.gate_sum.clamp(min=1e-30) * rows).unsqueeze(-1)
    pg = (coef * terms.l).sum()
    metrics = terms.metrics
    metrics["triage/pg_loss"] = pg.detach()
    with torch.no_grad():  # 1/2 sum_t |m g / sum m g - m / sum m|, mean over responses with tokens
        plain = terms.valid / terms.row_tokens.clamp(min=1).unsqueeze(-1)
        gated = terms.weight_gate / terms.gate_sum.clamp(min=1e-30).unsqueeze(-1)
        metrics["triage/gate_grad_shift"] = 0.5 * (gated - plain).abs().sum() / rows
    loss = pg
    if terms.repair is not None:
        rep = config.repair_coef * terms.repair.phi_sum / terms.repair.num_segments.clamp(min=1)
        loss = loss + rep
        metrics["triage/repair_loss"] = rep.detach()
        metrics["triage/repair_active_segment_frac"] = (
            terms.repair.num_active.float() / terms.repair.num_segments.clamp(min=1).float()
        )
    else:
        metrics["triage/repair_loss"] = pg.detach() * 0.0
        metrics["triage/repair_active_segment_frac"] = pg.detach() * 0.0
    return loss, to_floats(metrics)

"""The TRIAGE policy loss (report §3.1, Appendix B; TRIAGE.md §1-§5).

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

Worked example (one response, A = -1, old = sampler so w_tis = 1, logp = old so r = 1, l_ppo = 1):
    two tokens with g = [0.1, 1.0]:  L_pg = (0.1 * 1 + 1.0 * 1) / (0.1 + 1.0) = 1.0, while
    dL_pg/dlogp = g * (-A) * r / sum g = [0.1, 1.0] / 1.1 -- the gate moves gradient, not the loss level.

Inputs: ``[B, T]`` log-probs (bf16/fp16/fp32), ``advantages`` ``[B]`` or ``[B, T]``, mask bool or 0/1.
Computed in fp32 by the fused pass of ``triage.fused`` (analytic gradient); ``triage.reference`` is the
term-by-term autograd definition it is tested against. Non-finite inputs: the token is masked and
counted in ``triage/nonfinite_tokens`` (see ``triage.inputs``).

The last step, shared with the verl adapter (``triage.verl``: :func:`policy_term`, :func:`repair_term`): the fused
pass's per-token pieces become the two terms and their analytic gradients under the caller's normalisation (row
scale ``s_i``, repair scale ``c``):

    k        = s_i g w A                          (s_i < 0, so that l = -A u)
    L_pg     = reduce(k u),          dL_pg / dlogp     = k r_active      (r_active: r where unclipped, else 0)
    L_repair = c sum_s phi_s,        dL_repair / dlogp = c d(sum_s phi_s) / dlogp

    here:         s_i = -1 / (sum_t m g * #responses),  reduce = sum,            c = repair_coef / N_seg
    triage.verl:  s_i = -sum_t m / sum_t m g,           reduce = verl agg_loss,  c = repair_coef * dp_size /
                                                                                     (batch tokens / 128)
"""

from __future__ import annotations

import torch

from triage.config import DEFAULT_CONFIG, TriageConfig
from triage.diagnostics import to_floats
from triage.fused import AttachGrad, Fused, fused_terms
from triage.inputs import raise_on_mask_violations


def policy_term(f: Fused, row_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, dL_pg / dlogp)`` with ``k = s_i g w A`` (``f.k_adv`` scaled in place by the ``[B]`` row scale; the
    caller reduces ``k u``) and the gradient ``k r_active`` (a fresh tensor: backward keeps it). Under no_grad."""
    k = f.k_adv.mul_(row_scale.unsqueeze(-1))
    return k, f.r_active * k


def repair_term(f: Fused, scale: torch.Tensor | float, segment_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c sum_s phi_s, dL_repair / dlogp)`` for the repair scale ``c`` (the pass ran with repair). Under no_grad."""
    return f.phi_sum * scale, f.repair_grad(scale, segment_len)


def record_repair(f: Fused, metrics: dict[str, torch.Tensor], repair_loss: torch.Tensor) -> None:
    """``triage/repair_loss`` (the caller's TRIAGE.md §4 value) and ``triage/repair_active_segment_frac``."""
    metrics["triage/repair_loss"] = repair_loss
    metrics["triage/repair_active_segment_frac"] = f.num_active / f.num_segments.clamp(min=1)


def float_metrics(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """The metrics as floats (one host read-back); raises if the mask held values other than 0 and 1."""
    return raise_on_mask_violations(to_floats(metrics))


def triage_policy_loss(
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
    f = fused_terms(logp, old_logp, advantages, mask, config, sampler_logp=sampler_logp)
    with torch.no_grad():
        rows = (f.row_tokens > 0).sum().clamp(min=1)
        k, grad = policy_term(f, -1.0 / (f.gate_sum.clamp(min=1e-30) * rows))
        pg = torch.dot(k.reshape(-1), f.u.reshape(-1))  # (views of padded buffers under CUDA graphs)
        total = pg
        metrics = f.metrics
        metrics["triage/pg_loss"] = pg
        if f.phi_sum is not None:
            rep, rep_grad = repair_term(
                f, config.repair_coef / f.num_segments.clamp(min=1), config.repair_segment_len
            )
            total = pg + rep
            grad += rep_grad
            record_repair(f, metrics, rep)
        else:
            metrics["triage/repair_loss"] = pg * 0.0
            metrics["triage/repair_active_segment_frac"] = pg * 0.0
    loss = AttachGrad.apply(logp, total, grad)
    return loss, float_metrics(metrics)

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
"""

from __future__ import annotations

import torch

from triage.config import DEFAULT_CONFIG, TriageConfig
from triage.diagnostics import to_floats
from triage.fused import AttachGrad, fused_terms
from triage.inputs import raise_on_mask_violations


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
        # row scale -1 / (sum_t m g * #rows): the sign turns k_adv = g w A into the weight of u in l = -A u
        k = f.k_adv.mul_((-1.0 / (f.gate_sum.clamp(min=1e-30) * rows)).unsqueeze(-1))
        pg = torch.dot(k.reshape(-1), f.u.reshape(-1))  # (views of padded buffers under CUDA graphs)
        grad = f.r_active * k  # a fresh tensor: backward keeps it
        total = pg
        metrics = f.metrics
        metrics["triage/pg_loss"] = pg
        if f.phi_sum is not None:
            nseg = f.num_segments.clamp(min=1)
            scale = config.repair_coef / nseg
            rep = f.phi_sum * scale
            total = pg + rep
            grad += f.repair_grad(scale, config.repair_segment_len)
            metrics["triage/repair_loss"] = rep
            metrics["triage/repair_active_segment_frac"] = f.num_active / nseg
        else:
            metrics["triage/repair_loss"] = pg * 0.0
            metrics["triage/repair_active_segment_frac"] = pg * 0.0
    loss = AttachGrad.apply(logp, total, grad)
    return loss, raise_on_mask_violations(to_floats(metrics))

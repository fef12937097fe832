"""One-sided pseudo-Huber repair on 128-token segments (report §3.1, Appendix B; TRIAGE.md §4).

For responses with ``A > 0``, segments ``r = t // 128`` and the *current* gap ``d = logp - sampler_logp``
(gradient flows through ``logp``):

    gbar     = sum(m * d) / n                         (segment mean over its n > 0 valid tokens)
    x        = relu(b - gbar)                         (excess below the boundary b = -0.5)
    phi(x)   = c^2 * (sqrt(1 + (x / c)^2) - 1)        (c = 1.0; phi'(x) = x / sqrt(1 + (x/c)^2) < c)
    L_repair = repair_coef * sum_segments phi(x) / N_seg

``N_seg`` is the number of non-empty repair segments over the positive-advantage responses of the
batch (0 segments: ``L_repair = 0``). phi is quadratic near 0 (``phi ~ x^2 / 2``) and linear far out
(``phi ~ c * x``), so the pull toward the sampler is bounded however large the gap. Minimising it raises
learner log-probs where the learner under-estimates the sampler in a rewarded response.

Worked example (segment length 2, c = 1, b = -0.5, coef = 0.1), one response, A = +1,
d = [-1.0, -2.0 | 0.0, 0.0]:
    segment 0: gbar = -1.5, x = 1.0, phi = sqrt(2) - 1 = 0.41421;  segment 1: gbar = 0 -> x = 0, phi = 0
    L_repair = 0.1 * 0.41421 / 2 = 0.020711;  dL/dd_t = 0.1 / 2 * (-phi'(1) / 2) = -0.0176777 on segment 0

Inside verl the normaliser ``N_seg`` is replaced by a global constant so that the loss is invariant to
micro-batching and data parallelism; see ``triage.verl``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from triage.config import DEFAULT_CONFIG, TriageConfig
from triage.inputs import as_advantages, as_mask, check_logprob, finite_valid
from triage.segments import segment_sum


class RepairResult(NamedTuple):
    phi_sum: torch.Tensor  # scalar, sum of phi over active segments (with grad)
    num_segments: torch.Tensor  # scalar, non-empty repair segments (A > 0)
    num_active: torch.Tensor  # scalar, segments with x > 0


def pseudo_huber(x: torch.Tensor, c: float) -> torch.Tensor:
    """``c^2 (sqrt(1 + u^2) - 1)`` with ``u = x / c``, written ``c^2 u^2 / (1 + sqrt(1 + u^2))`` so that
    small ``x`` does not cancel in fp32."""
    u2 = (x / c) ** 2
    return (c * c) * u2 / (1.0 + torch.sqrt(1.0 + u2))


def compute_repair(
    logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    adv: torch.Tensor,
    valid: torch.Tensor,
    cfg: TriageConfig,
) -> RepairResult:
    """Core on prepared inputs (``logp`` may be any float dtype; math is fp32)."""
    member = valid & (adv > 0)
    d = torch.where(member, logp.float() - sampler_logp.detach().float(), 0.0)
    seg_len = cfg.repair_segment_len
    sum_d = segment_sum(d, seg_len)
    with torch.no_grad():
        n = segment_sum(member.float(), seg_len)
        nonempty = n > 0
    gbar = sum_d / n.clamp(min=1.0)
    x = torch.where(nonempty, torch.relu(cfg.repair_boundary - gbar), 0.0)
    phi = pseudo_huber(x, cfg.repair_huber_delta)
    with torch.no_grad():
        num_active = (x > 0).sum()
    return RepairResult(phi.sum(), nonempty.sum(), num_active)


def repair_loss(
    logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TriageConfig = DEFAULT_CONFIG,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``L_repair`` (fp32 scalar with grad through ``logp``) and its metrics (TRIAGE.md §4, §6).

    Returns exactly 0 (still connected to ``logp``) when ``config.repair`` is off or no positive-advantage
    segment exists. Metrics: ``triage/repair_loss``, ``triage/repair_active_segment_frac``,
    ``triage/nonfinite_tokens``.
    """
    check_logprob("logp", logp, "logp", logp)
    check_logprob("sampler_logp", sampler_logp, "logp", logp)
    valid0 = as_mask(mask, "logp", logp)
    adv = as_advantages(advantages, "logp", logp)
    valid, nonfinite = finite_valid(valid0, logp, sampler_logp, adv)
    if not config.repair:
        loss = torch.where(valid, logp.float(), 0.0).sum() * 0.0
        stats = torch.stack((loss.detach(), torch.zeros_like(loss.detach()), nonfinite.float()))
    else:
        res = compute_repair(logp, sampler_logp, adv, valid, config)
        loss = config.repair_coef * res.phi_sum / res.num_segments.clamp(min=1)
        stats = torch.stack(
            (
                loss.detach(),
                res.num_active.float() / res.num_segments.clamp(min=1).float(),
                nonfinite.float(),
            )
        )
    v = stats.tolist()
    return loss, {
        "triage/repair_loss": v[0],
        "triage/repair_active_segment_frac": v[1],
        "triage/nonfinite_tokens": v[2],
    }

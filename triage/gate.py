"""Direction gate on 64-token segments (report §2.4, §3.1, Appendix B; TRIAGE.md §2).

For every segment ``s = t // 64`` with ``n = sum m > 0`` valid tokens and gap ``delta = old - sampler``:

    mu     = sum(m * delta) / n
    w_mean = 0.1 if mu < -1.5  else  0.3 if mu < -0.5  else  1.0
    k      = #{valid t in s : delta < -6}
    w_tail = 1 - 0.9 * min(k / 2, 1)
    w_seg  = min(w_mean, w_tail)
    g[i,t] = w_seg  if A[i,t] < 0 and delta[i,t] < 0 (and t valid)  else  1        (detached)

Only the quadrant "negative advantage, learner under-estimates" (A < 0, delta < 0), where a PPO step
would push an already under-estimated token further down, is attenuated (report §2.4). Advantages given
as ``[B, T]`` are read per token (GRPO rows are constant, so this is the per-response rule).

Worked example (segment length 4 for brevity), A = -1, delta = [-2, -2, +1, -7], all valid:
    mu = (-2 - 2 + 1 - 7) / 4 = -2.5 < -1.5 -> w_mean = 0.1;  k = 1 -> w_tail = 1 - 0.9 * 0.5 = 0.55
    w_seg = min(0.1, 0.55) = 0.1;  g = [0.1, 0.1, 1.0, 0.1]   (the positive-gap token keeps 1)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from triage.config import DEFAULT_CONFIG, TriageConfig
from triage.inputs import as_advantages, as_mask, check_logprob, finite_valid
from triage.segments import expand_segments, segment_sum


class GateResult(NamedTuple):
    g: torch.Tensor  # [B, T] fp32 gate weight (1 where not gated / invalid)
    w_seg: torch.Tensor  # [B, S] segment weight min(w_mean, w_tail)
    n: torch.Tensor  # [B, S] valid tokens per segment
    k: torch.Tensor  # [B, S] tail count (valid tokens with delta < tail threshold)
    gated: torch.Tensor  # [B, T] bool: valid token with g < 1


def segment_weights(mu: torch.Tensor, k: torch.Tensor, cfg: TriageConfig) -> torch.Tensor:
    """``min(w_mean(mu), w_tail(k))`` elementwise (segment statistics of any shape)."""
    w_mean = torch.where(
        mu < cfg.gate_tier_low,
        cfg.gate_weight_low,
        torch.where(mu < cfg.gate_tier_high, cfg.gate_weight_mid, cfg.gate_weight_high),
    )
    w_tail = 1.0 - cfg.gate_tail_attenuation * torch.clamp(k / cfg.gate_tail_k_cap, max=1.0)
    return torch.minimum(w_mean, w_tail)


def compute_gate(
    delta: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor, cfg: TriageConfig
) -> GateResult:
    """Core on prepared inputs: fp32 ``delta``/``adv`` ``[B, T]``, bool ``valid`` (finite where valid)."""
    with torch.no_grad():
        seg_len = cfg.gate_segment_len
        t = delta.shape[-1]
        stats = segment_sum(
            torch.stack(
                (
                    torch.where(valid, delta, 0.0),
                    valid.float(),
                    (valid & (delta < cfg.gate_tail_threshold)).float(),
                )
            ),
            seg_len,
        )
        sum_d, n, k = stats[0], stats[1], stats[2]
        w_seg = segment_weights(sum_d / n.clamp(min=1.0), k, cfg)
        if cfg.gate:
            cond = valid & (adv < 0) & (delta < 0)
            g = torch.where(cond, expand_segments(w_seg, seg_len, t), 1.0)
            gated = cond & (g < 1.0)
        else:
            g = torch.ones_like(delta)
            gated = torch.zeros_like(valid)
    return GateResult(g, w_seg, n, k, gated)


def gate_weights(
    delta: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TriageConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """Detached fp32 gate weights ``[B, T]`` (TRIAGE.md §2); 1 everywhere when ``config.gate`` is off.

    ``delta = old_logp - sampler_logp``; tokens with a non-finite delta/advantage are treated as invalid.
    """
    check_logprob("delta", delta, "delta", delta)
    valid0 = as_mask(mask, "delta", delta)
    adv = as_advantages(advantages, "delta", delta)
    valid, _ = finite_valid(valid0, delta, adv)
    d = torch.where(valid, delta.detach().float(), 0.0)
    return compute_gate(d, torch.where(valid, adv, 0.0), valid, config).g

"""Direction-aware mismatch diagnostics (report §2.4, §2.5, Fig. 1; TRIAGE.md §6), under ``no_grad``.

With gap ``delta = old_logp - sampler_logp`` over valid tokens:

    mismatch/abs_gap_mean   mean |delta|             mismatch/gap_mean   mean delta
    mismatch/gap_q05        q_0.05(delta)            mismatch/neg_tail_depth   -q_0.05(delta)
    mismatch/k3_kl          mean(exp(delta) - 1 - delta)   (k3 estimate of KL(sampler || learner))
    mismatch/share/{pos,neg}_adv_{neg,pos}_gap = sum |A| over the quadrant / sum |A|
        (A > 0 or A < 0; gap < 0 "neg" or >= 0 "pos"; tokens with A = 0 carry no weight)
    triage/tail_dense_segment_frac  64-token segments with k >= gate_tail_k_cap / non-empty segments
    triage/gated_segment_frac       segments with at least one token gated (g < 1) / non-empty segments
    triage/gated_token_frac         valid tokens with g < 1 / valid tokens
    triage/mean_gate_weight         mean g over valid tokens
    tis/clip_frac, tis/weight_mean  share of valid tokens whose TIS weight hit the cap; mean TIS weight
    triage/nonfinite_tokens         tokens dropped for non-finite inputs
Quantiles equal ``torch.quantile`` (linear interpolation) without sorting everything or boolean indexing
(``triage.quantile``). All metrics are stacked into one tensor and read back with one ``.tolist()``.
With no valid token every metric is 0.0.

Worked example: delta = [-1, 0, 2, -3], A = [+1, +1, -2, -2] per token
    abs_gap_mean = 1.5; gap_mean = -0.5; sum |A| = 6; pos_adv_neg_gap = 1/6, pos_adv_pos_gap = 1/6,
    neg_adv_neg_gap = 2/6, neg_adv_pos_gap = 2/6;
    q_0.05: sorted [-3, -1, 0, 2], position 0.05 * 3 = 0.15 -> -3 + 0.15 * (-1 - -3) = -2.7.
"""

from __future__ import annotations

import torch

from triage.config import DEFAULT_CONFIG, TriageConfig
from triage.gate import GateResult, compute_gate
from triage.inputs import (
    MASK_VIOLATIONS,
    as_advantages,
    as_mask,
    check_logprob,
    finite_valid,
    mask_violations,
    raise_on_mask_violations,
)
from triage.quantile import masked_quantile
from triage.segments import segment_sum
from triage.tis import SAFETY_BOUND, tis_weights

MISMATCH_KEYS = (
    "mismatch/abs_gap_mean",
    "mismatch/gap_mean",
    "mismatch/gap_q05",
    "mismatch/neg_tail_depth",
    "mismatch/k3_kl",
    "mismatch/share/pos_adv_neg_gap",
    "mismatch/share/pos_adv_pos_gap",
    "mismatch/share/neg_adv_neg_gap",
    "mismatch/share/neg_adv_pos_gap",
    "triage/tail_dense_segment_frac",
    "triage/gated_segment_frac",
    "triage/gated_token_frac",
    "triage/mean_gate_weight",
    "tis/clip_frac",
    "tis/weight_mean",
)


def quantile_linear(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear interpolation) for a 1-D tensor; 0 if empty."""
    return masked_quantile(values, torch.ones_like(values, dtype=torch.bool), q)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-30), torch.zeros_like(num))


def metric_tensors(
    delta: torch.Tensor,
    adv: torch.Tensor,
    valid: torch.Tensor,
    gate: GateResult,
    w_tis: torch.Tensor,
    cfg: TriageConfig,
) -> dict[str, torch.Tensor]:
    """0-dim fp32 tensors for :data:`MISMATCH_KEYS` (prepared inputs; ``delta``/``adv`` zero where invalid)."""
    with torch.no_grad():
        vf = valid.float()
        n_tok = vf.sum()
        dc = delta.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        neg = delta < 0
        absa = adv.abs() * vf
        pos_a = adv > 0
        neg_a = adv < 0
        sums = torch.stack(
            (
                (delta.abs() * vf).sum(),
                (delta * vf).sum(),
                ((torch.exp(dc) - 1.0 - dc) * vf).sum(),
                (absa * (pos_a & neg).float()).sum(),
                (absa * (pos_a & ~neg).float()).sum(),
                (absa * (neg_a & neg).float()).sum(),
                (absa * (neg_a & ~neg).float()).sum(),
                absa.sum(),
                (gate.gated.float()).sum(),
                (gate.g * vf).sum(),
                ((w_tis >= cfg.tis_cap).float() * vf).sum() if cfg.tis else n_tok * 0.0,
                (w_tis * vf).sum(),
            )
        )
        tok = _safe_div(sums[[0, 1, 2, 8, 9, 10, 11]], n_tok)
        share = _safe_div(sums[3:7], sums[7])
        seg_nonempty = gate.n > 0
        n_seg = seg_nonempty.sum()
        tail_dense = ((gate.k >= cfg.gate_tail_k_cap) & seg_nonempty).sum()
        seg_len = cfg.gate_segment_len
        gated_seg = (segment_sum(gate.gated.float(), seg_len) > 0).sum()
        segf = _safe_div(torch.stack((tail_dense, gated_seg)).float(), n_seg.float())
        q05 = masked_quantile(delta, valid, 0.05)
    return named_diagnostics(tok, share, segf, q05)


def named_diagnostics(tok, share, seg, q05) -> dict[str, torch.Tensor]:
    """The §6 keys, from the token means ``tok`` (abs gap, gap, k3, gated frac, gate weight, TIS clip frac,
    TIS weight), the four quadrant shares, the two segment fractions and the 5% quantile of the gap."""
    return {
        "mismatch/abs_gap_mean": tok[0],
        "mismatch/gap_mean": tok[1],
        "mismatch/gap_q05": q05,
        "mismatch/neg_tail_depth": -q05,
        "mismatch/k3_kl": tok[2],
        "mismatch/share/pos_adv_neg_gap": share[0],
        "mismatch/share/pos_adv_pos_gap": share[1],
        "mismatch/share/neg_adv_neg_gap": share[2],
        "mismatch/share/neg_adv_pos_gap": share[3],
        "triage/tail_dense_segment_frac": seg[0],
        "triage/gated_segment_frac": seg[1],
        "triage/gated_token_frac": tok[3],
        "triage/mean_gate_weight": tok[4],
        "tis/clip_frac": tok[5],
        "tis/weight_mean": tok[6],
    }


def to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """All metrics to floats with one host read-back (one GPU sync): one stack, one ``.tolist()``."""
    if not metrics:
        return {}
    vals = []
    for v in metrics.values():
        if v.requires_grad:
            v = v.detach()
        if v.dtype != torch.float32:
            v = v.float()
        vals.append(v if v.dim() == 0 else v.reshape(()))
    return dict(zip(metrics, torch.stack(vals).tolist()))


def mismatch_metrics(
    delta: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TriageConfig = DEFAULT_CONFIG,
) -> dict[str, float]:
    """§6 diagnostics that depend on the gap alone (all keys of :data:`MISMATCH_KEYS` plus
    ``triage/nonfinite_tokens``); ``triage/repair_*`` come from :func:`triage.repair_loss`."""
    check_logprob("delta", delta, "delta", delta)
    violations = mask_violations(mask)
    valid0 = as_mask(mask, "delta", delta)
    adv = as_advantages(advantages, "delta", delta)
    with torch.no_grad():
        valid, nonfinite = finite_valid(valid0, delta, adv)
        d = torch.where(valid, delta.detach().float(), 0.0)
        a = torch.where(valid, adv, 0.0)
        w = tis_weights(d, config.tis_cap) if config.tis else torch.ones_like(d)
        m = metric_tensors(d, a, valid, compute_gate(d, a, valid, config), w, config)
        m["triage/nonfinite_tokens"] = nonfinite.float()
        if violations is not None:
            m[MASK_VIOLATIONS] = violations
    return raise_on_mask_violations(to_floats(m))

"""Fused TRIAGE core: one no-grad pass computes the loss pieces *and* their analytic gradient.

Every TRIAGE term is a detached weight times an elementwise function of ``logp`` (PPO term) or a
function of per-segment sums of ``logp`` (repair), so ``dL/dlogp`` has a closed form:

    l = -A u,   u = min(r, 1 + eps_hi)               (A >= 0)
                u = min(max(r, 1 - eps_lo), c)       (A < 0),        r = exp(clamp(logp - old, -20, 20))
    dl/dlogp = -A r  where u == r (unclipped), else 0
    (this is verl's vanilla loss: max(-A r, -A clip(r)) for A >= 0, and its dual clip for A < 0)

    repair: d phi_sum / d logp_t = -phi'(x_s) [x_s > 0] / n_s   for the n_s member tokens of segment s

The gradient is stored and :class:`AttachGrad` returns it in backward (one multiply), instead of
autograd replaying ~20 elementwise ops. Segment statistics reuse the same buffers; the §6 diagnostics
are derived from them with a handful of reductions. ``triage.reference`` is the plain-autograd
definition; tests check both agree (values, gradients, metrics).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from triage.config import TriageConfig
from triage.gate import segment_weights
from triage.inputs import as_advantages, as_mask, check_logprob
from triage.repair import pseudo_huber
from triage.segments import segment_count, segment_sum, segment_where
from triage.tis import SAFETY_BOUND


class AttachGrad(torch.autograd.Function):
    """``value`` (computed without autograd) with ``d value / d x = local_grad`` (elementwise)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, value: torch.Tensor, local_grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(local_grad)
        ctx.x_dtype = x.dtype
        return value

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (local_grad,) = ctx.saved_tensors
        return (local_grad * grad_out).to(ctx.x_dtype), None, None


class Fused(NamedTuple):
    k_adv: torch.Tensor  # [B, T] g * w_tis * A, 0 where invalid: L = -sum k_adv * u (times row scales)
    u: torch.Tensor  # [B, T] clipped ratio (l_ppo = -A u)
    r_active: torch.Tensor  # [B, T] r where unclipped else 0 (d l_ppo / d logp = -A r_active)
    gate_sum: torch.Tensor  # [B] sum_t m g
    row_tokens: torch.Tensor  # [B] sum_t m
    valid: torch.Tensor  # [B, T] bool
    phi_sum: torch.Tensor | None  # repair: sum of phi over segments
    repair_member: torch.Tensor | None  # [B, T] bool: valid tokens of positive-advantage responses
    repair_seg_grad: torch.Tensor | None  # [B, S_r] d phi_sum / d logp_t for member tokens t of segment s
    num_segments: torch.Tensor | None
    num_active: torch.Tensor | None
    metrics: dict[str, torch.Tensor]

    def repair_grad(self, scale: torch.Tensor | float, seg_len: int) -> torch.Tensor:
        """``scale * d phi_sum / d logp`` as a ``[B, T]`` tensor."""
        return segment_where(self.repair_member, self.repair_seg_grad * scale, 0.0, seg_len)


def fused_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: TriageConfig,
    *,
    sampler_logp: torch.Tensor | None = None,
    gap: torch.Tensor | None = None,
) -> Fused:
    """Validate and run the fused pass; the gap comes from ``sampler_logp`` (``old - sampler``) or is
    given directly as ``gap`` (e.g. ``log`` of verl's raw IS weights; values outside ``mask`` are ignored)."""
    check_logprob("logp", logp, "logp", logp)
    check_logprob("old_logp", old_logp, "logp", logp)
    if (sampler_logp is None) == (gap is None):
        raise ValueError("pass exactly one of sampler_logp or gap")
    if sampler_logp is not None:
        check_logprob("sampler_logp", sampler_logp, "logp", logp)
    else:
        check_logprob("gap", gap, "logp", logp)
    mask = as_mask(mask, "logp", logp)
    adv_in = as_advantages(advantages, "logp", logp)
    with torch.no_grad():
        lp, old = logp.detach().float(), old_logp.detach().float()
        src = old - sampler_logp.detach().float() if sampler_logp is not None else gap.detach().float()
        return _fused(lp, old, src, adv_in, mask, cfg)


def _fused(lp, old, gap, adv, mask, cfg: TriageConfig) -> Fused:
    metrics: dict[str, torch.Tensor] = {}
    L = cfg.gate_segment_len
    # non-finite policy: drop tokens whose inputs are NaN/inf. Fast path: three reductions show that
    # everything is finite (then valid = mask); otherwise build the per-token finite mask. One host sync
    # also brings the token count that the quantile needs.
    delta = torch.where(mask, gap, 0.0)
    sum_d = segment_sum(delta, L)
    x_raw = lp - old
    adv_check = adv[..., :1] if adv.stride(-1) == 0 else adv  # [B] advantages broadcast over T
    finite_total, n_host = torch.stack(
        (x_raw.sum() + sum_d.sum() + adv_check.sum(), torch.count_nonzero(mask).float())
    ).tolist()
    nonfinite = None
    valid = mask
    if not math.isfinite(finite_total):
        chk = x_raw + delta
        chk += adv
        valid = torch.isfinite(chk).logical_and_(mask)
        del chk
        delta = torch.where(valid, delta, 0.0)
        sum_d = segment_sum(delta, L)
        n_mask = n_host
        n_host = int(torch.count_nonzero(valid))
        nonfinite = n_mask - n_host
    n_host = int(n_host)
    a = torch.where(valid, adv, 0.0)

    # gate statistics (64-token segments); padding and dropped tokens have delta = 0, a = 0
    n_seg = segment_count(valid, L)
    row_tokens = n_seg.sum(-1)
    n_valid = row_tokens.sum()
    nv = n_valid.clamp(min=1)
    metrics["triage/nonfinite_tokens"] = nv.new_tensor(float(nonfinite or 0), dtype=torch.float32)
    tail = delta < cfg.gate_tail_threshold
    if cfg.gate_tail_threshold >= 0:
        tail &= valid
    k = segment_count(tail, L)
    del tail
    w_seg = segment_weights(sum_d / n_seg.clamp(min=1), k, cfg)
    neg_gap = delta < 0
    neg_adv = a < 0

    # TIS weight w = min(exp(clamp(delta)), C); k3 uses expm1 so that small gaps stay exact
    w = None
    if cfg.tis or cfg.diagnostics:
        n_all = float(delta.numel())
        dc = delta.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        if cfg.diagnostics:
            # k3 = mean_valid(exp(dc) - 1 - dc); 0 on invalid tokens
            metrics["mismatch/k3_kl"] = (torch.expm1(dc) - dc).sum() / nv
        if cfg.tis:
            w = dc.exp_()
            if cfg.diagnostics:
                clipped = torch.count_nonzero(w >= cfg.tis_cap) - (
                    (n_all - n_valid) if cfg.tis_cap <= 1.0 else 0
                )
                metrics["tis/clip_frac"] = clipped / nv
            w.clamp_(max=cfg.tis_cap)
            if cfg.diagnostics:  # invalid tokens carry w = min(1, C)
                metrics["tis/weight_mean"] = (w.sum() - (n_all - n_valid) * min(1.0, cfg.tis_cap)) / nv
        else:
            del dc
            if cfg.diagnostics:
                metrics["tis/clip_frac"] = nv * 0.0
                metrics["tis/weight_mean"] = (n_valid > 0).float()

    # token weight k = g * w * A (A = 0 where invalid, so k is too)
    if cfg.gate:
        cond = neg_gap & neg_adv
        n_cond = segment_count(cond, L)
        gated = w_seg < 1.0
        # sum_t m g = n - sum_s n_cond (1 - w_seg)
        gate_sum = row_tokens - (n_cond * (1.0 - w_seg)).sum(-1)
        kw = segment_where(cond, w_seg, 1.0, L)
        del cond
        if w is not None:
            kw *= w
        kw *= a
    else:
        gate_sum = row_tokens.float()
        kw = w.mul_(a) if w is not None else a.clone()
    del w

    # PPO: u = clamp(r, lo_t, hi_t) with (lo, hi) = (0, 1 + eps_hi) for A >= 0, (1 - eps_lo, c) for A < 0
    x = torch.where(valid, x_raw, 0.0).clamp_(-SAFETY_BOUND, SAFETY_BOUND)
    metrics["actor/ppo_kl"] = -x.sum() / nv
    r = x.exp_()
    lo_t = torch.where(neg_adv, 1.0 - cfg.clip_ratio_low, 0.0)
    hi_t = torch.where(neg_adv, cfg.clip_ratio_c, 1.0 + cfg.clip_ratio_high)
    u = torch.clamp(r, lo_t, hi_t)
    del lo_t, hi_t
    # verl's metrics from s = (u - r) A: pg_clipfrac counts A > 0 with r > 1 + hi and A < 0 with
    # r < 1 - lo (both s < 0); pg_clipfrac_lower counts A < 0 with r > c (s > 0)
    s_clip = (u - r).mul_(a)
    metrics["actor/pg_clipfrac"] = torch.count_nonzero(s_clip < 0) / nv
    metrics["actor/pg_clipfrac_lower"] = torch.count_nonzero(s_clip > 0) / nv
    del s_clip
    r_active = torch.where(u == r, r, 0.0)
    del r

    # repair (128-token segments, A > 0; a > 0 implies valid)
    phi_sum = member = seg_coef = num_segments = num_active = None
    if cfg.repair:
        Lr = cfg.repair_segment_len
        member = a > 0
        n_r = segment_count(member, Lr)
        # current gap d = logp - sampler = (logp - old) + delta
        gbar = segment_sum(torch.where(member, x_raw + delta, 0.0), Lr) / n_r.clamp(min=1)
        nonempty = n_r > 0
        xr = torch.where(nonempty, torch.relu(cfg.repair_boundary - gbar), 0.0)
        phi_sum = pseudo_huber(xr, cfg.repair_huber_delta).sum()
        dphi = xr / torch.sqrt(1.0 + (xr / cfg.repair_huber_delta) ** 2)
        seg_coef = torch.where(xr > 0, -dphi / n_r.clamp(min=1), 0.0)
        num_segments = nonempty.sum()
        num_active = (xr > 0).sum()
    del x_raw

    if cfg.diagnostics:
        metrics["mismatch/abs_gap_mean"] = torch.linalg.vector_norm(delta, ord=1) / nv
        metrics["mismatch/gap_mean"] = sum_d.sum() / nv
        negf = neg_gap.float()
        abs_a = a.abs()
        s_abs = abs_a.sum()
        s_a = a.sum()
        s_abs_neg = torch.dot(abs_a.view(-1), negf.view(-1))
        s_a_neg = torch.dot(a.view(-1), negf.view(-1))
        del negf, abs_a
        den = torch.where(s_abs > 0, s_abs, torch.ones_like(s_abs))
        metrics["mismatch/share/pos_adv_neg_gap"] = 0.5 * (s_abs_neg + s_a_neg) / den
        metrics["mismatch/share/pos_adv_pos_gap"] = 0.5 * ((s_abs + s_a) - (s_abs_neg + s_a_neg)) / den
        metrics["mismatch/share/neg_adv_neg_gap"] = 0.5 * (s_abs_neg - s_a_neg) / den
        metrics["mismatch/share/neg_adv_pos_gap"] = 0.5 * ((s_abs - s_a) - (s_abs_neg - s_a_neg)) / den
        nonempty_g = n_seg > 0
        n_seg_total = nonempty_g.sum().clamp(min=1)
        metrics["triage/tail_dense_segment_frac"] = (
            (k >= cfg.gate_tail_k_cap) & nonempty_g
        ).sum() / n_seg_total
        if cfg.gate:
            metrics["triage/gated_segment_frac"] = ((n_cond > 0) & gated).sum() / n_seg_total
            metrics["triage/gated_token_frac"] = (n_cond * gated).sum() / nv
            metrics["triage/mean_gate_weight"] = torch.where(n_valid > 0, gate_sum.sum() / nv, 0.0)
        else:
            metrics["triage/gated_segment_frac"] = nv * 0.0
            metrics["triage/gated_token_frac"] = nv * 0.0
            metrics["triage/mean_gate_weight"] = (n_valid > 0).float()
        q05 = _q05_masked(delta, valid, n_host)
        metrics["mismatch/gap_q05"] = q05
        metrics["mismatch/neg_tail_depth"] = -q05

    return Fused(
        kw,
        u,
        r_active,
        gate_sum.float(),
        row_tokens,
        valid,
        phi_sum,
        member,
        seg_coef,
        num_segments,
        num_active,
        metrics,
    )


def _q05_masked(delta: torch.Tensor, valid: torch.Tensor, n: int, q: float = 0.05) -> torch.Tensor:
    """``torch.quantile(delta[valid], q)`` (linear) without boolean indexing: the ``hi + 1`` smallest of
    ``where(valid, delta, +inf)``, then the two largest of those."""
    if n == 0:
        return delta.new_zeros(())
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    vals = torch.where(valid, delta, float("inf")).view(-1)
    smallest = torch.topk(vals, hi + 1, largest=False, sorted=False).values
    top2 = torch.topk(smallest, min(2, hi + 1)).values  # descending
    v_hi = top2[0]
    v_lo = top2[1] if hi > lo else v_hi
    return v_lo + (pos - lo) * (v_hi - v_lo)

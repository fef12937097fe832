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

from typing import NamedTuple

import torch

from triage.config import TriageConfig
from triage.gate import segment_weights
from triage.inputs import as_advantages, as_mask, check_logprob
from triage.repair import pseudo_huber
from triage.segments import segment_sum, segment_where
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
    k_neg_adv: torch.Tensor  # [B, T] g * w_tis * (-A), 0 where invalid: l-weight so that L = sum k * u
    u: torch.Tensor  # [B, T] clipped ratio (l_ppo = -A u)
    r_active: torch.Tensor  # [B, T] r where unclipped else 0 (dl_ppo/dlogp = -A r_active)
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
    sampler_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: TriageConfig,
) -> Fused:
    check_logprob("logp", logp, "logp", logp)
    check_logprob("old_logp", old_logp, "logp", logp)
    check_logprob("sampler_logp", sampler_logp, "logp", logp)
    mask = as_mask(mask, "logp", logp)
    adv_in = as_advantages(advantages, "logp", logp)
    with torch.no_grad():
        return _fused(logp.detach().float(), old_logp.detach().float(), sampler_logp.detach().float(), adv_in, mask, cfg)


def _fused(lp, old, samp, adv, mask, cfg: TriageConfig) -> Fused:  # noqa: PLR0915 - one pass, on purpose
    metrics: dict[str, torch.Tensor] = {}
    # non-finite policy: drop tokens whose inputs are NaN/inf (a sum of finite log-probs is finite)
    chk = lp + old
    chk += samp
    chk += adv
    valid = torch.isfinite(chk).logical_and_(mask)
    del chk
    row_tokens = valid.sum(-1)
    n_valid = row_tokens.sum()
    metrics["triage/nonfinite_tokens"] = (mask.sum() - n_valid).float()
    a = torch.where(valid, adv, 0.0)

    # gap, TIS weight
    delta = torch.where(valid, old - samp, 0.0)
    if cfg.tis or cfg.diagnostics:
        dc = delta.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        w = torch.expm1(dc)
        if cfg.diagnostics:
            n_all = float(delta.numel())
            # k3 = mean_valid(exp(dc) - 1 - dc), summed per token (expm1 keeps small gaps exact); 0 on invalid
            metrics["mismatch/k3_kl"] = (w - dc).sum() / n_valid.clamp(min=1)
        del dc
        w += 1.0
        if cfg.diagnostics and cfg.tis:
            clipped = (w >= cfg.tis_cap).sum() - (n_all - n_valid if cfg.tis_cap <= 1.0 else 0)
        if cfg.tis:
            w.clamp_(max=cfg.tis_cap)
    if cfg.diagnostics:
        if cfg.tis:
            metrics["tis/clip_frac"] = clipped / n_valid.clamp(min=1)
            # invalid tokens carry w = min(1, C)
            metrics["tis/weight_mean"] = (w.sum() - (n_all - n_valid) * min(1.0, cfg.tis_cap)) / n_valid.clamp(min=1)
        else:
            metrics["tis/clip_frac"] = n_valid.float() * 0.0
            metrics["tis/weight_mean"] = (n_valid > 0).float()

    # gate (64-token segments)
    L = cfg.gate_segment_len
    neg_gap = delta < 0
    neg_adv = a < 0
    sum_d = segment_sum(delta, L)
    n_seg = segment_sum(valid, L)
    tail = delta < cfg.gate_tail_threshold
    if cfg.gate_tail_threshold >= 0:
        tail &= valid
    k = segment_sum(tail, L)
    del tail
    w_seg = segment_weights(sum_d / n_seg.clamp(min=1), k, cfg)
    cond = neg_gap & neg_adv
    if cfg.gate:
        n_cond = segment_sum(cond, L)
        gated_seg = (n_cond > 0) & (w_seg < 1.0)
        # sum_t m g = n - sum_s n_cond (1 - w_seg)
        gate_sum = row_tokens - (n_cond * (1.0 - w_seg)).sum(-1)
        kw = segment_where(cond, w_seg, 1.0, L)
        if cfg.tis:
            kw *= w
    else:
        gate_sum = row_tokens.float()
        kw = w if cfg.tis else torch.ones_like(delta)
    kw *= a
    kw.neg_()  # k_neg_adv = g * w * (-A); zero where invalid because A is

    # PPO ratio, clipped ratio u and its active set
    x = torch.where(valid, lp - old, 0.0).clamp_(-SAFETY_BOUND, SAFETY_BOUND)
    metrics["actor/ppo_kl"] = -x.sum() / n_valid.clamp(min=1)
    r = torch.exp(x)
    del x
    u_pos = r.clamp(max=1.0 + cfg.clip_ratio_high)
    u_neg = r.clamp(min=1.0 - cfg.clip_ratio_low).clamp_(max=cfg.clip_ratio_c)
    u = torch.where(neg_adv, u_neg, u_pos)
    del u_pos, u_neg
    active = u == r
    r_active = r.mul_(active)
    # verl's metrics: clipfrac counts A > 0 with r > 1 + hi and A < 0 with r < 1 - lo; lower counts A < 0, r > c
    lower = (u == cfg.clip_ratio_c).logical_and_(neg_adv)
    lower &= ~active
    n_lower = lower.sum()
    del lower
    inactive_nonzero = (~active).logical_and_(a != 0)
    metrics["actor/pg_clipfrac"] = (inactive_nonzero.sum() - n_lower) / n_valid.clamp(min=1)
    metrics["actor/pg_clipfrac_lower"] = n_lower / n_valid.clamp(min=1)
    del inactive_nonzero, active

    # repair (128-token segments, A > 0)
    phi_sum = member = seg_coef = num_segments = num_active = None
    if cfg.repair:
        Lr = cfg.repair_segment_len
        member = valid & (a > 0)
        dd = torch.where(member, lp - samp, 0.0)
        n_r = segment_sum(member, Lr)
        gbar = segment_sum(dd, Lr) / n_r.clamp(min=1)
        del dd
        nonempty = n_r > 0
        xr = torch.where(nonempty, torch.relu(cfg.repair_boundary - gbar), 0.0)
        phi_sum = pseudo_huber(xr, cfg.repair_huber_delta).sum()
        c = cfg.repair_huber_delta
        dphi = xr / torch.sqrt(1.0 + (xr / c) ** 2)
        seg_coef = torch.where(xr > 0, -dphi / n_r.clamp(min=1), 0.0)
        num_segments = nonempty.sum()
        num_active = (xr > 0).sum()

    if cfg.diagnostics:
        nv = n_valid.clamp(min=1)
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
        metrics["triage/tail_dense_segment_frac"] = ((k >= cfg.gate_tail_k_cap) & nonempty_g).sum() / n_seg_total
        if cfg.gate:
            metrics["triage/gated_segment_frac"] = gated_seg.sum() / n_seg_total
            metrics["triage/gated_token_frac"] = (n_cond * (w_seg < 1.0)).sum() / nv
            metrics["triage/mean_gate_weight"] = torch.where(n_valid > 0, gate_sum.sum() / nv, 0.0)
        else:
            metrics["triage/gated_segment_frac"] = nv * 0.0
            metrics["triage/gated_token_frac"] = nv * 0.0
            metrics["triage/mean_gate_weight"] = (n_valid > 0).float()
        q05 = _q05_masked(delta, valid, int(n_valid))
        metrics["mismatch/gap_q05"] = q05
        metrics["mismatch/neg_tail_depth"] = -q05

    return Fused(
        kw, u, r_active, gate_sum.float(), row_tokens, valid, phi_sum, member, seg_coef, num_segments, num_active, metrics
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

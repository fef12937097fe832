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
are derived from them with a handful of reductions, stacked into one vector and normalised together.

Host synchronisation: on a GPU the pass reads nothing back (no ``.item()``, no boolean indexing, the
non-finite mask is built unconditionally and the gap quantile is taken with a device-side count,
``triage.quantile``); the caller's one ``.tolist()`` of all metrics is the only sync per call. On the
CPU, where a read-back is free, a finiteness check and the token count are read mid-pass to skip work.
Both paths give identical results (tested). ``triage.reference`` is the plain-autograd
definition; tests check both agree (values, gradients, metrics).

CUDA graphs: on a GPU the pass is a few hundred small kernels, and launching them costs more than running
them. With ``TriageConfig.cuda_graphs`` (the default) the pass runs on inputs zero-padded to a shape bucket and,
from a bucket's second call on, as the replay of a CUDA graph (``triage.graphs``). Padded tokens are masked
out, so the values are the unpadded pass's up to the order of fp32 sums (bit-equal where the shape is a bucket
already), and they depend on the input only. The returned per-token tensors are then views of the graph's
buffers: the callers use them at once and keep only fresh tensors.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from triage.config import TriageConfig
from triage.diagnostics import named_diagnostics
from triage.gate import segment_weights
from triage.graphs import PaddedGraphs, bucket, usable
from triage.inputs import MASK_VIOLATIONS, as_advantages, as_mask, check_logprob, mask_violations
from triage.quantile import avoid_host_sync, masked_quantile
from triage.repair import pseudo_huber
from triage.segments import num_segments, segment_count, segment_sum, segment_where
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

    def crop(self, b: int, t: int, repair_seg_len: int) -> Fused:
        """The pass of zero-padded inputs cut back to the first ``b`` rows and ``t`` tokens (padding is masked, so
        its sums and counts are those of the unpadded inputs). ``valid`` is copied: verl's aggregation keeps it for
        backward, after the graph's buffers may have been overwritten."""
        seg = self.repair_seg_grad
        return self._replace(
            k_adv=self.k_adv[:b, :t],
            u=self.u[:b, :t],
            r_active=self.r_active[:b, :t],
            gate_sum=self.gate_sum[:b],
            row_tokens=self.row_tokens[:b],
            valid=self.valid[:b, :t].clone(),
            repair_member=None if self.repair_member is None else self.repair_member[:b, :t],
            repair_seg_grad=None if seg is None else seg[:b, : num_segments(t, repair_seg_len)],
            metrics=dict(self.metrics),
        )


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
    violations = mask_violations(mask)
    mask = as_mask(mask, "logp", logp)
    adv_in = as_advantages(advantages, "logp", logp)
    with torch.no_grad():
        if cfg.cuda_graphs and usable(logp.device):
            src = sampler_logp if sampler_logp is not None else gap
            f = _padded(logp.detach(), old_logp.detach(), src.detach(), sampler_logp is not None, adv_in, mask, cfg)
        else:
            lp, old = logp.detach().float(), old_logp.detach().float()
            src = old - sampler_logp.detach().float() if sampler_logp is not None else gap.detach().float()
            f = _fused(lp, old, src, adv_in, mask, cfg)
    if violations is not None:  # checked at the caller's single read-back (raise_on_mask_violations)
        f.metrics[MASK_VIOLATIONS] = violations
    return f


#: the buffers and CUDA graphs of :func:`_padded`, one per bucket and setting
GRAPHS = PaddedGraphs()


def _padded(logp, old_logp, src, from_sampler: bool, adv, mask, cfg: TriageConfig) -> Fused:
    """:func:`_fused` on inputs zero-padded to their bucket (``triage.graphs``): ``B`` to :func:`bucket`, ``T``
    also to a multiple of both segment lengths, so that the padding adds whole, empty segments. ``src`` is the
    sampler's log-probs (``from_sampler``) or the gap itself; ``adv`` is ``[B, T]``, a broadcast view of ``[B]``
    advantages being carried as ``[B]``."""
    b, t = logp.shape
    bp, tp = bucket(b), bucket(t, math.lcm(cfg.gate_segment_len, cfg.repair_segment_len))
    rows = t > 1 and adv.stride(-1) == 0
    adv_in, adv_shape = (adv[:, 0], (bp,)) if rows else (adv, (bp, tp))

    def run(lp, old, src_, a, m):
        gap = old - src_ if from_sampler else src_
        return _fused(lp, old, gap, a.unsqueeze(-1).expand(bp, tp) if rows else a, m, cfg)

    key = (logp.device, bp, tp, rows, from_sampler, cfg)
    f32 = torch.float32
    f = GRAPHS.run(key, run, (logp, old_logp, src, adv_in, mask), ((bp, tp),) * 3 + (adv_shape, (bp, tp)),
                   (f32, f32, f32, f32, torch.bool))
    return f.crop(b, t, cfg.repair_segment_len)


def _fused(lp, old, gap, adv, mask, cfg: TriageConfig) -> Fused:
    metrics: dict[str, torch.Tensor] = {}
    L = cfg.gate_segment_len
    # non-finite policy: drop tokens whose inputs are NaN/inf (the sum of finite log-probs and advantages
    # is finite). On the CPU, where reading a value back costs nothing, three reductions show that
    # everything is finite (the common case) and the per-token mask is built only otherwise. Elsewhere
    # (GPU) the mask is built unconditionally so that the whole pass, metrics included, needs no host
    # synchronisation until the caller's single ``.tolist()`` (``triage.diagnostics.to_floats``).
    x_raw = lp - old
    n_host: int | None = None
    if avoid_host_sync(lp.device):
        chk = x_raw + gap
        chk += adv
        valid = torch.isfinite(chk).logical_and_(mask)
        del chk
        nonfinite = torch.count_nonzero(mask) - torch.count_nonzero(valid)
        delta = torch.where(valid, gap, 0.0)
        sum_d = segment_sum(delta, L)
    else:
        delta = torch.where(mask, gap, 0.0)
        sum_d = segment_sum(delta, L)
        adv_check = adv[..., :1] if adv.stride(-1) == 0 else adv  # [B] advantages broadcast over T
        finite_total, n_mask = torch.stack(
            (x_raw.sum() + sum_d.sum() + adv_check.sum(), torch.count_nonzero(mask).float())
        ).tolist()
        valid, n_host = mask, int(n_mask)
        nonfinite = torch.zeros((), dtype=torch.int64, device=lp.device)
        if not math.isfinite(finite_total):
            chk = x_raw + delta
            chk += adv
            valid = torch.isfinite(chk).logical_and_(mask)
            del chk
            delta = torch.where(valid, delta, 0.0)
            sum_d = segment_sum(delta, L)
            n_host = int(torch.count_nonzero(valid))
            nonfinite = torch.tensor(int(n_mask) - n_host)
    a = torch.where(valid, adv, 0.0)

    # gate statistics (64-token segments); padding and dropped tokens have delta = 0, a = 0
    n_seg = segment_count(valid, L)
    row_tokens = n_seg.sum(-1)
    n_valid = row_tokens.sum()
    nv = n_valid.clamp(min=1)
    metrics["triage/nonfinite_tokens"] = nonfinite.float()
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
    diag: dict[str, torch.Tensor] = {}  # raw sums of the §6 diagnostics, normalised together below
    if cfg.tis or cfg.diagnostics:
        n_all = float(delta.numel())
        dc = delta.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        if cfg.diagnostics:  # k3 = mean_valid(exp(dc) - 1 - dc); 0 on invalid tokens
            diag["mismatch/k3_kl"] = (torch.expm1(dc) - dc).sum()
        if cfg.tis:
            w = dc.exp_()
            if cfg.diagnostics:
                diag["tis/clip_frac"] = torch.count_nonzero(w >= cfg.tis_cap) - (
                    (n_all - n_valid) if cfg.tis_cap <= 1.0 else 0
                )
            w.clamp_(max=cfg.tis_cap)
            if cfg.diagnostics:  # over valid tokens only: subtracting the padding's min(1, C) from a sum over
                # all tokens loses the small valid sum to fp32 cancellation when padding dominates
                diag["tis/weight_mean"] = torch.where(valid, w, 0.0).sum()
        else:
            del dc
            if cfg.diagnostics:  # w = 1: nothing clipped, mean 1 (0 without valid tokens)
                diag["tis/clip_frac"] = torch.zeros_like(n_valid)
                diag["tis/weight_mean"] = n_valid

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
        gate_stats = (n_cond, gated, gate_sum)
        metrics["triage/gate_grad_shift"] = gate_grad_shift(n_cond, w_seg, gate_sum, row_tokens)
    else:
        gate_sum = row_tokens.float()
        gate_stats = None
        metrics["triage/gate_grad_shift"] = torch.zeros((), device=delta.device)
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
        metrics.update(
            _diagnostics(diag, delta, sum_d, a, neg_gap, n_seg, k, n_valid, n_host, valid, cfg, gate_stats)
        )

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


def gate_grad_shift(n_cond, w_seg, gate_sum, row_tokens) -> torch.Tensor:
    """Mean over responses of the share of policy-gradient weight the gate moves between tokens:
    ``1/2 sum_t |m g / sum m g - m / sum m|`` (total variation between the gated and the plain token weights).

    Per segment, ``n_cond`` tokens carry ``g = w_seg`` and the rest ``g = 1``. A response whose tokens are all
    gated alike gets 0 (the normalisation gives the gradient back), one with half its tokens at g = 0.5
    gets 1/2 (2/3 - 1/2) * 2 = 1/6."""
    inv_g = 1.0 / gate_sum.clamp(min=1e-30)
    inv_n = 1.0 / row_tokens.clamp(min=1).float()
    cond = (n_cond * (w_seg * inv_g.unsqueeze(-1) - inv_n.unsqueeze(-1)).abs()).sum(-1)
    rest = (row_tokens - n_cond.sum(-1)) * (inv_g - inv_n).abs()
    return 0.5 * (cond + rest).sum() / (row_tokens > 0).sum().clamp(min=1)


def _diagnostics(diag, delta, sum_d, a, neg_gap, n_seg, k, n_valid, n_host, valid, cfg, gate_stats):
    """The §6 metrics (``triage.diagnostics`` defines them) from the fused pass's buffers: the raw sums
    are stacked into one vector and normalised with a few vector ops, so that a GPU runs a handful of
    kernels (no per-metric scalar arithmetic) and nothing is read back here."""
    negf = neg_gap.float()
    abs_a = a.abs()
    nonempty = n_seg > 0
    if gate_stats is not None:
        n_cond, gated, gate_sum = gate_stats
        gated_tok = (n_cond * gated).sum()
        gate_total = gate_sum.sum()
        gated_seg = ((n_cond > 0) & gated).sum()
    else:  # g = 1: nothing gated, mean gate weight 1 (0 without valid tokens)
        gated_tok = gated_seg = torch.zeros_like(n_valid)
        gate_total = n_valid
    s = torch.stack(
        (
            torch.linalg.vector_norm(delta, ord=1),
            sum_d.sum(),
            diag["mismatch/k3_kl"],
            gated_tok,
            gate_total,
            diag["tis/clip_frac"],
            diag["tis/weight_mean"],
            torch.dot(abs_a.view(-1), negf.view(-1)),  # sum |A| [gap < 0]
            torch.dot(a.view(-1), negf.view(-1)),  # sum A [gap < 0]
            abs_a.sum(),
            a.sum(),
            ((k >= cfg.gate_tail_k_cap) & nonempty).sum(),
            gated_seg,
        )
    )
    del negf, abs_a
    tok = (s[:7] / n_valid.clamp(min=1)).unbind()
    # quadrants: sum over A > 0 of |A| = (|A| + A) / 2, over A < 0 = (|A| - A) / 2; per gap sign:
    # [[pos_adv_neg_gap, pos_adv_all], [neg_adv_neg_gap, neg_adv_all]] -> all - neg_gap = pos_gap
    pm = torch.stack((s[7:11:2] + s[8:11:2], s[7:11:2] - s[8:11:2]))
    pm[:, 1] -= pm[:, 0]
    s_abs = s[9]
    share = (0.5 * pm).view(4) / torch.where(s_abs > 0, s_abs, torch.ones_like(s_abs))
    share = share.unbind()
    seg = (s[11:13] / nonempty.sum().clamp(min=1)).unbind()
    n = n_valid if n_host is None else n_host
    q05 = masked_quantile(delta, valid, 0.05, n=n, sync_free=n_host is None)
    return named_diagnostics(tok, share, seg, q05)

"""Batch-invariant kernels for strict alignment on GPUs: a row's output bits do not depend on how many rows run
with it, on its padding, or on whether it is one decode row or part of a full-sequence pass.

A float reduction's result depends on its order. cuBLAS and PyTorch's reduction kernels choose tiles, split-K
and thread layouts by shape, so the same row is reduced in one order in a decode step of 1-64 rows and in
another in the learner's pass over thousands, and the low bits differ. Each kernel here has ONE configuration
(its constexpr tile sizes and warps) whatever the shapes, and reduces every output element in an order fixed by
that configuration alone:

- :func:`linear`  ``y[m, n] = sum_k x[m, k] w[n, k] (+ b[n])``. Program (row tile, column tile) walks k in steps
  of ``BLOCK_K``, in order, into an fp32 accumulator (fp32 operands multiply in IEEE fp32, 16-bit ones on the
  tensor cores). Which tile a row lands in changes nothing: each output element is the same dot over the same
  k steps, and no split-K ever divides k by shape.
- :func:`rows`  per row r of ``x [R, N]``: ``acc[BLOCK] += x[r, c*BLOCK:(c+1)*BLOCK]`` for c = 0, 1, ..., then one
  tree sum of ``acc``. ``sum``; ``logsumexp = m + log(sum exp(x - m))`` with ``m = max(x)`` (exact in any
  order); ``log_softmax = (x - m) - log(sum exp(x - m))``; ``softmax = exp(x - m) / sum exp(x - m)``.
- :func:`attention`  per query row (b, h, i) with its valid keys ``[lo, hi)``: key blocks
  ``[lo + j*BLOCK_N, lo + (j+1)*BLOCK_N)`` in order, with the online softmax (running max, sum and fp32
  accumulator). The blocks start at the row's first valid key, so left padding (which shifts ``lo``) does not
  move them, and a decode step (one query over the cache slots ``[start, slot]``) runs the same program as that
  position's row in the full causal pass.

Worked example (why the blocks start at ``lo``): a row attends keys 2..6 of a cache with two pad slots in front,
BLOCK_N = 4. The blocks are {2..5}, {6}. The learner's copy of the sequence has no padding: keys 0..4, blocks
{0..3}, {4}: the same keys in the same groups, so the same bits. Blocks aligned at slot 0 would group the cache
as {0..3}, {4..7}: keys {2, 3} and {4, 5, 6}, another order and other low bits.

The references are PyTorch's own ops (``F.linear``, ``torch.logsumexp``, ``F.scaled_dot_product_attention``):
equal up to the reduction order (tests: ``tests/minite_kernels/test_batch_invariant.py``).
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    from minite_kernels.backends.triton._common import interpret_mode  # also the interpreter's loop-bound fix
except Exception:  # pragma: no cover - the modules import without Triton; the kernels need it
    triton = None

#: the one tile configuration of each kernel (never chosen by shape: that is the point)
LINEAR_BLOCKS = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
LINEAR_WARPS = 4
ROWS_BLOCK = 1024
ATTN_BLOCK_N = 64
ROW_OPS = ("sum", "logsumexp", "log_softmax", "softmax")

if triton is not None:

    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk, sym, syn,
                       HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        xm = rm.to(tl.int64)[:, None] * sxm
        wn = rn.to(tl.int64)[None, :] * swn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            a = tl.load(x_ptr + xm + kk[None, :] * sxk, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(w_ptr + wn + kk[:, None] * swk, mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
            if UPCAST:  # the CPU interpreter's dot misreads 16-bit floats: exact fp32 copies of them instead
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + rm.to(tl.int64)[:, None] * sym + rn[None, :] * syn
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def _rows_kernel(x_ptr, y_ptr, r_ptr, N, sx, sy, OP: tl.constexpr, BLOCK: tl.constexpr):
        # OP: 0 sum -> r, 1 logsumexp -> r, 2 log_softmax -> y, 3 softmax -> y
        row = tl.program_id(0).to(tl.int64)
        xr = x_ptr + row * sx
        offs = tl.arange(0, BLOCK)
        if OP == 0:
            acc = tl.zeros((BLOCK,), tl.float32)
            for c in range(0, N, BLOCK):
                acc += tl.load(xr + c + offs, mask=c + offs < N, other=0.0).to(tl.float32)
            tl.store(r_ptr + row, tl.sum(acc, 0))
        else:
            mx = tl.full((BLOCK,), float("-inf"), tl.float32)
            for c in range(0, N, BLOCK):
                mx = tl.maximum(mx, tl.load(xr + c + offs, mask=c + offs < N, other=float("-inf")).to(tl.float32))
            m = tl.max(mx, 0)
            acc = tl.zeros((BLOCK,), tl.float32)
            for c in range(0, N, BLOCK):
                x = tl.load(xr + c + offs, mask=c + offs < N, other=float("-inf")).to(tl.float32)
                acc += tl.exp(x - m)
            s = tl.sum(acc, 0)
            if OP == 1:
                tl.store(r_ptr + row, m + tl.log(s))
            else:
                ls = tl.log(s)
                yr = y_ptr + row * sy
                for c in range(0, N, BLOCK):
                    x = tl.load(xr + c + offs, mask=c + offs < N, other=0.0).to(tl.float32)
                    if OP == 2:
                        y = (x - m) - ls
                    else:
                        y = tl.exp(x - m) / s
                    tl.store(yr + c + offs, y.to(y_ptr.dtype.element_ty), mask=c + offs < N)

    @triton.jit
    def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lo_ptr, hi_ptr, scale, H, REP,
                          sqb, sqh, sqi, sqd, skb, skh, skj, skd, svb, svh, svj, svd, sob, soh, soi, sod,
                          slb, slh, sli, D, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
        bh = tl.program_id(0)
        i = tl.program_id(1).to(tl.int64)
        b = (bh // H).to(tl.int64)
        h = bh % H
        g = (h // REP).to(tl.int64)
        h = h.to(tl.int64)
        lo = tl.load(lo_ptr + b * slb + h * slh + i * sli)
        hi = tl.load(hi_ptr + b * slb + h * slh + i * sli)
        d = tl.arange(0, BLOCK_D)
        dm = d < D
        q = tl.load(q_ptr + b * sqb + h * sqh + i * sqi + d * sqd, mask=dm, other=0.0).to(tl.float32)
        kb = k_ptr + b * skb + g * skh
        vb = v_ptr + b * svb + g * svh
        m = tl.full((), float("-inf"), tl.float32)
        l = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for j0 in range(lo, hi, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            jm = j < hi
            ld = jm[:, None] & dm[None, :]
            kt = tl.load(kb + j.to(tl.int64)[:, None] * skj + d[None, :] * skd, mask=ld, other=0.0).to(tl.float32)
            s = tl.where(jm, tl.sum(kt * q[None, :], 1) * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            vt = tl.load(vb + j.to(tl.int64)[:, None] * svj + d[None, :] * svd, mask=ld, other=0.0).to(tl.float32)
            l = l * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * vt, 0)
            m = m_new
        out = tl.where(hi > lo, acc / tl.where(hi > lo, l, 1.0), 0.0)  # no valid key: 0
        tl.store(o_ptr + b * sob + h * soh + i * soi + d * sod, out.to(o_ptr.dtype.element_ty), mask=dm)


def _need_triton() -> None:
    if triton is None:
        raise RuntimeError("the batch-invariant kernels need Triton (pip install 'minite-rl[gpu]')")


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ w[N, K]ᵀ (+ bias [N])`` in x's dtype, batch-invariant (module docstring)."""
    _need_triton()
    if x.dtype != w.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"batch-invariant linear: x {x.dtype}, weight {w.dtype}"
                        f"{'' if bias is None else f', bias {bias.dtype}'} must share one dtype")
    k = x.shape[-1]
    if w.dim() != 2 or w.shape[1] != k:
        raise ValueError(f"batch-invariant linear: weight {tuple(w.shape)} does not match input {tuple(x.shape)}")
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m and n:
        bm, bn = LINEAR_BLOCKS["BLOCK_M"], LINEAR_BLOCKS["BLOCK_N"]
        _linear_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            x2, w, bias if bias is not None else x2, y, m, n, k, x2.stride(0), x2.stride(1), w.stride(0),
            w.stride(1), y.stride(0), y.stride(1), HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
            UPCAST=interpret_mode(),
            num_warps=LINEAR_WARPS, **LINEAR_BLOCKS)
    return y.view(*x.shape[:-1], n)


def rows(x: torch.Tensor, op: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``op`` over the last dim of ``x``: ``sum`` / ``logsumexp`` give [...], ``log_softmax`` / ``softmax``
    [..., N]; computed in fp32, returned in ``out_dtype`` (default x's dtype)."""
    _need_triton()
    if op not in ROW_OPS:
        raise ValueError(f"unknown row op {op!r}; valid: {', '.join(ROW_OPS)}")
    n = x.shape[-1] if x.dim() else 1
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r = x2.shape[0]
    out_dtype = out_dtype or x.dtype
    code = ROW_OPS.index(op)
    if code < 2:
        red = torch.empty(r, dtype=torch.float32, device=x.device)
        y = red
    else:
        y = torch.empty(r, n, dtype=out_dtype, device=x.device)
        red = y
    if r and n:
        _rows_kernel[(r,)](x2, y, red, n, x2.stride(0), y.stride(0) if code >= 2 else 0, OP=code, BLOCK=ROWS_BLOCK,
                           num_warps=4)
    elif code == 0:
        red.zero_()
    elif code == 1:
        red.fill_(float("-inf"))
    if code < 2:
        return red.to(out_dtype).view(x.shape[:-1])
    return y.view(x.shape)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
              scale: float) -> torch.Tensor:
    """``q [B, H, Lq, D]`` over ``k`` / ``v [B, Hk, Lk, D]`` (query head h reads KV head h // (H / Hk)); row
    (b, h, i) attends keys ``[lo, hi)`` of ``lo`` / ``hi`` int32 [b, h, Lq] (size-1 dims broadcast); a row with
    ``hi <= lo`` gives 0. Output [B, H, Lq, D] in q's dtype."""
    _need_triton()
    b, h, lq, d = q.shape
    hk = k.shape[1]
    if k.shape[0] != b or v.shape[:2] != k.shape[:2] or k.shape[-1] != d or v.shape[-1] != d or h % hk:
        raise ValueError(f"batch-invariant attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "do not fit [B, H, Lq, D] / [B, Hk, Lk, D] with H a multiple of Hk")
    lo, hi = (t.to(torch.int32).contiguous() for t in torch.broadcast_tensors(lo, hi))
    if lo.dim() != 3:
        raise ValueError(f"batch-invariant attention: lo / hi must be 3-d [B, H, Lq] (size-1 broadcast), got "
                         f"{tuple(lo.shape)}")
    o = torch.empty(b, h, lq, d, dtype=q.dtype, device=q.device)
    if not (b and h and lq):
        return o
    st = [s if n > 1 else 0 for s, n in zip(lo.stride(), lo.shape)]
    _attention_kernel[(b * h, lq)](
        q, k, v, o, lo, hi, float(scale), h, h // hk, *q.stride(), *k.stride(), *v.stride(), *o.stride(), *st, d,
        BLOCK_D=triton.next_power_of_2(d), BLOCK_N=ATTN_BLOCK_N, num_warps=4)
    return o

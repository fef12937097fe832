"""Decode attention over the static KV cache: one new query token per row, grouped-query heads.

For row b, KV head g and its ``rep`` query heads (rows of ``q[b, g]``), with the valid slots
``s in [start[b], end)`` (the left-padded prompt's first real slot, up to and including this step's slot)::

    o[b, g, r] = sum_s softmax_s(scale * q[b, g, r] . K[b, g, s]) V[b, g, s]

- :func:`decode_attention_ref`: the reference, ``scaled_dot_product_attention`` with a boolean mask.
- :func:`decode_attention`: a Triton split-K kernel (flash decoding): program (b, g, split) reads only the
  valid slots of its part of the sequence in tiles of ``BLOCK_N``, keeps the running max ``m``, sum ``l``
  and fp32 accumulator of the online softmax, and a second launch combines the splits:
  ``o = sum_i acc_i e^(m_i - M) / sum_i l_i e^(m_i - M)`` with ``M = max_i m_i``. The mask is never
  materialised and slots outside ``[start, end)`` are never read, so the cost follows the rows' real lengths.

Worked example: one slot (start 0, end 1) gives softmax = [1] and o = V[b, g, 0] for every query row.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    import minite_kernels.backends.triton  # noqa: F401 - its _common: the CPU interpreter's loop-bound fix
except Exception:  # pragma: no cover - the reference runs without Triton
    triton = None


def valid_mask(start: torch.Tensor, end: torch.Tensor, s: int) -> torch.Tensor:
    """bool [B, s]: slot j of row b is valid when start[b] <= j < end."""
    j = torch.arange(s, device=start.device)
    return (j >= start.unsqueeze(1)) & (j < end)


def decode_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                         ) -> torch.Tensor:
    """``q`` [B, Hkv, rep, D], ``k`` / ``v`` [B, Hkv, S, D], ``mask`` bool [B, S] -> [B, Hkv, rep, D]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale)


if triton is not None:

    @triton.jit
    def _split_kernel(q_ptr, k_ptr, v_ptr, start_ptr, end_ptr, m_ptr, l_ptr, acc_ptr, scale,
                      sqb, sqh, sqr, skb, skh, sks, svb, svh, svs, H, REP, CHUNK,
                      NSPLIT: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                      IEEE: tl.constexpr):
        pid_bh = tl.program_id(0)
        split = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        offs_r = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, D)
        rmask = offs_r < REP
        q = tl.load(q_ptr + b * sqb + h * sqh + offs_r[:, None] * sqr + offs_d[None, :], mask=rmask[:, None],
                    other=0.0)
        start = tl.load(start_ptr + b).to(tl.int32)
        end = tl.load(end_ptr).to(tl.int32)
        lo = tl.maximum(start, split * CHUNK)
        hi = tl.minimum(end, (split + 1) * CHUNK)
        m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_R,), tl.float32)
        acc = tl.zeros((BLOCK_R, D), tl.float32)
        kbase = k_ptr + b * skb + h * skh
        vbase = v_ptr + b * svb + h * svh
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            nmask = offs_n < hi
            kt = tl.load(kbase + offs_n[:, None] * sks + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(kt), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kt))
            s = tl.where(nmask[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            vt = tl.load(vbase + offs_n[:, None] * svs + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m = m_new
        row = (pid_bh * NSPLIT + split) * BLOCK_R + offs_r
        tl.store(m_ptr + row, m)
        tl.store(l_ptr + row, l)
        tl.store(acc_ptr + row[:, None] * D + offs_d[None, :], acc)

    @triton.jit
    def _combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, sob, soh, sor, H, REP,
                        NSPLIT: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr):
        pid_bh = tl.program_id(0)
        b = pid_bh // H
        h = pid_bh % H
        offs_r = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, D)
        big = tl.full((BLOCK_R,), float("-inf"), tl.float32)
        for i in range(NSPLIT):
            big = tl.maximum(big, tl.load(m_ptr + (pid_bh * NSPLIT + i) * BLOCK_R + offs_r))
        den = tl.zeros((BLOCK_R,), tl.float32)
        num = tl.zeros((BLOCK_R, D), tl.float32)
        for i in range(NSPLIT):
            row = (pid_bh * NSPLIT + i) * BLOCK_R + offs_r
            mi = tl.load(m_ptr + row)
            w = tl.where(mi == float("-inf"), 0.0, tl.exp(mi - big))
            den += tl.load(l_ptr + row) * w
            num += tl.load(acc_ptr + row[:, None] * D + offs_d[None, :]) * w[:, None]
        o = num / den[:, None]
        rmask = offs_r < REP
        tl.store(o_ptr + b * sob + h * soh + offs_r[:, None] * sor + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=rmask[:, None])


def num_splits(rows: int, kv_heads: int, s: int, sms: int = 132, block_n: int = 64) -> int:
    """Sequence splits so that rows * kv_heads * splits fills the GPU about twice, at least one tile each."""
    want = -(-2 * sms // max(1, rows * kv_heads))
    return max(1, min(want, -(-s // block_n)))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                     scale: float, *, splits: int | None = None, block_n: int = 64) -> torch.Tensor:
    """The Triton kernel: ``q`` [B, Hkv, rep, D], ``k`` / ``v`` [B, Hkv, S, D] (last dim contiguous),
    ``start`` int [B], ``end`` int [1] (device tensors) -> [B, Hkv, rep, D] in ``q``'s dtype. No host sync."""
    if triton is None:
        raise RuntimeError("decode_attention needs Triton; use decode_attention_ref")
    b, h, rep, d = q.shape
    s = k.shape[2]
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim {d} must be a power of two >= 16")
    q = q.contiguous()
    nsplit = splits or num_splits(b, h, s)
    chunk = -(-s // nsplit)
    block_r = max(16, triton.next_power_of_2(rep))
    dev = q.device
    m = torch.empty(b * h * nsplit * block_r, dtype=torch.float32, device=dev)
    lsum = torch.empty_like(m)
    acc = torch.empty(b * h * nsplit * block_r, d, dtype=torch.float32, device=dev)
    o = torch.empty_like(q)
    ieee = q.dtype == torch.float32
    _split_kernel[(b * h, nsplit)](q, k, v, start, end, m, lsum, acc, scale,
                                   q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                   v.stride(0), v.stride(1), v.stride(2), h, rep, chunk,
                                   NSPLIT=nsplit, D=d, BLOCK_R=block_r, BLOCK_N=block_n, IEEE=ieee)
    _combine_kernel[(b * h,)](m, lsum, acc, o, o.stride(0), o.stride(1), o.stride(2), h, rep,
                              NSPLIT=nsplit, D=d, BLOCK_R=block_r)
    return o

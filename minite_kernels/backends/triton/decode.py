"""Packed-FP4 decode linear (W4A4 at small batch): weights stay packed at 4.5 bits/parameter.

Report §2.2 / §5.1; the same contract as the W4A4 GEMM (``gemm.py``, notes §1.4, §2)::

    y[b, n] = Σ_k (q_x s_x)[b, k] · (q_w s_w)[n, k] · amax_x[b] · amax_w / 2688²

``x`` is quantized per token (``quantize.py``, exact ``qs_x = e2m1 * s_b`` in BF16); the weight is read as
packed E2M1 bytes ``[N, K/2]`` + E4M3 scales ``[N, K/16]`` (0.5625 bytes/parameter against 2 for BF16), decoded
in registers to the exact ``q_w * s_w`` and multiplied with FP32 accumulation. Decoding is memory-bound, so
reading 3.56x fewer weight bytes is where the speed-up comes from.

Split-K: when there are few output rows (``N / BLOCK_N`` programs would leave SMs idle) the K range is
split over ``SPLIT`` programs; each writes an FP32 partial and the last one to arrive (an atomic counter per
row block, reset by that program, so no memset) sums the partials in a fixed order (deterministic).

Worked example: K = 16, x = w = ones: amax 1, s_b 448, q = 6 for both; acc = 16 * 2688²; y = 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INV_2688_SQ, interpret_mode
from .quantize import _e2m1_value, _e4m3_decode

INV_2688_SQ_C = tl.constexpr(INV_2688_SQ)


@triton.jit
def _decode_linear_kernel(
    x_ptr,
    xamax_ptr,
    w_ptr,
    ws_ptr,
    wamax_ptr,
    out_ptr,
    part_ptr,
    cnt_ptr,
    B,
    N,
    K,
    k_per_split,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_B: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.arange(0, BLOCK_B)
    nmask = offs_n < N
    bmask = offs_b < B
    acc = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    k_start = pid_k * k_per_split
    for kk in range(0, k_per_split, BLOCK_K):
        k0 = k_start + kk
        hc = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kmask_h = hc < K // 2
        wb = tl.load(
            w_ptr + offs_n[:, None] * (K // 2) + hc[None, :], mask=nmask[:, None] & kmask_h[None, :], other=0
        ).to(tl.int32)
        codes = tl.reshape(tl.join(wb & 15, wb >> 4), [BLOCK_N, BLOCK_K])
        mag = _e2m1_value(codes & 7)
        vals = tl.where(codes >= 8, -mag, mag)
        bc = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        sb = tl.load(
            ws_ptr + offs_n[:, None] * (K // 16) + bc[None, :],
            mask=nmask[:, None] & (bc[None, :] < K // 16),
            other=0,
        ).to(tl.int32)
        s = _e4m3_decode(sb)
        w = tl.reshape(tl.reshape(vals, [BLOCK_N, BLOCK_K // 16, 16]) * s[:, :, None], [BLOCK_N, BLOCK_K])
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + offs_b[:, None] * K + cols[None, :], mask=bmask[:, None] & (cols[None, :] < K), other=0.0
        )
        if USE_DOT:
            if DOT_F32:  # Triton's CPU interpreter mis-handles bf16 dots
                acc = tl.dot(w, tl.trans(x.to(tl.float32)), acc)
            else:
                acc = tl.dot(w.to(tl.bfloat16), tl.trans(x.to(tl.bfloat16)), acc)
        else:
            acc += tl.sum(w[:, None, :] * x.to(tl.float32)[None, :, :], axis=2)
    xa = tl.load(xamax_ptr + offs_b, mask=bmask, other=0.0)
    wa = tl.load(wamax_ptr)
    res = (acc * INV_2688_SQ_C) * (xa[None, :] * wa)
    out_ptrs = out_ptr + offs_b[None, :] * N + offs_n[:, None]
    omask = nmask[:, None] & bmask[None, :]
    if SPLIT == 1:
        tl.store(out_ptrs, res.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        pptrs = part_ptr + (pid_k * BLOCK_B + offs_b[None, :]) * N + offs_n[:, None]
        tl.store(pptrs, res, mask=omask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tot = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
            for s_idx in tl.static_range(SPLIT):
                p = part_ptr + (s_idx * BLOCK_B + offs_b[None, :]) * N + offs_n[:, None]
                tot += tl.load(p, mask=omask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, tot.to(out_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


_WORKSPACE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, split: int, bb: int, n: int, nblocks: int):
    key = (device, split, bb, n)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = (
            torch.empty((split, bb, n), dtype=torch.float32, device=device),
            torch.zeros(nblocks, dtype=torch.int32, device=device),
        )
        _WORKSPACE[key] = ws
    return ws


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_linear(
    x_qs: torch.Tensor,
    x_amax: torch.Tensor,
    w_data: torch.Tensor,
    w_scales: torch.Tensor,
    w_amax: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    split: int | None = None,
) -> torch.Tensor:
    """``y [B, N]`` from per-token-quantized activations (``x_qs`` bf16 [B, K], ``x_amax`` fp32 [B]) and a
    packed per-tensor NVFP4 weight (``w_data`` u8 [N, K/2], ``w_scales`` e4m3/u8 [N, K/16], ``w_amax`` [1])."""
    b, k = x_qs.shape
    n = w_data.shape[0]
    out = torch.empty((b, n), dtype=out_dtype, device=x_qs.device)
    if b == 0 or n == 0:
        return out
    use_dot = b > 4
    bb = 16 if use_dot else triton.next_power_of_2(b)
    bn = 32 if use_dot else 16
    bk = 256 if k >= 256 else max(16, triton.next_power_of_2(k))
    nblocks = triton.cdiv(n, bn)
    if split is None:
        target = 2 * _num_sms(x_qs.device)
        split = 1
        while nblocks * split < target and split < 8 and k // (split * 2) >= 4 * bk:
            split *= 2
    k_per_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per_split)
    part, cnt = _workspace(x_qs.device, split, bb, n, nblocks) if split > 1 else (out, out)
    _decode_linear_kernel[(nblocks, split)](
        x_qs,
        x_amax,
        w_data,
        w_scales.view(torch.uint8),
        w_amax,
        out,
        part,
        cnt,
        b,
        n,
        k,
        k_per_split,
        BLOCK_N=bn,
        BLOCK_K=bk,
        BLOCK_B=bb,
        SPLIT=split,
        USE_DOT=use_dot,
        DOT_F32=interpret_mode(),
        num_warps=4,
    )
    return out

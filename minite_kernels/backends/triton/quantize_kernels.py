"""Fused NVFP4 quantization kernels (Triton), byte-identical to ``minite_kernels.formats.quantize_nvfp4``: the
generic kernels. Their host launchers are in ``quantize.py``.

Report §2.2 (two-level NVFP4 scaling) and §5.1 (per-token outer scale); the arithmetic is the reference's,
notes §1.2, every step fp32 round-to-nearest (divisions use ``div_rn``, not Triton's approximate ``/``)::

    amax  = max|x| over the tensor (per_tensor) or over each row (per_token)
    S_enc = min(2688 / amax, FLT_MAX), 1 if amax == 0;   S_dec = 1 / S_enc
    vmax  = max|x| over the 1x16 block (or the 16x16 tile, written on each of its 16 rows)
    s_b   = e4m3_rne(min(vmax * (S_enc * fl(1/6)), 448))          -> ``scales`` (E4M3 byte)
    enc   = min(1 / (s_b * S_dec), FLT_MAX)
    q     = e2m1_rne(clamp(x * enc, -6, 6))  (or TE's 8-bit stochastic rounding)  -> ``data`` (2 codes/byte)
    qs    = e2m1(q) * s_b  (optional bf16 output; exact in bf16: <= 6 significant bits)

``qs`` is the operand an emulated NVFP4 GEMM feeds to BF16 tensor cores; the outer ``amax/2688`` factors
go to the GEMM epilogue (notes §1.4, §2).

The encoding's device functions live in ``nvfp4_jit.py``, shared with the BF16 and decode kernels.
E4M3 rounding is done in integer/fp32 arithmetic (no fp8 cast): for ``p`` in [0, 448], the quantum is
``2^(max(e, -6) - 3)`` with ``e = floor(log2 p)``; ``rint(p / quantum)`` uses the ``(t + 2^23) - 2^23``
round-to-nearest-even trick (exact for ``t < 2^22``). Example: ``p = 282.24`` -> ``e = 8``, quantum 32,
``t = 8.82`` -> 9 -> ``s_b = 288`` (byte ``(8+7)<<3 | 1 = 0x79``), matching notes §1.9.

Non-finite input poisons its scaling domain exactly as the reference does: amax NaN, scale bytes 0x7F,
codes 0.

BF16 inputs with unit stride along K (rows up to 16384 elements per token) take the word-wise fast path
of ``quantize_bf16.py`` (launch geometry ``BF16_CONFIG``); other dtypes and layouts use the generic kernels
below.

Per-tensor scaling is two launches (an amax reduction, then the quantize pass): the tensor is read twice.
Per-token scaling is one launch: each program reads its rows twice (row amax, then quantize), the second
read mostly from L2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_jit import (
    _block_scale,
    _decode_factor,
    _e2m1_rn,
    _e2m1_value,
    _e4m3_decode,
    _encode_scale,
    _sr_mag,
)


@triton.jit
def _quantize_tile(
    x,
    s_enc,
    s_dec,
    rbits,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TILE16: tl.constexpr,
    SR: tl.constexpr,
):
    """Quantize an fp32 tile [BLOCK_M, BLOCK_K] (zeros where masked).

    ``s_enc``/``s_dec``: [BLOCK_M, 1] (per token) or scalars (per tensor). ``rbits``: int32 random
    bytes [BLOCK_M, BLOCK_K] when SR. Returns (packed uint8 [BM, BK/2], scale bytes [BM, BK/16] int32,
    qs fp32 [BM, BK] = ±e2m1 * s_b).
    """
    NB: tl.constexpr = BLOCK_K // 16
    xb = tl.reshape(x, [BLOCK_M, NB, 16])
    vmax = tl.max(tl.abs(xb), axis=2)  # [BM, NB]
    if TILE16:
        t = tl.max(tl.reshape(vmax, [BLOCK_M // 16, 16, NB]), axis=1)  # [BM/16, NB]
        vmax = tl.reshape(tl.broadcast_to(t[:, None, :], [BLOCK_M // 16, 16, NB]), [BLOCK_M, NB])
    s_b, sbyte, enc = _block_scale(vmax, s_enc, s_dec)
    y = xb * enc[:, :, None]
    y = tl.minimum(tl.maximum(y, -6.0), 6.0)
    a = tl.abs(y)
    if SR:
        mag = _sr_mag(a, tl.reshape(rbits, [BLOCK_M, NB, 16]))  # on the E2M1 grid: rounding it is exact
        code, _mag = _e2m1_rn(mag, y)  # signed code
    else:
        code, mag = _e2m1_rn(a, y)
    qs = tl.where(y < 0.0, mag * -1.0, mag) * s_b[:, :, None]  # mag * -1 keeps -0 (Triton lowers -x to 0 - x)
    pairs = tl.reshape(code, [BLOCK_M, BLOCK_K // 2, 2])
    lo, hi = tl.split(pairs)
    packed = (lo | (hi << 4)).to(tl.uint8)
    return packed, sbyte, tl.reshape(qs, [BLOCK_M, BLOCK_K])


@triton.jit
def _load_tile(x_ptr, rows, cols, M, K, stride_m, stride_k):
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0)
    return x.to(tl.float32), mask


@triton.jit
def _store_outputs(
    data_ptr,
    scales_ptr,
    qs_ptr,
    rbits_ptr,
    rows,
    k0,
    M,
    K,
    packed,
    sbyte,
    qs,
    BLOCK_K: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
):
    rmask = rows[:, None] < M
    if WRITE_PACKED:
        hc = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        tl.store(
            data_ptr + rows[:, None] * (K // 2) + hc[None, :], packed, mask=rmask & (hc[None, :] < K // 2)
        )
        bc = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        tl.store(
            scales_ptr + rows[:, None] * (K // 16) + bc[None, :],
            sbyte.to(tl.uint8),
            mask=rmask & (bc[None, :] < K // 16),
        )
    if WRITE_QS:
        cols = k0 + tl.arange(0, BLOCK_K)
        tl.store(
            qs_ptr + rows[:, None] * K + cols[None, :],
            qs.to(qs_ptr.dtype.element_ty),
            mask=rmask & (cols[None, :] < K),
        )


@triton.jit
def _load_rbits(rbits_ptr, rows, cols, M, K, SR: tl.constexpr):
    if SR:
        m = (rows[:, None] < M) & (cols[None, :] < K)
        return tl.load(rbits_ptr + rows[:, None] * K + cols[None, :], mask=m, other=0).to(tl.int32)
    else:
        return 0


@triton.jit
def _amax_kernel(
    x_ptr,
    scratch_ptr,
    M,
    K,
    stride_m,
    stride_k,
    nprog,
    tiles_per_prog,
    tiles_k,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Global max|x| over finite values (as int32 bits, atomic max into scratch[0]) and a non-finite flag
    (scratch[1]). Persistent: program p walks tiles p, p + nprog, ... (tiles past the end are masked)."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    badacc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int32)
    for i in range(0, tiles_per_prog):
        t = pid + i * nprog
        rows = (t // tiles_k) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (t % tiles_k) * BLOCK_K + tl.arange(0, BLOCK_K)
        x, _ = _load_tile(x_ptr, rows, cols, M, K, stride_m, stride_k)
        a = tl.abs(x)
        fin = a < float("inf")  # False for +-inf and NaN
        acc = tl.maximum(acc, tl.where(fin, a, 0.0))
        badacc = tl.maximum(badacc, (~fin).to(tl.int32))
    m = tl.max(tl.max(acc, axis=1), axis=0)
    b = tl.max(tl.max(badacc, axis=1), axis=0)
    tl.atomic_max(scratch_ptr, m.to(tl.int32, bitcast=True))
    tl.atomic_max(scratch_ptr + 1, b)


@triton.jit
def _quantize_per_tensor_kernel(
    x_ptr,
    data_ptr,
    scales_ptr,
    qs_ptr,
    amax_out_ptr,
    scratch_ptr,
    rbits_ptr,
    M,
    K,
    stride_m,
    stride_k,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TILE16: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    amax = tl.load(scratch_ptr).to(tl.float32, bitcast=True)
    bad = tl.load(scratch_ptr + 1) != 0
    if (pid_m == 0) & (pid_k == 0):
        tl.store(amax_out_ptr, tl.where(bad, float("nan"), amax))
    s_enc, s_dec = _encode_scale(amax)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k0 = pid_k * BLOCK_K
    cols = k0 + tl.arange(0, BLOCK_K)
    x, _ = _load_tile(x_ptr, rows, cols, M, K, stride_m, stride_k)
    x = tl.where(bad, 0.0, x)  # a poisoned tensor stores codes 0 and scale bytes 0x7F
    rb = _load_rbits(rbits_ptr, rows, cols, M, K, SR)
    packed, sbyte, qs = _quantize_tile(x, s_enc, s_dec, rb, BLOCK_M, BLOCK_K, TILE16, SR)
    _store_outputs(
        data_ptr,
        scales_ptr,
        qs_ptr,
        rbits_ptr,
        rows,
        k0,
        M,
        K,
        packed,
        tl.where(bad, 0x7F, sbyte),
        qs,
        BLOCK_K,
        WRITE_PACKED,
        WRITE_QS,
    )


@triton.jit
def _quantize_per_token_kernel(
    x_ptr,
    data_ptr,
    scales_ptr,
    qs_ptr,
    amax_out_ptr,
    rbits_ptr,
    M,
    K,
    stride_m,
    stride_k,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    badacc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x, _ = _load_tile(x_ptr, rows, cols, M, K, stride_m, stride_k)
        a = tl.abs(x)
        fin = a < float("inf")
        acc = tl.maximum(acc, tl.where(fin, a, 0.0))
        badacc = tl.maximum(badacc, (~fin).to(tl.int32))
    amax = tl.max(acc, axis=1)  # [BM]
    bad = tl.max(badacc, axis=1) != 0
    tl.store(amax_out_ptr + rows, tl.where(bad, float("nan"), amax), mask=rows < M)
    s_enc, s_dec = _encode_scale(amax)
    s_enc = s_enc[:, None]
    s_dec = s_dec[:, None]
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x, _ = _load_tile(x_ptr, rows, cols, M, K, stride_m, stride_k)
        x = tl.where(bad[:, None], 0.0, x)  # a poisoned row stores codes 0 and scale bytes 0x7F
        rb = _load_rbits(rbits_ptr, rows, cols, M, K, SR)
        packed, sbyte, qs = _quantize_tile(x, s_enc, s_dec, rb, BLOCK_M, BLOCK_K, False, SR)
        _store_outputs(
            data_ptr,
            scales_ptr,
            qs_ptr,
            rbits_ptr,
            rows,
            k0,
            M,
            K,
            packed,
            tl.where(bad[:, None], 0x7F, sbyte),
            qs,
            BLOCK_K,
            WRITE_PACKED,
            WRITE_QS,
        )


@triton.jit
def _dequantize_kernel(
    data_ptr,
    scales_ptr,
    amax_ptr,
    out_ptr,
    M,
    K,
    PER_TOKEN: tl.constexpr,
    APPLY_AMAX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = e2m1 * the decode factor (``_decode_factor``: TE's order; bit-equal to the reference), or
    e2m1 * s_b when not APPLY_AMAX (the exact ``qs`` GEMM operand)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows[:, None] < M
    hc = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    b = tl.load(
        data_ptr + rows[:, None] * (K // 2) + hc[None, :], mask=rmask & (hc[None, :] < K // 2), other=0
    )
    b = b.to(tl.int32)
    lo = b & 15
    hi = b >> 4
    codes = tl.reshape(tl.join(lo, hi), [BLOCK_M, BLOCK_K])
    bc = pid_k * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    sb = tl.load(
        scales_ptr + rows[:, None] * (K // 16) + bc[None, :], mask=rmask & (bc[None, :] < K // 16), other=0
    )
    s = _e4m3_decode(sb.to(tl.int32))
    if APPLY_AMAX:
        if PER_TOKEN:
            am = tl.load(amax_ptr + rows, mask=rows < M, other=0.0)[:, None]
        else:
            am = tl.load(amax_ptr)
        s = _decode_factor(s, am)
    mag = _e2m1_value(codes & 7)
    v = tl.where(codes >= 8, mag * -1.0, mag)  # code 8 is -0 (Triton lowers -x to 0 - x: +0)
    out = tl.reshape(v, [BLOCK_M, BLOCK_K // 16, 16]) * s[:, :, None]
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(
        out_ptr + rows[:, None] * K + cols[None, :],
        tl.reshape(out, [BLOCK_M, BLOCK_K]).to(out_ptr.dtype.element_ty),
        mask=rmask & (cols[None, :] < K),
    )

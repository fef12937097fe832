"""Fused NVFP4 quantization kernels (Triton), byte-identical to ``minite_kernels.formats.quantize_nvfp4``.

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

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import interpret_mode
from .launcher import CachedLauncher
from .nvfp4_jit import (
    FLT_MAX,
    SIXTH,
    _decode_factor,
    _e2m1_code_rn,
    _e2m1_value,
    _e4m3_decode,
    _e4m3_rne,
    _encode_scale,
    _sr_step,
)
from .quantize_bf16 import _amax_kernel_bf16, _quant_tensor_kernel_bf16, _quant_token_kernel_bf16


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
    pre = vmax * (s_enc * SIXTH)
    pre = tl.minimum(tl.minimum(pre, FLT_MAX), 448.0)
    s_b, sbyte = _e4m3_rne(pre)
    enc = tl.minimum(tl.math.div_rn(tl.full(s_b.shape, 1.0, tl.float32), s_b * s_dec), FLT_MAX)
    y = xb * enc[:, :, None]
    y = tl.minimum(tl.maximum(y, -6.0), 6.0)
    a = tl.abs(y)
    if SR:
        u = tl.reshape(rbits, [BLOCK_M, NB, 16]).to(tl.float32) * 0.00390625
        t = a + u * _sr_step(a)
        st = _sr_step(t)
        mag = tl.minimum(tl.floor(t * (1.0 / st)) * st, 6.0)
        code = _e2m1_code_rn(mag)
    else:
        code = _e2m1_code_rn(a)
        mag = _e2m1_value(code)
    neg = y < 0.0
    code = tl.where(neg, code + 8, code)
    qs = tl.where(neg, mag * -1.0, mag) * s_b[:, :, None]  # mag * -1 keeps -0 (Triton lowers -x to 0 - x)
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


# ------------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------------
# launchers
# ------------------------------------------------------------------------------------------------------
_NUM_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def launch_amax(x: torch.Tensor, scratch: torch.Tensor) -> None:
    """scratch (int32 [2], zeroed) <- (bits of max|x| over finite values, any non-finite)."""
    m, k = x.shape
    bm, bk = 16, 256
    tiles_k = triton.cdiv(k, bk)
    n_tiles = triton.cdiv(m, bm) * tiles_k
    nprog = max(1, min(n_tiles, _num_sms(x.device) * 8))
    _amax_kernel[(nprog,)](
        x,
        scratch,
        m,
        k,
        x.stride(0),
        x.stride(1),
        nprog,
        triton.cdiv(n_tiles, nprog),
        tiles_k,
        BLOCK_M=bm,
        BLOCK_K=bk,
        num_warps=4,
    )


class QuantOut(NamedTuple):
    """Outputs of :func:`quantize_nvfp4_triton` (None where not requested)."""

    data: torch.Tensor | None  # uint8 [M, K/2]
    scales: torch.Tensor | None  # float8_e4m3fn [M, K/16]
    amax: torch.Tensor  # fp32 [1] | [M]
    nonfinite: torch.Tensor  # bool, like amax
    qs: torch.Tensor | None  # bf16 [M, K]: e2m1 * s_b (exact)
    deq: torch.Tensor | None  # bf16 [M, K]: the dequantized value (= NVFP4Tensor.dequantize(bf16))


def _bf16_words_ok(x: torch.Tensor, rbits: torch.Tensor | None) -> bool:
    return (
        x.dtype == torch.bfloat16
        and x.stride(1) == 1
        and x.stride(0) % 2 == 0
        and x.storage_offset() % 2 == 0
        and x.shape[1] % 16 == 0
        and (rbits is None or rbits.is_contiguous())
    )


#: launch geometry of the BF16 fast-path kernels (a benchmark may edit it in-process to sweep; the defaults
#: are used by the library). ``token_words_per_thread``: words held per thread in the per-token kernel;
#: ``token_program_words``: words per program for short rows (several rows per program).
BF16_CONFIG: dict[str, int] = {
    "token_words_per_thread": 16,
    # H200 sweeps: rows of K <= 2048 one (K = 2048) or a few per program: [4096, 2048] 11.2 instead of 14.6 us
    # at 2048 words; longer rows are unaffected (8192^2 0.063 ms). Every swept size is GPU byte-tested.
    "token_program_words": 1024,
    "tensor_block_m": 8,  # per-tensor 1x16: rows x blocks per program
    "tensor_nb": 32,
    "tensor_warps": 4,
    "tile16_nb": 32,  # per-tensor 16x16: 16 rows x tile16_nb blocks per program
    "tile16_warps": 4,  # H200 (block-major tiles): Qwen3-1.7B sync pass 1.08 ms; 8 warps 1.26, 2 warps 1.28
    "amax_rows": 32,  # amax pass: amax_rows x amax_block_w words per program, amax_block_m rows at a time
    "amax_block_m": 8,
    "amax_block_w": 512,
    "amax_warps": 8,
}


def _contig_aligned(t: torch.Tensor | None, align: int) -> bool:
    return t is not None and t.is_contiguous() and t.data_ptr() % align == 0


def _bf16_outputs_ok(out: QuantOut, write_packed: bool) -> bool:
    """The BF16 kernels store 8-byte code words and 16-byte qs/deq vectors: caller-provided buffers must be
    contiguous and aligned."""
    data, scales, _a, _nf, qs, deq = out
    if write_packed and not (_contig_aligned(data, 8) and _contig_aligned(scales, 1)):
        return False
    return all(t is None or _contig_aligned(t, 16) for t in (qs, deq))


@functools.lru_cache(maxsize=256)
def _token_geometry(
    kw: int, program_words: int, words_per_thread: int, split: bool = True
) -> tuple[int, int, int, int]:
    """(rows per program, blocks in the row's first segment, in its second (0: one segment), warps) of the BF16
    per-token kernel. Segments are powers of two; with ``split`` a row whose K/16 blocks are not one is held as
    two when that pads less (K = 2560: 128 + 32 blocks instead of 256; 9728: 512 + 128 instead of 1024).

    ``_launch_token`` splits only packed-only, round-to-nearest outputs. On the H200, [4096, K] packed:
    16.0 -> 14.2 us at K = 2560, 30.9 -> 26.6 at 6144, 63.3 -> 57.5 at 9728; but packed + deq (the learner's
    forward) went 82.6 -> 100.2 us at K = 9728 (128 registers per thread instead of 59) and did not change at
    2560 (benchmarks/RESULTS.md), so it keeps one tile."""
    nbk = kw // 8
    nb, nb2 = triton.next_power_of_2(nbk), 0
    if split and nb != nbk and nb > 1:
        second = triton.next_power_of_2(nbk - nb // 2)
        if nb // 2 + second < nb:
            nb, nb2 = nb // 2, second
    rows = max(1, program_words // ((nb + nb2) * 8))
    bm = min(16, 1 << (rows.bit_length() - 1))
    return bm, nb, nb2, max(1, min(16, bm * nb * 8 // (words_per_thread * 32)))


@functools.cache
def _launchers() -> tuple[CachedLauncher, CachedLauncher, CachedLauncher]:
    """(per-token, amax, per-tensor) launchers of the BF16 kernels (``launcher.py``)."""
    return (
        CachedLauncher(_quant_token_kernel_bf16),
        CachedLauncher(_amax_kernel_bf16),
        CachedLauncher(_quant_tensor_kernel_bf16),
    )


def _launch_token(ptrs: tuple, m: int, kw: int, stride_w: int, align4: bool, sr: bool, flags: tuple) -> None:
    """The BF16 per-token kernel (``BF16_CONFIG`` launch geometry). ``ptrs``: input, codes, scales, qs, deq,
    amax, nonfinite, random bits (the kernel addresses them as words / bytes whatever their element type);
    ``flags``: (write_packed, write_qs, write_deq)."""
    cfg = BF16_CONFIG
    bm, nb, nb2, warps = _token_geometry(
        kw,
        cfg["token_program_words"],
        cfg["token_words_per_thread"],
        split=not sr and flags == (True, False, False),
    )
    _launchers()[0](
        (triton.cdiv(m, bm),),
        *ptrs,
        m,
        kw,
        stride_w,
        BLOCK_M=bm,
        NB=nb,
        NB2=nb2,
        ALIGN4=align4,
        SR=sr,
        WRITE_PACKED=flags[0],
        WRITE_QS=flags[1],
        WRITE_DEQ=flags[2],
        RNE_INT=interpret_mode(),
        num_warps=warps,
    )


def quantize_token_deq_bf16(x: torch.Tensor) -> QuantOut:
    """``quantize_nvfp4_triton(x, per_token=True, write_deq=True)`` for the learner's fast lane
    (``modules/fast_lane.py``), whose plan guarantees the preconditions: ``x`` BF16 [M, K], contiguous, at an
    even element offset, M >= 1, K % 16 == 0 and K <= 16384. Same kernel, same outputs; only the checks and
    the generic dispatch are left out (``tests/minite_kernels/test_fast_lane.py`` compares the two)."""
    m, k = x.shape
    dev = x.device
    kw = k // 2
    data = torch.empty((m, kw), dtype=torch.uint8, device=dev)
    scales = torch.empty((m, k // 16), dtype=torch.float8_e4m3fn, device=dev)
    amax = torch.empty((m,), dtype=torch.float32, device=dev)
    nonfinite = torch.empty((m,), dtype=torch.bool, device=dev)
    deq = torch.empty((m, k), dtype=torch.bfloat16, device=dev)
    align4 = kw % 4 == 0 and x.data_ptr() % 16 == 0
    _launch_token(  # no qs, no random bits (amax stands in); no host views: the kernel casts the pointers
        (x, data, scales, amax, deq, amax, nonfinite, amax),
        m,
        kw,
        stride_w=kw,
        align4=align4,
        sr=False,
        flags=(True, False, True),
    )
    return QuantOut(data, scales, amax, nonfinite, None, deq)


def _launch_bf16(
    x: torch.Tensor,
    out: QuantOut,
    scales: torch.Tensor | None,
    per_token: bool,
    tile16: bool,
    rbits: torch.Tensor | None,
    write_packed: bool,
    write_qs: bool,
    write_deq: bool,
    scratch: torch.Tensor | None,
) -> None:
    data, _s, amax, nonfinite, qs, deq = out
    m, k = x.shape
    kw = k // 2
    sr = rbits is not None
    xw = x.view(torch.int32)
    stride_w = xw.stride(0)
    align4 = stride_w % 4 == 0 and xw.data_ptr() % 16 == 0
    dummy = amax
    rb = rbits.view(torch.int16) if sr else dummy
    dptr = data.view(torch.int32) if write_packed else dummy
    sptr = scales if write_packed else dummy
    qsw = qs.view(torch.int32) if write_qs else dummy
    deqw = deq.view(torch.int32) if write_deq else dummy
    rne_int = interpret_mode()
    cfg = BF16_CONFIG
    if per_token:  # the learner's hot path (one launch per linear input): keep its host work small
        ptrs = (xw, dptr, sptr, qsw, deqw, amax, nonfinite, rb)
        _launch_token(ptrs, m, kw, stride_w, align4, sr, (write_packed, write_qs, write_deq))
        return
    _, amax_launch, tensor_launch = _launchers()
    nbk = kw // 8
    if scratch is None:
        scratch = torch.zeros(2, dtype=torch.int32, device=x.device)
    else:
        scratch.zero_()
    arows, abm = cfg["amax_rows"], cfg["amax_block_m"]
    abw = min(cfg["amax_block_w"], max(8, triton.next_power_of_2(kw)))
    amax_launch(
        (triton.cdiv(m, arows), triton.cdiv(kw, abw)),
        xw,
        scratch,
        m,
        kw,
        stride_w,
        ALIGN4=align4,
        A_ROWS=arows,
        BLOCK_M=abm,
        BLOCK_W=abw,
        num_warps=cfg["amax_warps"],
    )
    if tile16:
        bm, nb, warps = 16, cfg["tile16_nb"], cfg["tile16_warps"]
    else:
        bm, nb, warps = cfg["tensor_block_m"], cfg["tensor_nb"], cfg["tensor_warps"]
    nb = min(nb, max(1, triton.next_power_of_2(nbk)))
    tensor_launch(
        (triton.cdiv(m, bm), triton.cdiv(nbk, nb)),
        xw,
        dptr,
        sptr,
        qsw,
        deqw,
        amax,
        nonfinite,
        scratch,
        rb,
        m,
        kw,
        stride_w,
        BLOCK_M=bm,
        NB=nb,
        ALIGN4=align4,
        TILE16=tile16,
        SR=sr,
        WRITE_PACKED=write_packed,
        WRITE_QS=write_qs,
        WRITE_DEQ=write_deq,
        RNE_INT=rne_int,
        num_warps=warps,
    )


def quantize_nvfp4_triton(
    x: torch.Tensor,
    *,
    per_token: bool,
    tile16: bool = False,
    rbits: torch.Tensor | None = None,
    write_packed: bool = True,
    write_qs: bool = False,
    write_deq: bool = False,
    out: QuantOut | None = None,
    scratch: torch.Tensor | None = None,
) -> QuantOut:
    """Quantize a 2-D float tensor along its last dim (see the module docstring).

    Preconditions (checked by callers): K % 16 == 0, M % 16 == 0 when ``tile16``, bf16/fp16/fp32 input,
    ``rbits`` uint8 [M, K] contiguous for stochastic rounding. ``out``/``scratch`` let a caller reuse buffers
    (CUDA-graph capture of weight sync). BF16 inputs with unit stride along K take the word-wise fast path
    (``quantize_bf16.py``); other dtypes and layouts the generic kernels.
    """
    m, k = x.shape
    dev = x.device
    nrow = m if per_token else 1
    fresh = out is None  # separate new allocations: contiguous and aligned
    if fresh:
        out = QuantOut(
            torch.empty((m, k // 2), dtype=torch.uint8, device=dev) if write_packed else None,
            torch.empty((m, k // 16), dtype=torch.uint8, device=dev) if write_packed else None,
            torch.empty((nrow,), dtype=torch.float32, device=dev),
            torch.empty((nrow,), dtype=torch.bool, device=dev),
            torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_qs else None,
            torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_deq else None,
        )
    data, scales, amax, nonfinite, qs, deq = out
    if scales is not None and scales.dtype != torch.uint8:
        scales = scales.view(torch.uint8)
    sr = rbits is not None
    dummy = amax
    if m == 0:
        if not per_token:
            amax.zero_()
            nonfinite.zero_()
        return _finish(out)
    if (
        _bf16_words_ok(x, rbits)
        and (not per_token or k // 2 <= 8192)
        and (fresh or _bf16_outputs_ok(out, write_packed))
    ):
        _launch_bf16(x, out, scales, per_token, tile16, rbits, write_packed, write_qs, write_deq, scratch)
        return _finish(out)
    # generic kernels (fp32 / fp16 / strided / CPU interpreter)
    if per_token:
        bm = 4 if m >= 4096 else (2 if m >= 512 else 1)
        bk = 256 if k >= 256 else max(16, triton.next_power_of_2(k))
        _quantize_per_token_kernel[(triton.cdiv(m, bm),)](
            x,
            data if write_packed else dummy,
            scales if write_packed else dummy,
            qs if write_qs else dummy,
            amax,
            rbits if sr else dummy,
            m,
            k,
            x.stride(0),
            x.stride(1),
            BLOCK_M=bm,
            BLOCK_K=bk,
            SR=sr,
            WRITE_PACKED=write_packed,
            WRITE_QS=write_qs,
            num_warps=4,
        )
    else:
        if scratch is None:
            scratch = torch.zeros(2, dtype=torch.int32, device=dev)
        else:
            scratch.zero_()
        launch_amax(x, scratch)
        bm = 16 if tile16 else 8
        bk = 256 if k >= 256 else max(16, triton.next_power_of_2(k))
        grid = (triton.cdiv(m, bm), triton.cdiv(k, bk))
        _quantize_per_tensor_kernel[grid](
            x,
            data if write_packed else dummy,
            scales if write_packed else dummy,
            qs if write_qs else dummy,
            amax,
            scratch,
            rbits if sr else dummy,
            m,
            k,
            x.stride(0),
            x.stride(1),
            BLOCK_M=bm,
            BLOCK_K=bk,
            TILE16=tile16,
            SR=sr,
            WRITE_PACKED=write_packed,
            WRITE_QS=write_qs,
            num_warps=4,
        )
    nonfinite.copy_(torch.isnan(amax))
    if write_deq:
        if write_packed:
            deq.copy_(dequantize_nvfp4_triton(data, scales, amax, per_token=per_token, dtype=torch.bfloat16))
        else:
            raise ValueError("write_deq on the generic path needs write_packed=True")
    return _finish(out)


def _finish(out: QuantOut) -> QuantOut:
    if out.scales is not None and out.scales.dtype != torch.float8_e4m3fn:
        out = out._replace(scales=out.scales.view(torch.float8_e4m3fn))
    return out


def dequantize_nvfp4_triton(
    data: torch.Tensor,
    scales: torch.Tensor,
    amax: torch.Tensor | None,
    *,
    per_token: bool,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantize packed NVFP4 ([M, K/2] u8, [M, K/16] e4m3, amax) to ``dtype`` [M, K]; with ``amax=None``
    return the exact ``qs = e2m1 * s_b`` operand (no outer scale)."""
    m, kh = data.shape
    k = kh * 2
    if interpret_mode() and dtype != torch.float32 and amax is not None:
        # the CPU interpreter truncates fp32 -> bf16/fp16 stores; round in torch instead (GPU stores round)
        return dequantize_nvfp4_triton(data, scales, amax, per_token=per_token).to(dtype)
    out = torch.empty((m, k), dtype=dtype, device=data.device)
    if m == 0:
        return out
    bm, bk = 8, 256 if k >= 256 else max(16, triton.next_power_of_2(k))
    grid = (triton.cdiv(m, bm), triton.cdiv(k, bk))
    _dequantize_kernel[grid](
        data,
        scales.view(torch.uint8),
        amax if amax is not None else out,
        out,
        m,
        k,
        PER_TOKEN=per_token,
        APPLY_AMAX=amax is not None,
        BLOCK_M=bm,
        BLOCK_K=bk,
        num_warps=4,
    )
    return out

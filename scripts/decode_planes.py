"""The first packed-FP4 decode formulation, kept as the benchmarks' baseline (``scripts/bench_decode.py``,
``scripts/bench_kernels.py``, ``scripts/kernel_asm.py``); the library runs the pair kernel
(``minite_kernels/backends/triton/decode.py``: ``decode_linear_pairs``).

Same contract as the library's decode kernels (report §2.2 / §5.1, ``decode_kernels.py``)::

    y[b, n] = Σ_k (q_x s_x)[b, k] · (q_w s_w)[n, k] · amax_x[b] · amax_w / 2688²

with the weight read as packed E2M1 words (8 codes per int32) and E4M3 block scales. Nibble ``i`` of a word
becomes the fp16 ``e2m1 * 2^-14`` by bit placement (``_fp16_plane``); the scale byte becomes ``s * 2^-8``
(``decode_kernels._fp16_scale``).

- FMA path (B <= 4 rows): one fp32 product per nibble, the 8 planes of a word summed, times the word's block
  scale; accumulated in fp32 (``acc = y * 2^-22``).
- Tensor-core path (B > 4): ``w16 = plane * (s * 2^7)`` is the exact ``q * s_b * 2^-7`` in fp16, the
  activations ``qs_x`` are exact in fp16 (<= 5 significant bits, range [2^-10, 2688]); FP32 accumulate.
- ``x_perm``: the activations in plane-major order ``[B, 8, K/8]`` (``permute_for_decode``), written directly
  by :func:`quantize_planes`; ``one_dot``: all 8 planes as one MMA operand.
- Split-K as the library's kernels (``decode_kernels._splitk_finish``).

The pair kernel does about half of this formulation's instructions per weight in the K loop
(``scripts/kernel_asm.py`` counts them; benchmarks/RESULTS.md, issue #6).

Worked example: K = 16, x = w = ones: amax 1, s_b 448, q = 6 for both; acc = 16 * 2688²; y = 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_kernels.backends.triton._common import interpret_mode
from minite_kernels.backends.triton.decode import _split_k, _workspace, decode_quant_outputs
from minite_kernels.backends.triton.decode_kernels import (
    INV_2688_SQ_C,
    _fp16_scale,
    _splitk_finish,
    _store_four_rows,
)
from minite_kernels.backends.triton.nvfp4_jit import _block_scale, _e2m1_rn, _encode_scale
from minite_kernels.backends.triton.offline import DECODE_COMMON_TYPES
from minite_kernels.backends.triton.quantize import QuantOut

#: argument types of ``_decode_linear_kernel`` for ``minite_kernels.backends.triton.offline.compile_offline``,
#: with the activations as :func:`quantize_planes` writes them (fp16 ``qs``)
DECODE_PLANES_TYPES = {"x_ptr": "*fp16", "kw_per_split": "i32", **DECODE_COMMON_TYPES}


@triton.jit
def _fp16_plane(wd, NIB: tl.constexpr):
    """Nibble ``NIB`` of every int32 word as an fp16 of value ``e2m1 * 2^-14``: the code's sign goes to bit 15
    and its magnitude bits ``e1 e0 m`` to bits 11..9 (exponent low bits + first mantissa bit). Codes with
    ``e = 0`` land on fp16 subnormals (``0.5 -> 2^-15``), which fp16 arithmetic keeps exactly. Two shifts and
    one three-input logic op per value instead of a compare/select chain."""
    if 4 * NIB >= 9:
        mag = (wd >> (4 * NIB - 9)) & 0x0E00
    else:
        mag = (wd << (9 - 4 * NIB)) & 0x0E00
    if 4 * NIB >= 12:
        sgn = (wd >> (4 * NIB - 12)) & 0x8000
    else:
        sgn = (wd << (12 - 4 * NIB)) & 0x8000
    return (mag | sgn).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _row_partial(wd, s, x_ptr, r, K, kw, kmask, B, X_PERM: tl.constexpr):
    """Σ over the 8 nibbles of every word of ``w * x[r]`` (fp32 [BN, BKW], still times ``2^-22``)."""
    KW = K // 8
    xmask = kmask & (r < B)
    p = tl.zeros(wd.shape, dtype=tl.float32)
    for i in tl.static_range(8):
        if X_PERM:
            xi = tl.load(x_ptr + r * K + i * KW + kw, mask=xmask, other=0.0)
        else:
            xi = tl.load(x_ptr + r * K + kw * 8 + i, mask=xmask, other=0.0)
        p += _fp16_plane(wd, i).to(tl.float32) * xi.to(tl.float32)[None, :]
    return p * s


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
    kw_per_split,
    BLOCK_N: tl.constexpr,
    BLOCK_KW: tl.constexpr,
    BLOCK_B: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr,
    X_PERM: tl.constexpr,
    ONE_DOT: tl.constexpr = False,
):
    """Bit-trick decode (``_fp16_plane``/``_fp16_scale``).

    FMA path (B <= 4): one 2-D accumulator per activation row in the layout the weight words are loaded in
    (a 3-D [BN, B, BKW] product made Triton move every decoded plane through shared memory); the 8 nibbles
    of a word are multiplied with their activations in fp32 and summed, then the word's block scale
    multiplies that partial sum (``acc = y * 2^-22``).

    Tensor-core path: ``w16 = plane * (s * 2^7)`` is the exact ``q * s_b * 2^-7`` in fp16 (normal range
    [2^-17, 21]); the activations ``qs_x`` are exact in fp16 too (<= 5 significant bits, range
    [2^-10, 2688]); FP32 accumulate (``acc = y * 2^-7``)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    KW = K // 8
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    kw_start = pid_k * kw_per_split
    wa = tl.load(wamax_ptr)
    if USE_DOT:
        offs_b = tl.arange(0, BLOCK_B)
        bmask = offs_b < B
        acc = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
        for kk in range(0, kw_per_split, BLOCK_KW):
            kw = kw_start + kk + tl.arange(0, BLOCK_KW)
            kmask = kw < KW
            wmask = nmask[:, None] & kmask[None, :]
            wd = tl.load(w_ptr + offs_n[:, None] * KW + kw[None, :], mask=wmask, other=0)
            sb = tl.load(ws_ptr + offs_n[:, None] * (K // 16) + (kw // 2)[None, :], mask=wmask, other=0)
            s16 = _fp16_scale(sb.to(tl.int32)) * 32768.0  # s * 2^7 <= 57344: exact in fp16
            xmask = bmask[:, None] & kmask[None, :]
            if ONE_DOT:  # all 8 planes as one [BN, 8*BKW] operand, K ordered plane-major like x_perm's rows
                planes = tl.arange(0, 8)
                c = (wd[:, None, :] >> (4 * planes)[None, :, None]) & 15
                h = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)
                w16 = tl.reshape(h * s16[:, None, :], [BLOCK_N, 8 * BLOCK_KW])
                xi = tl.load(
                    x_ptr + offs_b[:, None, None] * K + (planes * KW)[None, :, None] + kw[None, None, :],
                    mask=xmask[:, None, :],
                    other=0.0,
                )
                xi = tl.reshape(xi, [BLOCK_B, 8 * BLOCK_KW])
                if DOT_F32:
                    acc = tl.dot(w16.to(tl.float32), tl.trans(xi.to(tl.float32)), acc)
                else:
                    acc = tl.dot(w16, tl.trans(xi.to(tl.float16)), acc)
            for i in tl.static_range(0 if ONE_DOT else 8):
                if X_PERM:  # x given as [B, 8, K/8]: plane i of the words is a contiguous row
                    xi = tl.load(x_ptr + offs_b[:, None] * K + i * KW + kw[None, :], mask=xmask, other=0.0)
                else:
                    xi = tl.load(x_ptr + offs_b[:, None] * K + (kw * 8 + i)[None, :], mask=xmask, other=0.0)
                w16 = _fp16_plane(wd, i) * s16
                if DOT_F32:  # Triton's CPU interpreter mis-handles 16-bit dots
                    acc = tl.dot(w16.to(tl.float32), tl.trans(xi.to(tl.float32)), acc)
                else:
                    acc = tl.dot(w16, tl.trans(xi.to(tl.float16)), acc)
        xa = tl.load(xamax_ptr + offs_b, mask=bmask, other=0.0)
        res = (acc * (128.0 * INV_2688_SQ_C)) * (xa[None, :] * wa)
        omask = nmask[:, None] & bmask[None, :]
        if SPLIT == 1:
            tl.store(
                out_ptr + offs_b[None, :] * N + offs_n[:, None], res.to(out_ptr.dtype.element_ty), mask=omask
            )
        else:
            tl.store(part_ptr + (pid_k * BLOCK_B + offs_b[None, :]) * N + offs_n[:, None], res, mask=omask)
    else:
        acc0 = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
        for kk in range(0, kw_per_split, BLOCK_KW):
            kw = kw_start + kk + tl.arange(0, BLOCK_KW)
            kb = (kw_start + kk) // 2 + tl.arange(0, BLOCK_KW // 2)
            kmask = kw < KW
            wd = tl.load(
                w_ptr + offs_n[:, None] * KW + kw[None, :], mask=nmask[:, None] & kmask[None, :], other=0
            )
            sb2 = tl.load(
                ws_ptr + offs_n[:, None] * (K // 16) + kb[None, :],
                mask=nmask[:, None] & (kb < K // 16)[None, :],
                other=0,
            )
            # the tile's block scales as [BN, BKW/2] contiguous bytes, each repeated for its two words (join +
            # reshape): that lands them in the words' register layout. Loaded per word (address kw // 2) they
            # got a layout of their own, and Triton moved every row's partial sum into it through shared
            # memory each iteration (scripts/kernel_asm.py: 1, 2, 4 conversions per iteration at B = 1, 2, 4)
            sb2 = _fp16_scale(sb2.to(tl.int32)).to(tl.float32)
            s = tl.reshape(tl.join(sb2, sb2), [BLOCK_N, BLOCK_KW])
            acc0 += _row_partial(wd, s, x_ptr, 0, K, kw, kmask, B, X_PERM)
            if BLOCK_B > 1:
                acc1 += _row_partial(wd, s, x_ptr, 1, K, kw, kmask, B, X_PERM)
            if BLOCK_B > 2:
                acc2 += _row_partial(wd, s, x_ptr, 2, K, kw, kmask, B, X_PERM)
                acc3 += _row_partial(wd, s, x_ptr, 3, K, kw, kmask, B, X_PERM)
        post = wa * (4194304.0 * INV_2688_SQ_C)
        _store_four_rows(
            acc0,
            acc1,
            acc2,
            acc3,
            post,
            xamax_ptr,
            out_ptr,
            part_ptr,
            offs_n,
            nmask,
            pid_k,
            N,
            B,
            BLOCK_B,
            SPLIT,
        )
    if SPLIT > 1:
        _splitk_finish(out_ptr, part_ptr, cnt_ptr, pid_n, offs_n, nmask, N, B, BLOCK_N, BLOCK_B, SPLIT)


@triton.jit
def _decode_act_quant_kernel(
    x_ptr,
    qsp_ptr,
    data_ptr,
    scales_ptr,
    amax_ptr,
    nonfinite_ptr,
    K,
    stride_x,
    NB: tl.constexpr,
):
    """One activation row per program, held whole in registers as [NB, 16] blocks: per-token NVFP4
    quantization with the quantizer's arithmetic (``nvfp4_jit.py``), writing the packed bytes, scales, amax
    and nonfinite flag exactly as ``quantize_nvfp4_triton`` does, plus ``qs`` in the decode kernel's
    plane-major layout (``qs_perm[r, k % 8, k // 8] = qs[r, k]``)."""
    r = tl.program_id(0)
    blk = tl.arange(0, NB)
    k = blk[:, None] * 16 + tl.arange(0, 16)[None, :]
    m = k < K
    x = tl.load(x_ptr + r * stride_x + k, mask=m, other=0.0).to(tl.float32)
    bmax_bits = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    abits = tl.max(bmax_bits, axis=0)
    bad = abits >= 0x7F800000  # inf/NaN: the row's amax is NaN, its codes 0 and scale bytes 0x7F
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    s_enc, s_dec = _encode_scale(amax)
    vmax = tl.where(bad, 0, bmax_bits).to(tl.float32, bitcast=True)
    s_b, sbyte, enc = _block_scale(vmax, s_enc, s_dec)
    y = tl.where(bad, 0.0, x) * enc[:, None]
    c4, mag = _e2m1_rn(tl.minimum(tl.abs(y), 6.0), y)  # signed code, magnitude
    val = mag * s_b[:, None]
    val = tl.where(y < 0.0, val * -1.0, val)  # -0.0 for negative values rounded to 0, as the quantizer
    KW = K // 8
    tl.store(qsp_ptr + r * K + (k % 8) * KW + k // 8, val.to(tl.float16), mask=m)
    lo, hi = tl.split(tl.reshape(c4, [NB, 8, 2]))
    kb = blk[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(data_ptr + r * (K // 2) + kb, (lo | (hi << 4)).to(tl.uint8), mask=kb < K // 2)
    tl.store(scales_ptr + r * (K // 16) + blk, tl.where(bad, 0x7F, sbyte).to(tl.uint8), mask=blk < K // 16)
    tl.store(amax_ptr + r, tl.where(bad, float("nan"), amax))
    tl.store(nonfinite_ptr + r, bad)


def decode_linear(
    x_qs: torch.Tensor,
    x_amax: torch.Tensor,
    w_data: torch.Tensor,
    w_scales: torch.Tensor,
    w_amax: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    split: int | None = None,
    block_n: int | None = None,
    block_kw: int | None = None,
    num_warps: int = 4,
    x_perm: bool = False,
    one_dot: bool = False,
) -> torch.Tensor:
    """``y [B, N]`` from per-token-quantized activations (``x_qs`` bf16 or fp16 [B, K] = e2m1 * s_b, exact
    in both; ``x_amax`` fp32 [B]) and a packed per-tensor NVFP4 weight (``w_data`` u8 [N, K/2],
    ``w_scales`` e4m3/u8 [N, K/16], ``w_amax`` [1]).

    ``x_perm=True``: ``x_qs`` is ``permute_for_decode(qs)`` [B, 8, K/8] (or :func:`quantize_planes`' ``qs``).
    K must be a multiple of 16 and ``w_data`` contiguous (it is read as int32 words)."""
    if one_dot and not x_perm:
        raise ValueError("decode_linear(one_dot=True) needs x_perm=True (the plane-major activation layout)")
    if x_perm:
        if x_qs.dim() != 3 or x_qs.shape[1] != 8:
            raise ValueError(f"decode_linear(x_perm=True) takes x as [B, 8, K/8]; got {tuple(x_qs.shape)}")
        b, k = x_qs.shape[0], 8 * x_qs.shape[2]
    else:
        b, k = x_qs.shape
    n = w_data.shape[0]
    if k % 16 or not w_data.is_contiguous() or not x_qs.is_contiguous():
        raise ValueError(f"decode_linear needs K % 16 == 0 and contiguous operands; got K={k}")
    if w_data.shape[1] * 2 != k:
        raise ValueError(
            f"decode_linear: x has K={k} but the packed weight {tuple(w_data.shape)} has "
            f"K={2 * w_data.shape[1]}"
        )
    use_dot = b > 4
    out = torch.empty((b, n), dtype=out_dtype, device=x_qs.device)
    if b == 0 or n == 0:
        return out
    bb = max(16, triton.next_power_of_2(b)) if use_dot else triton.next_power_of_2(b)
    # defaults from the H200 block-size sweep (scripts/bench_kernels.py --decode-sweep, benchmarks/RESULTS.md)
    big = n * k >= (1 << 24)
    bn = block_n or ((128 if big else 64) if use_dot else 8)
    kw = k // 8
    bkw = min(block_kw or ((32 if big else 16) if use_dot else 64), triton.next_power_of_2(kw))
    nblocks = triton.cdiv(n, bn)
    split, kw_per_split = _split_k(x_qs.device, split, nblocks, kw, bkw)
    part, cnt = _workspace(x_qs.device, split, bb, n, nblocks) if split > 1 else (out, out)
    _decode_linear_kernel[(nblocks, split)](
        x_qs,
        x_amax,
        w_data.view(torch.int32),
        w_scales.view(torch.uint8),
        w_amax,
        out,
        part,
        cnt,
        b,
        n,
        k,
        kw_per_split,
        BLOCK_N=bn,
        BLOCK_KW=bkw,
        BLOCK_B=bb,
        SPLIT=split,
        USE_DOT=use_dot,
        DOT_F32=interpret_mode(),
        num_warps=num_warps,
        X_PERM=x_perm,
        ONE_DOT=one_dot and use_dot,
    )
    return out


def permute_for_decode(x: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` -> ``[B, 8, K/8]`` with ``out[b, i, j] = x[b, 8j + i]``: the activation layout of
    ``decode_linear(x_perm=True)`` (nibble plane ``i`` of the packed weight words meets a contiguous row)."""
    b, k = x.shape
    return x.view(b, k // 8, 8).transpose(1, 2).contiguous()


def quantize_planes(x: torch.Tensor) -> tuple[QuantOut, torch.Tensor]:
    """Per-token NVFP4 quantization of a few activation rows (``x`` [B, K], K % 16 == 0, unit stride along K)
    for :func:`decode_linear`: the usual outputs (``data``, ``scales``, ``amax``, ``nonfinite``; bytes identical
    to ``quantize_nvfp4_triton(x, per_token=True)``) and ``qs`` already in the plane-major layout [B, 8, K/8]
    (``decode_linear(..., x_perm=True)``), in one launch. ``qs`` is stored in fp16, where it is exact like in
    bf16 (<= 5 significant bits, magnitudes in [2^-10, 2688]): the tensor-core path then feeds it to the MMA
    straight from its asynchronous copy into shared memory (``scripts/kernel_asm.py``: 8 instead of 16
    shared-memory stores per loop iteration)."""
    out = decode_quant_outputs(x, "quantize_planes")
    b, k = x.shape
    qsp = torch.empty((b, 8, k // 8), dtype=torch.float16, device=x.device)
    if b:
        nb = triton.next_power_of_2(k // 16)
        _decode_act_quant_kernel[(b,)](
            x,
            qsp,
            out.data,
            out.scales,
            out.amax,
            out.nonfinite,
            k,
            x.stride(0),
            NB=nb,
            num_warps=4 if nb <= 256 else 8,
        )
    return out._replace(scales=out.scales.view(torch.float8_e4m3fn)), qsp

"""Packed-FP4 decode linear (W4A4 at small batch), the kernels: weights stay packed at 4.5 bits/parameter.
Their host launchers are in ``decode.py``.

Report §2.2 / §5.1; the same contract as the W4A4 GEMM (``gemm.py``, notes §1.4, §2)::

    y[b, n] = Σ_k (q_x s_x)[b, k] · (q_w s_w)[n, k] · amax_x[b] · amax_w / 2688²

``x`` is quantized per token (``qs_x = e2m1 * s_b``, exact in BF16 and in fp16); the weight is read as
packed E2M1 bytes ``[N, K/2]`` + E4M3 scales ``[N, K/16]`` (0.5625 bytes/parameter, 2 for BF16) as int32
words of 8 codes.

Decode: nibble ``i`` of every word becomes an fp16 by bit placement alone -- sign to bit 15, the three
magnitude bits ``e1 e0 m`` to bits 11..9 -- whose value is exactly ``e2m1 * 2^-14`` (codes with ``e = 0`` land
on fp16 subnormals, which fp16 arithmetic keeps); the E4M3 scale byte's 7 magnitude bits shifted to bits
13..7 give ``s * 2^-8`` the same way. Two shifts and one logic op per value instead of a compare/select
chain (which is slower on the H200); the powers of two go to the epilogue.

``decode_linear_pairs`` (what the backend runs, up to ``DECODE_MAX_ROWS`` = 4 rows): the activation comes
as its E2M1 codes in fp16 (``q_x``, exact) laid out as *pair words* ``[B, 8, K/16]`` int32
(``pairs_for_decode``; written by ``quantize_for_decode(x)`` in one launch). Nibbles ``j`` and ``j + 4`` of a
weight word are placed into the two fp16 halves of one register with one shift pair and two logic ops, and
meet the activation pair word with one packed ``fma.rn.f16x2`` (inline PTX). The 16 products of a block are
summed in fp16 *exactly*: each lane adds 8 products ``(q_w 2^-14)(q_x)``, which are multiples of 2^-16 with
``|q_w q_x| <= 36``, so every partial sum is an integer times 2^-16 below ``8 * 36 * 4 = 1152 < 2048`` units,
which fp16 represents exactly (its spacing below 2^-5 is <= 2^-16). The two lanes are then added in fp32 and
multiplied by ``s_w s_x 2^-16`` (11 x 8 significant bits: exact), and only the accumulation over blocks rounds
(fp32). About 4 SASS instructions per weight and row in the K loop at batch 1, half of the first
formulation's (one fp32 product per nibble; ``scripts/decode_planes.py`` keeps it as the benchmarks' baseline,
``scripts/kernel_asm.py`` counts both). Under Triton's interpreter (no PTX) the same exact sums are formed in
fp32.

Split-K when ``N / BLOCK_N`` programs would leave SMs idle: each split writes an FP32 partial and the last to
arrive (an atomic counter per row block, reset by that program: no memset) sums them in a fixed order.

The small and long-K projections are latency-bound (a launch needs ~2-3 us before its loads arrive): they
take narrow tiles and, at one row, a K loop double-buffered in registers (``prefetch``). Per-linear timings
that repeat one weight keep a packed weight (<= 14 MB) in the 50 MB L2 and flatter the kernel, so the
benchmarks time whole blocks with weights from HBM (``benchmarks/RESULTS.md``, issue #6).

Programmatic dependent launch (``pdl=True`` / ``MINITE_TRITON_PDL=on``, sm_90+, off by default): the
pair-word quantizer and the pair kernel let the next launch start at once, and the kernel loads its first
weight tile (with ``prefetch``) and asks the L2 for the rest before it waits for the activations. That saved 4 us per block
while the weights fit the L2, and nothing from HBM.

Pair worked example: w = [6, -0.5, 0, 0, 1, 0, 0, 0] (codes 7, 9, 0, 0, 2, 0, 0, 0: word 0x00020097),
x codes [1, 1, 0, 0, 2, 0, 0, 0]. Pair 0 meets (x0, x4) = (1, 2): lanes 6 * 2^-14 * 1 and 1 * 2^-14 * 2;
pair 1 meets (x1, x5) = (1, 0): -0.5 * 2^-14; sum 7.5 * 2^-14 = (6 - 0.5 + 2) * 2^-14.

Worked example: K = 16, x = w = ones: amax 1, s_b 448, q = 6 for both; acc = 16 * 2688²; y = 16.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import INV_2688_SQ
from .nvfp4_jit import _block_scale, _e2m1_rn, _encode_scale
from .pdl_jit import _prefetch_l2, gdc_launch_dependents, gdc_wait

INV_2688_SQ_C = tl.constexpr(INV_2688_SQ)


@triton.jit
def _splitk_finish(
    out_ptr,
    part_ptr,
    cnt_ptr,
    pid_n,
    offs_n,
    nmask,
    N,
    B,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """After this program stored its FP32 partial: the last of the SPLIT programs of a row block to arrive
    (atomic counter, acquire-release) sums the partials in split order and resets the counter."""
    offs_b = tl.arange(0, BLOCK_B)
    omask = nmask[:, None] & (offs_b < B)[None, :]
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
    if arrived == SPLIT - 1:
        tot = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
        for s_idx in tl.static_range(SPLIT):
            pp = part_ptr + (s_idx * BLOCK_B + offs_b[None, :]) * N + offs_n[:, None]
            tot += tl.load(pp, mask=omask, other=0.0, cache_modifier=".cg")
        tl.store(
            out_ptr + offs_b[None, :] * N + offs_n[:, None], tot.to(out_ptr.dtype.element_ty), mask=omask
        )
        tl.atomic_xchg(cnt_ptr + pid_n, 0)


@triton.jit
def _fp16_scale(sb):
    """E4M3 scale byte (non-negative; int32) as an fp16 of value ``s * 2^-8``: the byte's 7 magnitude bits
    shifted to fp16 bits 13..7 (E4M3 subnormals map to fp16 subnormals, exactly)."""
    return ((sb & 0x7F) << 7).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _store_row(acc, r, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B,
               BLOCK_B: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """Row ``r`` of the output (or of this program's split-K partial): its [BN, BKW] accumulator summed
    along K, times ``post`` and the row's activation amax."""
    m = nmask & (r < B)
    res = tl.sum(acc, axis=1) * post * tl.load(xamax_ptr + r, mask=r < B, other=0.0)
    if SPLIT == 1:
        tl.store(out_ptr + r * N + offs_n, res.to(out_ptr.dtype.element_ty), mask=m)
    else:
        tl.store(part_ptr + (pid_k * BLOCK_B + r) * N + offs_n, res, mask=m)


@triton.jit
def _store_four_rows(a0, a1, a2, a3, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B,
                     BLOCK_B: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """The FMA paths' epilogue for their (up to) four activation rows."""
    _store_row(a0, 0, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B, BLOCK_B, SPLIT)
    if BLOCK_B > 1:
        _store_row(a1, 1, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B, BLOCK_B, SPLIT)
    if BLOCK_B > 2:
        _store_row(a2, 2, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B, BLOCK_B, SPLIT)
        _store_row(a3, 3, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B, BLOCK_B, SPLIT)


# --- packed fp16x2 products (``decode_linear_pairs``) -----------------------------------------------------

#: pair ``j`` (0..3) of an int32 weight word: nibbles ``j`` (low fp16 half) and ``j + 4`` (high half), each as
#: ``e2m1 * 2^-14`` (sign -> bit 15/31, ``e1 e0 m`` -> bits 9..11 / 25..27); words ``$8`` and ``$9`` -> ``$0..$7``
_PAIRS_ASM = tl.constexpr(
    "\n".join(
        ["{", ".reg .b32 t, u;"]
        + [
            f"{'shl' if j < 3 else 'shr'}.b32 t, ${8 + w}, {abs(9 - 4 * j)};\n"
            + "and.b32 t, t, 0x0E000E00;\n"
            + (f"shl.b32 u, ${8 + w}, {12 - 4 * j};\n" if j < 3 else f"mov.b32 u, ${8 + w};\n")
            + "and.b32 u, u, 0x80008000;\n"
            + f"or.b32 ${4 * w + j}, t, u;"
            for w in range(2)
            for j in range(4)
        ]
        + ["}"]
    )
)

#: one 16-value block of one activation row: ``Σ q_w 2^-14 · q_x`` over 8 fp16x2 products (``$1..$8`` the
#: decoded pairs, ``$9..$16`` the activation pairs), the two fp16 lanes added in fp32 -> ``$0``
_BLOCK_DOT_ASM = tl.constexpr(
    "\n".join(
        ["{", ".reg .b32 a;", ".reg .b16 lo, hi;", ".reg .f32 fl, fh;", "mul.rn.f16x2 a, $1, $9;"]
        + [f"fma.rn.f16x2 a, ${1 + i}, ${9 + i}, a;" for i in range(1, 8)]
        + ["mov.b32 {lo, hi}, a;", "cvt.f32.f16 fl, lo;", "cvt.f32.f16 fh, hi;", "add.f32 $0, fl, fh;", "}"]
    )
)


@triton.jit
def _half_lanes(v):
    """The two fp16 lanes of int32 words, as fp32."""
    lo = (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = ((v >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pair(w, J: tl.constexpr):
    """Pair ``J`` of the words ``w`` as two fp16 lanes in an int32 (what ``_PAIRS_ASM`` computes)."""
    if J < 3:
        mag = (w << (9 - 4 * J)) & 0x0E000E00
        sgn = (w << (12 - 4 * J)) & -2147450880  # 0x80008000 as int32
    else:
        mag = (w >> 3) & 0x0E000E00
        sgn = w & -2147450880
    return mag | sgn


@triton.jit
def _block_dot(h0, h1, h2, h3, h4, h5, h6, h7, x0, x1, x2, x3, x4, x5, x6, x7, INTERP: tl.constexpr):
    if INTERP:  # the interpreter runs no PTX: the same exact products and sums, in fp32
        a = tl.zeros(h0.shape, dtype=tl.float32)
        for h, x in ((h0, x0), (h1, x1), (h2, x2), (h3, x3), (h4, x4), (h5, x5), (h6, x6), (h7, x7)):
            hl, hh = _half_lanes(h)
            xl, xh = _half_lanes(x)
            a += hl * xl + hh * xh
        return a
    else:
        return tl.inline_asm_elementwise(
            _BLOCK_DOT_ASM,
            "=f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
            [h0, h1, h2, h3, h4, h5, h6, h7, x0, x1, x2, x3, x4, x5, x6, x7],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )


@triton.jit
def _weight_tile(w_ptr, ws_ptr, offs_n, nmask, kb0, live, K, BLOCK_KB: tl.constexpr):
    """The packed words ``[BN, 2 BKB]`` and scale bytes ``[BN, BKB]`` of blocks ``kb0 ...`` (nothing is read
    where ``live`` is false: the register prefetch past the split's last tile)."""
    KB = K // 16
    kb = kb0 + tl.arange(0, BLOCK_KB)
    kw = 2 * kb0 + tl.arange(0, 2 * BLOCK_KB)
    wd = tl.load(
        w_ptr + offs_n[:, None] * (K // 8) + kw[None, :],
        mask=nmask[:, None] & ((kw < K // 8) & live)[None, :],
        other=0,
    )
    sb = tl.load(
        ws_ptr + offs_n[:, None] * KB + kb[None, :],
        mask=nmask[:, None] & ((kb < KB) & live)[None, :],
        other=0,
    )
    return wd, sb


@triton.jit
def _act_tile(xp_ptr, xs_ptr, r, kb0, live, K, B, BLOCK_KB: tl.constexpr):
    """Row ``r``'s 8 pair words and scale bytes of blocks ``kb0 ...`` (1-D over the blocks)."""
    KB = K // 16
    kb = kb0 + tl.arange(0, BLOCK_KB)
    m = (kb < KB) & (r < B) & live
    xr = xp_ptr + r * (K // 2) + kb  # x as [B, 8, K/16]: pair word c of every block is a contiguous row
    return (
        tl.load(xr, mask=m, other=0),
        tl.load(xr + KB, mask=m, other=0),
        tl.load(xr + 2 * KB, mask=m, other=0),
        tl.load(xr + 3 * KB, mask=m, other=0),
        tl.load(xr + 4 * KB, mask=m, other=0),
        tl.load(xr + 5 * KB, mask=m, other=0),
        tl.load(xr + 6 * KB, mask=m, other=0),
        tl.load(xr + 7 * KB, mask=m, other=0),
        tl.load(xs_ptr + r * KB + kb, mask=m, other=0),
    )


@triton.jit
def _act_tiles(xp_ptr, xs_ptr, kb0, live, K, B, BLOCK_KB: tl.constexpr, BLOCK_B: tl.constexpr):
    """``_act_tile`` for rows 0 .. BLOCK_B - 1 as four tiles (rows past BLOCK_B repeat row 0, unread)."""
    xa0 = _act_tile(xp_ptr, xs_ptr, 0, kb0, live, K, B, BLOCK_KB)
    xa1 = xa0
    xa2 = xa0
    xa3 = xa0
    if BLOCK_B > 1:
        xa1 = _act_tile(xp_ptr, xs_ptr, 1, kb0, live, K, B, BLOCK_KB)
    if BLOCK_B > 2:
        xa2 = _act_tile(xp_ptr, xs_ptr, 2, kb0, live, K, B, BLOCK_KB)
        xa3 = _act_tile(xp_ptr, xs_ptr, 3, kb0, live, K, B, BLOCK_KB)
    return xa0, xa1, xa2, xa3


@triton.jit
def _decode_words(wd, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, INTERP: tl.constexpr):
    """The 8 fp16x2 pair registers of every block of a ``[BN, 2 BKB]`` word tile (``_PAIRS_ASM``)."""
    w0, w1 = tl.split(tl.reshape(wd, [BLOCK_N, BLOCK_KB, 2]))
    if INTERP:
        return (
            _pair(w0, 0),
            _pair(w0, 1),
            _pair(w0, 2),
            _pair(w0, 3),
            _pair(w1, 0),
            _pair(w1, 1),
            _pair(w1, 2),
            _pair(w1, 3),
        )
    else:
        return tl.inline_asm_elementwise(
            _PAIRS_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w0, w1], dtype=(tl.int32,) * 8, is_pure=True, pack=1
        )


@triton.jit
def _row_block_dots(hs, xa, BN: tl.constexpr, BKB: tl.constexpr, INTERP: tl.constexpr):
    """One row: Σ over each block of ``q_w 2^-14 · q_x`` (fp32 [BN, BKB], exact) times ``s_x 2^-8``, from the
    decoded weight pairs ``hs`` and the row's activation tile ``xa`` (``_act_tile``)."""
    h0, h1, h2, h3, h4, h5, h6, h7 = hs
    x0, x1, x2, x3, x4, x5, x6, x7, xs = xa
    p = _block_dot(
        h0,
        h1,
        h2,
        h3,
        h4,
        h5,
        h6,
        h7,
        tl.broadcast_to(x0[None, :], [BN, BKB]),
        tl.broadcast_to(x1[None, :], [BN, BKB]),
        tl.broadcast_to(x2[None, :], [BN, BKB]),
        tl.broadcast_to(x3[None, :], [BN, BKB]),
        tl.broadcast_to(x4[None, :], [BN, BKB]),
        tl.broadcast_to(x5[None, :], [BN, BKB]),
        tl.broadcast_to(x6[None, :], [BN, BKB]),
        tl.broadcast_to(x7[None, :], [BN, BKB]),
        INTERP,
    )
    sx = _fp16_scale(xs.to(tl.int32)).to(tl.float32)
    return p * sx[None, :]


@triton.jit
def _decode_pairs_kernel(
    xp_ptr,
    xs_ptr,
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
    kb_per_split,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    BLOCK_B: tl.constexpr,
    SPLIT: tl.constexpr,
    INTERP: tl.constexpr,
    STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
):
    """Rows ``g*BLOCK_B ...`` (program axis 2) of ``y = x w^T`` for one BLOCK_N slice of the weight and one
    split of K: per 16-value block, the 8 fp16x2 products ``(q_w 2^-14)(q_x)`` summed exactly in fp16 (every
    partial sum is a multiple of 2^-16 below 1152 * 2^-16), then times ``s_w s_x 2^-16`` (exact in fp32) and
    accumulated in fp32. The weight is decoded once for all BLOCK_B rows.

    ``PREFETCH`` (register double buffer): the loads of K tile ``i + 1`` (weights and activations) are
    issued before tile ``i`` is decoded and multiplied, so each iteration's compute hides the next one's
    memory latency without the shared-memory round trip of Triton's pipelined ``STAGES``.

    ``PDL`` (programmatic dependent launch, sm_90+): the program lets the next kernel launch at once, loads
    its first weight tile (with ``PREFETCH``) and asks the L2 for the rest of its weight bytes and scales,
    and only then waits for the previous kernel (which wrote the activations) to finish; every read of data
    that kernel may have written comes after the wait. The weights may be read before it: the kernels of
    the decode path that trigger early (the activation quantizer, this kernel) never write weights, and a
    kernel that does (weight sync) does not trigger early, so a PDL launch after it starts only once it
    has finished."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    g = tl.program_id(2)
    # this program's rows start at g * BLOCK_B: shift the row-indexed pointers
    xp_ptr += g * BLOCK_B * (K // 2)
    xs_ptr += g * BLOCK_B * (K // 16)
    xamax_ptr += g * BLOCK_B
    out_ptr += g * BLOCK_B * N
    part_ptr += g * SPLIT * BLOCK_B * N
    cnt_ptr += g * tl.num_programs(0)
    B = B - g * BLOCK_B
    KB = K // 16
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    kb_start = pid_k * kb_per_split
    if PDL:
        gdc_launch_dependents()
    if PREFETCH:  # the first weight tile; under PDL before the wait (the weights are not what it waits for)
        wd, sb = _weight_tile(w_ptr, ws_ptr, offs_n, nmask, kb_start, True, K, BLOCK_KB)
    if PDL:
        n0 = pid_n * BLOCK_N
        if SPLIT == 1:  # the program's rows are one contiguous range of the packed weight and of its scales
            n1 = tl.minimum(n0 + BLOCK_N, N)
            _prefetch_l2(w_ptr, n0 * (K // 2), n1 * (K // 2))
            _prefetch_l2(ws_ptr, n0 * KB, n1 * KB)
        else:
            kb1 = tl.minimum(kb_start + kb_per_split, KB)
            for i in tl.static_range(BLOCK_N):
                row = n0 + i
                on = row < N
                _prefetch_l2(w_ptr, row * (K // 2) + kb_start * 8, tl.where(on, row * (K // 2) + kb1 * 8, 0))
                _prefetch_l2(ws_ptr, row * KB + kb_start, tl.where(on, row * KB + kb1, 0))
        gdc_wait()
    wa = tl.load(wamax_ptr)
    acc0 = tl.zeros([BLOCK_N, BLOCK_KB], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_KB], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_KB], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_KB], dtype=tl.float32)
    if PREFETCH:  # register double buffer: tile i + 1 is requested before tile i is computed
        xa0, xa1, xa2, xa3 = _act_tiles(xp_ptr, xs_ptr, kb_start, True, K, B, BLOCK_KB, BLOCK_B)
        for kk in range(0, kb_per_split, BLOCK_KB):
            nxt = kb_start + kk + BLOCK_KB
            live = kk + BLOCK_KB < kb_per_split
            wd_n, sb_n = _weight_tile(w_ptr, ws_ptr, offs_n, nmask, nxt, live, K, BLOCK_KB)
            xa0_n, xa1_n, xa2_n, xa3_n = _act_tiles(xp_ptr, xs_ptr, nxt, live, K, B, BLOCK_KB, BLOCK_B)
            hs = _decode_words(wd, BLOCK_N, BLOCK_KB, INTERP)
            sw = _fp16_scale(sb.to(tl.int32)).to(tl.float32)
            acc0 += _row_block_dots(hs, xa0, BLOCK_N, BLOCK_KB, INTERP) * sw
            if BLOCK_B > 1:
                acc1 += _row_block_dots(hs, xa1, BLOCK_N, BLOCK_KB, INTERP) * sw
            if BLOCK_B > 2:
                acc2 += _row_block_dots(hs, xa2, BLOCK_N, BLOCK_KB, INTERP) * sw
                acc3 += _row_block_dots(hs, xa3, BLOCK_N, BLOCK_KB, INTERP) * sw
            wd = wd_n
            sb = sb_n
            xa0 = xa0_n
            xa1 = xa1_n
            xa2 = xa2_n
            xa3 = xa3_n
    else:
        for kk in tl.range(0, kb_per_split, BLOCK_KB, num_stages=STAGES):
            kb0 = kb_start + kk
            wd, sb = _weight_tile(w_ptr, ws_ptr, offs_n, nmask, kb0, True, K, BLOCK_KB)
            hs = _decode_words(wd, BLOCK_N, BLOCK_KB, INTERP)
            sw = _fp16_scale(sb.to(tl.int32)).to(tl.float32)
            xa = _act_tile(xp_ptr, xs_ptr, 0, kb0, True, K, B, BLOCK_KB)
            acc0 += _row_block_dots(hs, xa, BLOCK_N, BLOCK_KB, INTERP) * sw
            if BLOCK_B > 1:
                xa = _act_tile(xp_ptr, xs_ptr, 1, kb0, True, K, B, BLOCK_KB)
                acc1 += _row_block_dots(hs, xa, BLOCK_N, BLOCK_KB, INTERP) * sw
            if BLOCK_B > 2:
                xa = _act_tile(xp_ptr, xs_ptr, 2, kb0, True, K, B, BLOCK_KB)
                acc2 += _row_block_dots(hs, xa, BLOCK_N, BLOCK_KB, INTERP) * sw
                xa = _act_tile(xp_ptr, xs_ptr, 3, kb0, True, K, B, BLOCK_KB)
                acc3 += _row_block_dots(hs, xa, BLOCK_N, BLOCK_KB, INTERP) * sw
    post = wa * (1073741824.0 * INV_2688_SQ_C)  # 2^30: the 2^-14 of the codes and 2^-8 of both scales
    _store_four_rows(
        acc0, acc1, acc2, acc3, post, xamax_ptr, out_ptr, part_ptr, offs_n, nmask, pid_k, N, B, BLOCK_B, SPLIT
    )
    if SPLIT > 1:
        _splitk_finish(out_ptr, part_ptr, cnt_ptr, pid_n, offs_n, nmask, N, B, BLOCK_N, BLOCK_B, SPLIT)


@triton.jit
def _pairs_act_quant_kernel(
    x_ptr,
    xp_ptr,
    data_ptr,
    scales_ptr,
    amax_ptr,
    nonfinite_ptr,
    K,
    stride_x,
    NB: tl.constexpr,
    CH: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Per-token NVFP4 quantization of activation row ``program_id(0)``, blocks ``CH * program_id(1) ...``:
    every program reads the whole row for its amax (L2-resident, a few KB), then encodes only its chunk, so a
    long row is spread over several SMs. Writes the packed bytes, scales, amax and nonfinite flag exactly as
    ``quantize_nvfp4_triton``, plus the E2M1 codes as fp16 pair words ``[B, 8, K/16]``
    (``pairs_for_decode``), stored as int32 rows that are contiguous along the blocks."""
    if PDL:  # let the decode kernel launch (and prefetch its weights) now; x is read after the wait
        gdc_launch_dependents()
        gdc_wait()
    r = tl.program_id(0)
    p = tl.program_id(1)
    KB = K // 16
    blk = tl.arange(0, NB)
    k = blk[:, None] * 16 + tl.arange(0, 16)[None, :]
    xrow = tl.load(x_ptr + r * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
    abits = tl.max(tl.max(xrow.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1), axis=0)
    bad = abits >= 0x7F800000  # inf/NaN: the row's amax is NaN, its codes 0 and scale bytes 0x7F
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    s_enc, s_dec = _encode_scale(amax)
    own = p * CH + tl.arange(0, CH)
    ko = own[:, None] * 16 + tl.arange(0, 16)[None, :]
    m = ko < K
    x = tl.load(x_ptr + r * stride_x + ko, mask=m, other=0.0).to(tl.float32)
    vmax = tl.where(bad, 0, tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)).to(
        tl.float32, bitcast=True
    )
    _s_b, sbyte, enc = _block_scale(vmax, s_enc, s_dec)
    y = tl.where(bad, 0.0, x) * enc[:, None]
    c4, cv = _e2m1_rn(tl.minimum(tl.abs(y), 6.0), y)  # signed code, magnitude
    cv = tl.where(y < 0.0, cv * -1.0, cv)  # -0.0 for negative values rounded to 0, as the quantizer
    lo, hi = tl.split(tl.reshape(c4, [CH, 8, 2]))
    kb2 = own[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(data_ptr + r * (K // 2) + kb2, (lo | (hi << 4)).to(tl.uint8), mask=kb2 < K // 2)
    tl.store(scales_ptr + r * KB + own, tl.where(bad, 0x7F, sbyte).to(tl.uint8), mask=own < KB)
    # value 16m + 8h + 4t + j -> half t of pair word 4h + j
    h16 = cv.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    wlo, whi = tl.split(tl.permute(tl.reshape(h16, [CH, 2, 2, 4]), [0, 1, 3, 2]))
    words = tl.reshape(wlo | (whi << 16), [CH, 8])
    c8 = tl.arange(0, 8)
    tl.store(xp_ptr + r * (8 * KB) + c8[None, :] * KB + own[:, None], words, mask=(own < KB)[:, None])
    if p == 0:
        tl.store(amax_ptr + r, tl.where(bad, float("nan"), amax))
        tl.store(nonfinite_ptr + r, bad)

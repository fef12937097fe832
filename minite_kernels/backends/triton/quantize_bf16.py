"""BF16 fast path of the NVFP4 quantizer: the input is read as 32-bit words, each holding two BF16 values.

Report §2.2 (two-level NVFP4 scaling) and §5.1 (per-token outer scale); the arithmetic is ``quantize.py``'s
(and therefore the bytes are ``minite_kernels.formats``'), arranged so that no data moves between threads
except for the per-token row amax:

- a word ``w`` holds elements ``2j`` (low half) and ``2j+1`` (high half); ``w << 16`` and ``w & 0xFFFF0000``
  reinterpreted as fp32 are exactly those two values, and their E2M1 codes pack into one byte
  ``code(2j) | code(2j+1) << 4`` (the reference's nibble order) with no shuffle;
- a per-token row (up to 16384 elements) is held in registers, so it is read once; per-tensor scaling
  takes the global amax from a separate reduction kernel.

How (each choice measured on the H200, ``benchmarks/RESULTS.md``; one uint8 store per word and every word
reduced twice, the plain formulation, reaches about a third of copy bandwidth per token):

- tiles are 3-D, block-major ``[NB, BLOCK_M, 4]`` (so the lanes of a warp run along a row's blocks) and
  loaded twice per block (words 0..3 and 4..7), each a 16-byte vector, so a thread owns whole 16-element
  blocks: the block max is a register-only ``max`` over the last axis, the broadcast of the block scale
  ``enc[:, :, None]`` is free, nothing goes through shared memory;
- the 8 code bytes of a block are OR-ed into two int32 (``byte << 8i``, disjoint bit fields) and stored
  as one 8-byte vector; qs/deq as 16-byte vectors;
- ``max|x|`` is one ``max.NaN.f32`` of ``|x_even|``, ``|x_odd|`` per word (abs is a free operand modifier; NaN
  propagates, so ``amax`` is inf/NaN exactly when the reference's domain is poisoned), and the per-token row
  amax is the max of the block maxima;
- E2M1 rounding is ``nvfp4_jit``'s one magic add (``_rn_parts``), and the packed byte of a word is summed
  from the two adds' bit patterns: ``bits(t_even) + 16 * bits(t_odd)`` less a constant (``PACK_K``), so no
  code is extracted on its own;
- a poisoned domain is handled once per block (scale byte 0x7F, code word 0) instead of zeroing every word;
- signed zeros of ``qs``/``deq`` follow the reference (``mag * -1``, not ``-mag``, which Triton lowers to
  ``0 - mag`` = +0);
- grouped kernels: one launch quantizes a whole list of weights (``weight_sync.py``) from a device table of
  base addresses, shapes and tile offsets, instead of two launches per weight.

Optional outputs besides ``data``/``scales``/``amax``: ``qs = e2m1 * s_b`` (exact in BF16; the operand of the
exact GEMM) and ``deq`` = the dequantized value ``e2m1 * decode factor`` (``nvfp4_jit._decode_factor``) rounded
to BF16, bit-equal to ``NVFP4Tensor.dequantize(torch.bfloat16)``.

Example: the word ``0x3F804000`` holds 2.0 (low, ``0x4000``) and 1.0 (high, ``0x3F80``); with amax 2688 and a
block max of 6 the block scale is 1 and ``enc = 1``, so the codes are 4 (2.0) and 2 (1.0), byte ``0x24``:
2.0 has ``E = 1``, ``m = 1``, ``t = 2 + 1.5 * 2^23`` -> ``code = 2 + 2 = 4``; 1.0 has ``E = 0``,
``m = 2``, ``rint(2.0) = 2`` -> ``code = 2``; 5.0 has ``E = 2``, ``m = 1/2``, ``rint(2.5) = 2`` (ties to even)
-> ``code = 6`` (4.0).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_jit import _block_scale, _decode_factor, _encode_scale, _rn_mag, _rn_parts, _sr_mag

# ======================================================================================================
# whole 16-element blocks per thread, wide stores
# ======================================================================================================
#: sum over the 8 codes of a 4-word half of the bits(MAGIC) offsets, at their nibble positions (mod 2^32)
PACK_K = tl.constexpr(0x3F400000)  # 17 * 0x4B400000 * (1 + 2^8 + 2^16 + 2^24) mod 2^32


@triton.jit
def _max_nan(a, b):
    """max that propagates NaN (``max.NaN.f32``): a non-finite input must reach the amax."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _pair_absmax(w):
    """max(|x_even|, |x_odd|) of bf16 words as fp32 (NaN-propagating)."""
    xe = (w << 16).to(tl.float32, bitcast=True)
    xo = (w & -65536).to(tl.float32, bitcast=True)
    return tl.maximum(tl.abs(xe), tl.abs(xo), propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _bf16_bits(v, RNE_INT: tl.constexpr):
    """BF16 bit pattern (RNE) of fp32 ``v`` in the low 16 bits of an int32. The CPU interpreter truncates
    fp32 -> bf16 casts, so there (``RNE_INT``) the rounding is done on the bits (exact for finite/inf)."""
    if RNE_INT:
        b = v.to(tl.int32, bitcast=True)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    else:
        return v.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _load_halves(p, rows, blks, M, NBK, stride):
    """Words 0..3 and 4..7 of blocks ``blks`` of rows ``rows``: two block-major [NB, BM, 4] tiles whose last
    axis is contiguous (one 16-byte vector per thread each), so every thread owns whole 16-element blocks.

    Block-major, not row-major: Triton's coalescing orders the axes that are not contiguous by their index,
    so the first one gets the lanes. With the blocks first, a warp's load covers consecutive blocks of one
    row (8 cache lines per 16-byte load); with the rows first it went down 16 rows (16 lines), which capped
    the weight-sync pass at 75% of copy bandwidth even with a trivial encode (benchmarks/RESULTS.md)."""
    j = tl.arange(0, 4)
    off = blks[:, None, None] * 8 + rows[None, :, None] * stride + j[None, None, :]
    mask = (blks[:, None, None] < NBK) & (rows[None, :, None] < M)
    lo = tl.load(p + off, mask=mask, other=0)
    hi = tl.load(p + off + 4, mask=mask, other=0)
    return lo, hi


@triton.jit
def _load_rbits(rb_ptr, rows, blks, M, NBK, SR: tl.constexpr):
    """Random bytes (int16 per word: even element low) of the two halves, for stochastic rounding."""
    if SR:
        lo, hi = _load_halves(rb_ptr, rows, blks, M, NBK, NBK * 8)
        return lo.to(tl.int32) & 0xFFFF, hi.to(tl.int32) & 0xFFFF
    else:
        return 0, 0


@triton.jit
def _encode_half(
    w,
    rb,
    enc3,
    sb3,
    f3,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    """Quantize 4 words (8 elements) per block: returns (packed int32 = the 4 code bytes, little-endian;
    qs words; deq words) - the last two 0 when not requested."""
    xe = (w << 16).to(tl.float32, bitcast=True)
    xo = (w & -65536).to(tl.float32, bitcast=True)
    ye = xe * enc3
    yo = xo * enc3
    if SR:
        me = _sr_mag(tl.abs(ye), rb & 255)
        mo = _sr_mag(tl.abs(yo), (rb >> 8) & 255)
        te, ce, pe = _rn_parts(me, ye, WRITE_PACKED)
        to, co, po = _rn_parts(mo, yo, WRITE_PACKED)
    else:
        te, ce, pe = _rn_parts(tl.minimum(tl.abs(ye), 6.0), ye, WRITE_PACKED)
        to, co, po = _rn_parts(tl.minimum(tl.abs(yo), 6.0), yo, WRITE_PACKED)
        me = _rn_mag(te, ce, pe)
        mo = _rn_mag(to, co, po)
    packed = 0
    if WRITE_PACKED:
        # byte of word j = code_even + 16 * code_odd = (bits(te) - B) + 16 * (bits(to) - B), at bits 8j; the
        # constant offsets (B = bits(MAGIC)) are summed into PACK_K and removed once (no carries: byte <= 255)
        byte = te.to(tl.int32, bitcast=True) + to.to(tl.int32, bitcast=True) * 16
        sh = tl.arange(0, 4) * 8
        packed = tl.reduce(byte << sh[None, None, :], 2, _add) - PACK_K
    qsw = 0
    deqw = 0
    if WRITE_QS or WRITE_DEQ:
        me = tl.where(ye < 0.0, me * -1.0, me)  # not ``-me`` (Triton lowers it to 0 - me: +0, not -0)
        mo = tl.where(yo < 0.0, mo * -1.0, mo)
        if WRITE_QS:
            qe = (me * sb3).to(tl.int32, bitcast=True)
            qo = (mo * sb3).to(tl.int32, bitcast=True)
            qsw = ((qe >> 16) & 0xFFFF) | (qo & -65536)  # exact in bf16: the high halves
        if WRITE_DEQ:
            deqw = _bf16_bits(me * f3, RNE_INT) | (_bf16_bits(mo * f3, RNE_INT) << 16)
    return packed, qsw, deqw


@triton.jit
def _quant_blocks(
    lo,
    hi,
    rb_lo,
    rb_hi,
    s_b,
    enc,
    f,
    bad2,
    bad3,
    data_ptr,
    scales_ptr,
    qs_ptr,
    deq_ptr,
    rows,
    blks,
    M,
    NBK,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    """Encode and store the two halves given per-block (s_b, enc, f) [NB, BM]; ``bad2``/``bad3``
    (broadcastable to [NB, BM] / [NB, BM, 4]) mark poisoned scaling domains: codes 0, qs 0, deq NaN there."""
    p_lo, q_lo, d_lo = _encode_half(
        lo,
        rb_lo,
        enc[:, :, None],
        s_b[:, :, None],
        f[:, :, None],
        SR,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )
    p_hi, q_hi, d_hi = _encode_half(
        hi,
        rb_hi,
        enc[:, :, None],
        s_b[:, :, None],
        f[:, :, None],
        SR,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )
    bmask = (blks[:, None] < NBK) & (rows[None, :] < M)
    if WRITE_PACKED:
        # 8 code bytes of a block -> one 8-byte store (data viewed as int32, 2 per block)
        pk = tl.join(tl.where(bad2, 0, p_lo), tl.where(bad2, 0, p_hi))
        two = tl.arange(0, 2)
        tl.store(
            data_ptr + blks[:, None, None] * 2 + rows[None, :, None] * (NBK * 2) + two[None, None, :],
            pk,
            mask=bmask[:, :, None],
        )
    j = tl.arange(0, 4)
    off = blks[:, None, None] * 8 + rows[None, :, None] * (NBK * 8) + j[None, None, :]
    if WRITE_QS:
        tl.store(qs_ptr + off, tl.where(bad3, 0, q_lo), mask=bmask[:, :, None])
        tl.store(qs_ptr + off + 4, tl.where(bad3, 0, q_hi), mask=bmask[:, :, None])
    if WRITE_DEQ:
        tl.store(deq_ptr + off, tl.where(bad3, 0x7FC07FC0, d_lo), mask=bmask[:, :, None])
        tl.store(deq_ptr + off + 4, tl.where(bad3, 0x7FC07FC0, d_hi), mask=bmask[:, :, None])


@triton.jit
def _token_segment_store(
    lo,
    hi,
    vmax,
    amax,
    bad,
    s_enc,
    s_dec,
    data_ptr,
    scales_ptr,
    qs_ptr,
    deq_ptr,
    rb_ptr,
    rows,
    blks,
    M,
    NBK,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    """Block scales, codes and stores of one row segment (blocks ``blks``) given the rows' amax."""
    vmax = tl.where(bad[None, :], 0.0, vmax)
    s_b, sbyte, enc = _block_scale(vmax, s_enc[None, :], s_dec[None, :])
    f = s_b
    if WRITE_DEQ:
        f = _decode_factor(s_b, amax[None, :])
    rb_lo, rb_hi = _load_rbits(rb_ptr, rows, blks, M, NBK, SR)
    _quant_blocks(
        lo,
        hi,
        rb_lo,
        rb_hi,
        s_b,
        enc,
        f,
        bad[None, :],
        bad[None, :, None],
        data_ptr,
        scales_ptr,
        qs_ptr,
        deq_ptr,
        rows,
        blks,
        M,
        NBK,
        SR,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )
    if WRITE_PACKED:
        tl.store(
            scales_ptr + blks[:, None] + rows[None, :] * NBK,
            tl.where(bad[None, :], 0x7F, sbyte).to(tl.uint8),
            mask=(blks[:, None] < NBK) & (rows[None, :] < M),
        )


@triton.jit
def _token_segment_load(xw_ptr, rows, blks, M, NBK, stride_w):
    lo, hi = _load_halves(xw_ptr, rows, blks, M, NBK, stride_w)
    vmax = tl.reduce(_max_nan(_pair_absmax(lo), _pair_absmax(hi)), 2, _max_nan)  # [NB, BM]
    return lo, hi, vmax


@triton.jit
def _quant_token_kernel_bf16(
    xw_ptr,
    data_ptr,
    scales_ptr,
    qs_ptr,
    deq_ptr,
    amax_ptr,
    nonfinite_ptr,
    rb_ptr,
    M,
    KW,
    stride_w,
    BLOCK_M: tl.constexpr,
    NB: tl.constexpr,
    ALIGN4: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
    NB2: tl.constexpr = 0,
):
    """Per-token scaling, one read: each program holds BLOCK_M whole rows (NB + NB2 >= K/16 blocks).

    Tile sizes are powers of two, so a row of K/16 = 160 blocks (K = 2560) padded to one 256-block tile leaves
    37% of the lanes idle. ``NB2 > 0`` holds the row as two segments instead, blocks [0, NB) (all present) and
    [NB, NB + NB2) (e.g. 128 + 32): the row amax is the max over both, then each segment is encoded and stored.

    The input, codes and ``deq`` are addressed as 32-bit words and the scales as bytes, whatever element type
    the caller's tensors have (BF16 input and ``deq``, uint8 codes, E4M3 scales need no views on the host)."""
    xw_ptr = xw_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    data_ptr = data_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    scales_ptr = scales_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    deq_ptr = deq_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    if ALIGN4:
        stride_w = (stride_w // 4) * 4  # tells the compiler rows start 16-byte aligned (true: checked)
    NBK = KW // 8
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    blks = tl.arange(0, NB)
    lo, hi, vmax = _token_segment_load(xw_ptr, rows, blks, M, NBK, stride_w)
    amax = tl.reduce(vmax, 0, _max_nan)  # [BM], from the block maxima (no second pass over the words)
    if NB2 > 0:
        blks2 = NB + tl.arange(0, NB2)
        lo2, hi2, vmax2 = _token_segment_load(xw_ptr, rows, blks2, M, NBK, stride_w)
        amax = _max_nan(amax, tl.reduce(vmax2, 0, _max_nan))
    bad = ~(amax < float("inf"))  # inf or NaN in the row
    tl.store(amax_ptr + rows, tl.where(bad, float("nan"), amax), mask=rows < M)
    tl.store(nonfinite_ptr + rows, bad, mask=rows < M)
    amax = tl.where(bad, 0.0, amax)
    s_enc, s_dec = _encode_scale(amax)
    _token_segment_store(
        lo,
        hi,
        vmax,
        amax,
        bad,
        s_enc,
        s_dec,
        data_ptr,
        scales_ptr,
        qs_ptr,
        deq_ptr,
        rb_ptr,
        rows,
        blks,
        M,
        NBK,
        SR,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )
    if NB2 > 0:
        _token_segment_store(
            lo2,
            hi2,
            vmax2,
            amax,
            bad,
            s_enc,
            s_dec,
            data_ptr,
            scales_ptr,
            qs_ptr,
            deq_ptr,
            rb_ptr,
            rows,
            blks2,
            M,
            NBK,
            SR,
            WRITE_PACKED,
            WRITE_QS,
            WRITE_DEQ,
            RNE_INT,
        )


@triton.jit
def _amax_tile_bf16(
    xw_ptr, r0, c0, M, KW, stride_w, A_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr
):
    """Bits of max|x| (NaN/inf propagate, sorting above finite values) over rows [r0, r0 + A_ROWS) x words
    [c0, c0 + BLOCK_W)."""
    acc = tl.zeros([BLOCK_M, BLOCK_W], dtype=tl.float32)
    cols = c0 + tl.arange(0, BLOCK_W)
    for r in range(0, A_ROWS, BLOCK_M):
        rows = r0 + r + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & (cols[None, :] < KW)
        w = tl.load(xw_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0)
        acc = _max_nan(acc, _pair_absmax(w))
    return tl.reduce(tl.reduce(acc, 1, _max_nan), 0, _max_nan).to(tl.int32, bitcast=True)


@triton.jit
def _amax_kernel_bf16(
    xw_ptr,
    scratch_ptr,
    M,
    KW,
    stride_w,
    ALIGN4: tl.constexpr,
    A_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Per-tensor amax: program (i, j) reduces an A_ROWS x BLOCK_W tile -> atomic max into scratch[0]."""
    if ALIGN4:
        stride_w = (stride_w // 4) * 4
    bits = _amax_tile_bf16(
        xw_ptr,
        tl.program_id(0) * A_ROWS,
        tl.program_id(1) * BLOCK_W,
        M,
        KW,
        stride_w,
        A_ROWS,
        BLOCK_M,
        BLOCK_W,
    )
    tl.atomic_max(scratch_ptr, bits)


@triton.jit
def _tensor_tile_bf16(
    xw_ptr,
    data_ptr,
    scales_ptr,
    qs_ptr,
    deq_ptr,
    amax_ptr,
    nonfinite_ptr,
    rb_ptr,
    abits,
    pid_m,
    pid_w,
    M,
    KW,
    stride_w,
    BLOCK_M: tl.constexpr,
    NB: tl.constexpr,
    TILE16: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    """One [BLOCK_M rows, NB blocks] tile of a per-tensor-scaled weight (global amax bits ``abits``)."""
    bad = abits >= 0x7F800000
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    if (pid_m == 0) & (pid_w == 0):
        tl.store(amax_ptr, tl.where(bad, float("nan"), amax))
        tl.store(nonfinite_ptr, bad)
    s_enc, s_dec = _encode_scale(amax)
    NBK = KW // 8
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    blks = pid_w * NB + tl.arange(0, NB)
    lo, hi = _load_halves(xw_ptr, rows, blks, M, NBK, stride_w)
    vmax = tl.reduce(_max_nan(_pair_absmax(lo), _pair_absmax(hi)), 2, _max_nan)  # [NB, BM]
    if TILE16:  # BLOCK_M == 16: the 16x16 tile max is a max over the rows; scales computed once per tile
        vt = tl.where(bad, 0.0, tl.reduce(vmax, 1, _max_nan))  # [NB]
        sb1, sbyte1, enc1 = _block_scale(vt, s_enc, s_dec)
        s_b = tl.broadcast_to(sb1[:, None], [NB, BLOCK_M])
        sbyte = tl.broadcast_to(sbyte1[:, None], [NB, BLOCK_M])
        enc = tl.broadcast_to(enc1[:, None], [NB, BLOCK_M])
    else:
        s_b, sbyte, enc = _block_scale(tl.where(bad, 0.0, vmax), s_enc, s_dec)
    f = s_b
    if WRITE_DEQ:
        f = _decode_factor(s_b, amax)
    rb_lo, rb_hi = _load_rbits(rb_ptr, rows, blks, M, NBK, SR)
    _quant_blocks(
        lo,
        hi,
        rb_lo,
        rb_hi,
        s_b,
        enc,
        f,
        bad,
        bad,
        data_ptr,
        scales_ptr,
        qs_ptr,
        deq_ptr,
        rows,
        blks,
        M,
        NBK,
        SR,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )
    if WRITE_PACKED:
        tl.store(
            scales_ptr + blks[:, None] + rows[None, :] * NBK,
            tl.where(bad, 0x7F, sbyte).to(tl.uint8),
            mask=(blks[:, None] < NBK) & (rows[None, :] < M),
        )


@triton.jit
def _quant_tensor_kernel_bf16(
    xw_ptr,
    data_ptr,
    scales_ptr,
    qs_ptr,
    deq_ptr,
    amax_ptr,
    nonfinite_ptr,
    scratch_ptr,
    rb_ptr,
    M,
    KW,
    stride_w,
    BLOCK_M: tl.constexpr,
    NB: tl.constexpr,
    ALIGN4: tl.constexpr,
    TILE16: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    """Per-tensor scaling (global amax bits in scratch[0] from ``_amax_kernel_bf16``)."""
    if ALIGN4:
        stride_w = (stride_w // 4) * 4
    _tensor_tile_bf16(
        xw_ptr,
        data_ptr,
        scales_ptr,
        qs_ptr,
        deq_ptr,
        amax_ptr,
        nonfinite_ptr,
        rb_ptr,
        tl.load(scratch_ptr),
        tl.program_id(0),
        tl.program_id(1),
        M,
        KW,
        stride_w,
        BLOCK_M,
        NB,
        TILE16,
        SR,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )


# ------------------------------------------------------------------------------------------------------
# grouped kernels: one launch over a list of weights described by a device table (weight sync)
# ------------------------------------------------------------------------------------------------------
#: columns of the int64 weight table (one row per weight); addresses are byte addresses
T_X, T_DATA, T_SCALES, T_QS, T_DEQ, T_AMAX, T_NF, T_M, T_KW, T_STRIDE = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
T_Q_TILES_W, T_Q_START, T_A_TILES_W, T_A_START = 10, 11, 12, 13
T_COLS = 16


@triton.jit
def _tab_ptr(row, col: tl.constexpr, ty: tl.constexpr):
    """Pointer column of the table, 16-byte aligned (checked by the launcher; ``multiple_of`` tells the
    compiler so, for vector loads and stores)."""
    return tl.multiple_of(tl.load(row + col).to(tl.pointer_type(ty)), 16)


@triton.jit
def _grouped_amax_kernel(
    tab_ptr,
    amap_ptr,
    scratch_ptr,
    A_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Program p: amax tile ``p - start[g]`` of weight ``g = amap[p]`` -> atomic max into scratch[g]."""
    pid = tl.program_id(0)
    g = tl.load(amap_ptr + pid)
    row = tab_ptr + g * 16
    xw_ptr = _tab_ptr(row, 0, tl.int32)
    M = tl.load(row + 7).to(tl.int32)
    KW = (tl.load(row + 8).to(tl.int32) // 8) * 8
    stride_w = (tl.load(row + 9).to(tl.int32) // 4) * 4
    tiles_w = tl.load(row + 12).to(tl.int32)
    local = pid - tl.load(row + 13).to(tl.int32)
    bits = _amax_tile_bf16(
        xw_ptr,
        (local // tiles_w) * A_ROWS,
        (local % tiles_w) * BLOCK_W,
        M,
        KW,
        stride_w,
        A_ROWS,
        BLOCK_M,
        BLOCK_W,
    )
    tl.atomic_max(scratch_ptr + g, bits)


@triton.jit
def _grouped_quant_kernel(
    tab_ptr,
    qmap_ptr,
    scratch_ptr,
    BLOCK_M: tl.constexpr,
    NB: tl.constexpr,
    TILE16: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    """Program p: quantize tile ``p - start[g]`` of weight ``g = qmap[p]`` (per-tensor amax in scratch[g])."""
    pid = tl.program_id(0)
    g = tl.load(qmap_ptr + pid)
    row = tab_ptr + g * 16
    M = tl.load(row + 7).to(tl.int32)
    KW = (tl.load(row + 8).to(tl.int32) // 8) * 8
    stride_w = (tl.load(row + 9).to(tl.int32) // 4) * 4
    tiles_w = tl.load(row + 10).to(tl.int32)
    local = pid - tl.load(row + 11).to(tl.int32)
    _tensor_tile_bf16(
        _tab_ptr(row, 0, tl.int32),
        _tab_ptr(row, 1, tl.int32),
        _tab_ptr(row, 2, tl.uint8),
        _tab_ptr(row, 3, tl.int32),
        _tab_ptr(row, 4, tl.int32),
        _tab_ptr(row, 5, tl.float32),
        _tab_ptr(row, 6, tl.int8),
        scratch_ptr,
        tl.load(scratch_ptr + g),
        local // tiles_w,
        local % tiles_w,
        M,
        KW,
        stride_w,
        BLOCK_M,
        NB,
        TILE16,
        False,
        True,
        WRITE_QS,
        WRITE_DEQ,
        RNE_INT,
    )

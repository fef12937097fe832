"""BF16 fast path of the NVFP4 quantizer: the input is read as 32-bit words, each holding two BF16 values.

Same arithmetic as ``quantize.py`` (and therefore the same bytes as ``minite_kernels.formats``), arranged so
that no data moves between threads except the 16-element block maxima:

- a word ``w`` holds elements ``2j`` (low half) and ``2j+1`` (high half); ``w << 16`` and ``w & 0xFFFF0000``
  reinterpreted as fp32 are exactly those two values, and their E2M1 codes pack into one byte
  ``code(2j) | code(2j+1) << 4`` (the reference's nibble order) with no shuffle;
- ``max|x|`` is taken on the bit patterns ``bits & 0x7FFF0000`` (for non-negative floats the integer order
  is the float order, and +inf/NaN patterns sort above every finite value, so one integer max also detects
  a non-finite input: ``amax_bits >= 0x7F800000``);
- a per-token row (up to 16384 elements) is held in registers, so it is read once; per-tensor scaling
  takes the global amax from a separate reduction kernel.

Optional outputs besides ``data``/``scales``/``amax``: ``qs = e2m1 * s_b`` (exact in BF16; the operand of the
exact GEMM) and ``deq`` = the dequantized value ``e2m1 * fp32(fp32(s_b * amax) * fl(1/2688))`` rounded to
BF16, bit-equal to ``NVFP4Tensor.dequantize(torch.bfloat16)``.

Example: the word ``0x3F804000`` holds 2.0 (low, ``0x4000``) and 1.0 (high, ``0x3F80``); with amax 2688 and a
block max of 6 the block scale is 1 and ``enc = 1``, so the codes are 4 (2.0) and 2 (1.0), byte ``0x24``.
"""

from __future__ import annotations

import triton  # noqa: F401
import triton.language as tl

from .quantize import FLT_MAX, INV_2688, SIXTH, _e2m1_code_rn, _e2m1_value, _e4m3_rne, _encode_scale, _sr_step


@triton.jit
def _abs_bits(w):
    """max(|x_even|, |x_odd|) of a word, as (non-negative) fp32 bit patterns."""
    return tl.maximum((w << 16) & 0x7FFF0000, w & 0x7FFF0000)


@triton.jit
def _sr_mag(a, r):
    """TE's 8-bit stochastic rounding of a = |v| (any a >= 0; a > 6 saturates) with random byte r."""
    u = r.to(tl.float32) * 0.00390625
    t = a + u * _sr_step(a)
    st = _sr_step(t)
    return tl.minimum(tl.floor(t * (1.0 / st)) * st, 6.0)


@triton.jit
def _encode_words(
    w,
    ab,
    rb,
    s_enc,
    s_dec,
    amax,
    BLOCK_M: tl.constexpr,
    BLOCK_W: tl.constexpr,
    TILE16: tl.constexpr,
    SR: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
):
    """Quantize a [BLOCK_M, BLOCK_W] tile of words; returns (packed bytes as int32, scale bytes [BM, NB],
    qs words, deq words) - the last two are 0 when not requested."""
    NB: tl.constexpr = BLOCK_W // 8
    vbits = tl.max(tl.reshape(ab, [BLOCK_M, NB, 8]), axis=2)
    if TILE16:
        t = tl.max(tl.reshape(vbits, [BLOCK_M // 16, 16, NB]), axis=1)
        vbits = tl.reshape(tl.broadcast_to(t[:, None, :], [BLOCK_M // 16, 16, NB]), [BLOCK_M, NB])
    vmax = vbits.to(tl.float32, bitcast=True)
    pre = tl.minimum(vmax * (s_enc * SIXTH), 448.0)
    s_b, sbyte = _e4m3_rne(pre)
    enc = tl.minimum(tl.math.div_rn(tl.full(s_b.shape, 1.0, tl.float32), s_b * s_dec), FLT_MAX)
    enc_w = tl.reshape(tl.broadcast_to(enc[:, :, None], [BLOCK_M, NB, 8]), [BLOCK_M, BLOCK_W])
    ye = (w << 16).to(tl.float32, bitcast=True) * enc_w
    yo = (w & -65536).to(tl.float32, bitcast=True) * enc_w
    ae = tl.abs(ye)
    ao = tl.abs(yo)
    if SR:
        me = _sr_mag(ae, rb & 255)
        mo = _sr_mag(ao, (rb >> 8) & 255)
        ce = _e2m1_code_rn(me)
        co = _e2m1_code_rn(mo)
    else:
        ce = _e2m1_code_rn(ae)
        co = _e2m1_code_rn(ao)
    ne = ye < 0.0
    no = yo < 0.0
    packed = (ce + tl.where(ne, 8, 0)) | ((co + tl.where(no, 8, 0)) << 4)
    qsw = 0
    deqw = 0
    if WRITE_QS or WRITE_DEQ:
        if not SR:
            me = _e2m1_value(ce)
            mo = _e2m1_value(co)
        me = tl.where(ne, -me, me)
        mo = tl.where(no, -mo, mo)
        if WRITE_QS:
            sb_w = tl.reshape(tl.broadcast_to(s_b[:, :, None], [BLOCK_M, NB, 8]), [BLOCK_M, BLOCK_W])
            qe = (me * sb_w).to(tl.int32, bitcast=True)
            qo = (mo * sb_w).to(tl.int32, bitcast=True)
            qsw = ((qe >> 16) & 0xFFFF) | (qo & -65536)  # exact in bf16: the high halves
        if WRITE_DEQ:
            f = (s_b * amax) * INV_2688
            f_w = tl.reshape(tl.broadcast_to(f[:, :, None], [BLOCK_M, NB, 8]), [BLOCK_M, BLOCK_W])
            de = (me * f_w).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            do = (mo * f_w).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
            deqw = de | (do << 16)
    return packed, sbyte, qsw, deqw


@triton.jit
def _store_words(
    data_ptr,
    scales_ptr,
    qs_ptr,
    deq_ptr,
    rows,
    cols,
    col0,
    M,
    KW,
    packed,
    sbyte,
    qsw,
    deqw,
    BLOCK_W: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
):
    rmask = rows[:, None] < M
    mask = rmask & (cols[None, :] < KW)
    off = rows[:, None] * KW + cols[None, :]
    if WRITE_PACKED:
        tl.store(data_ptr + off, packed.to(tl.uint8), mask=mask)
        bc = col0 // 8 + tl.arange(0, BLOCK_W // 8)
        tl.store(
            scales_ptr + rows[:, None] * (KW // 8) + bc[None, :],
            sbyte.to(tl.uint8),
            mask=rmask & (bc[None, :] < KW // 8),
        )
    if WRITE_QS:
        tl.store(qs_ptr + off, qsw, mask=mask)
    if WRITE_DEQ:
        tl.store(deq_ptr + off, deqw, mask=mask)


@triton.jit
def _quant_bf16_token_kernel(
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
    BLOCK_W: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
):
    """Per-token scaling, one read: each program holds BLOCK_M whole rows (BLOCK_W >= K/2 words)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_W)
    mask = (rows[:, None] < M) & (cols[None, :] < KW)
    w = tl.load(xw_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0)
    ab = _abs_bits(w)
    abits = tl.max(ab, axis=1)
    bad = abits >= 0x7F800000
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    tl.store(amax_ptr + rows, tl.where(bad, float("nan"), amax), mask=rows < M)
    tl.store(nonfinite_ptr + rows, bad, mask=rows < M)
    w = tl.where(bad[:, None], 0, w)  # a poisoned row stores codes 0 and scale bytes 0x7F
    ab = tl.where(bad[:, None], 0, ab)
    s_enc, s_dec = _encode_scale(amax)
    rb = 0
    if SR:
        rb = tl.load(rb_ptr + rows[:, None] * KW + cols[None, :], mask=mask, other=0).to(tl.int32) & 0xFFFF
    packed, sbyte, qsw, deqw = _encode_words(
        w,
        ab,
        rb,
        s_enc[:, None],
        s_dec[:, None],
        amax[:, None],
        BLOCK_M,
        BLOCK_W,
        False,
        SR,
        WRITE_QS,
        WRITE_DEQ,
    )
    sbyte = tl.where(bad[:, None], 0x7F, sbyte)
    if WRITE_DEQ:
        deqw = tl.where(bad[:, None], 0x7FC07FC0, deqw)
    _store_words(
        data_ptr,
        scales_ptr,
        qs_ptr,
        deq_ptr,
        rows,
        cols,
        0,
        M,
        KW,
        packed,
        sbyte,
        qsw,
        deqw,
        BLOCK_W,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
    )


@triton.jit
def _amax_bf16_kernel(
    xw_ptr,
    scratch_ptr,
    M,
    KW,
    stride_w,
    nprog,
    tiles_per_prog,
    tiles_w,
    BLOCK_M: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Global max of |x| bit patterns (NaN/inf sort above finite values) -> atomic max into scratch[0]."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK_M, BLOCK_W], dtype=tl.int32)
    for i in range(0, tiles_per_prog):
        t = pid + i * nprog
        rows = (t // tiles_w) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (t % tiles_w) * BLOCK_W + tl.arange(0, BLOCK_W)
        mask = (rows[:, None] < M) & (cols[None, :] < KW)
        w = tl.load(xw_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0)
        acc = tl.maximum(acc, _abs_bits(w))
    tl.atomic_max(scratch_ptr, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit
def _quant_bf16_tensor_kernel(
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
    BLOCK_W: tl.constexpr,
    TILE16: tl.constexpr,
    SR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_DEQ: tl.constexpr,
):
    """Per-tensor scaling (global amax bits in scratch[0] from ``_amax_bf16_kernel``)."""
    pid_m = tl.program_id(0)
    pid_w = tl.program_id(1)
    abits = tl.load(scratch_ptr)
    bad = abits >= 0x7F800000
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    if (pid_m == 0) & (pid_w == 0):
        tl.store(amax_ptr, tl.where(bad, float("nan"), amax))
        tl.store(nonfinite_ptr, bad)
    s_enc, s_dec = _encode_scale(amax)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (rows[:, None] < M) & (cols[None, :] < KW)
    w = tl.load(xw_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0)
    w = tl.where(bad, 0, w)
    ab = _abs_bits(w)
    rb = 0
    if SR:
        rb = tl.load(rb_ptr + rows[:, None] * KW + cols[None, :], mask=mask, other=0).to(tl.int32) & 0xFFFF
    packed, sbyte, qsw, deqw = _encode_words(
        w, ab, rb, s_enc, s_dec, amax, BLOCK_M, BLOCK_W, TILE16, SR, WRITE_QS, WRITE_DEQ
    )
    sbyte = tl.where(bad, 0x7F, sbyte)
    if WRITE_DEQ:
        deqw = tl.where(bad, 0x7FC07FC0, deqw)
    _store_words(
        data_ptr,
        scales_ptr,
        qs_ptr,
        deq_ptr,
        rows,
        cols,
        pid_w * BLOCK_W,
        M,
        KW,
        packed,
        sbyte,
        qsw,
        deqw,
        BLOCK_W,
        WRITE_PACKED,
        WRITE_QS,
        WRITE_DEQ,
    )

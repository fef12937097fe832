"""The NVFP4 encoding as Triton device functions, shared by every kernel that writes or reads NVFP4 bytes
(``quantize_kernels.py``, ``quantize_bf16.py``, ``decode_kernels.py``): one place for the arithmetic of
``minite_kernels.formats.nvfp4``, inlined at each call site. Notes §1.2; every step fp32 round-to-nearest::

    S_enc = min(2688 / amax, FLT_MAX), 1 if amax == 0;   S_dec = 1 / S_enc           _encode_scale
    s_b   = e4m3_rne(min(vmax * (S_enc * fl(1/6)), 448))    (value and byte)          _e4m3_rne
    enc   = min(1 / (s_b * S_dec), FLT_MAX)               (with s_b: _block_scale)
    code  = e2m1_rne(|x| * enc)                            (0..7, saturating)        _e2m1_code_rn
    |q|   = e2m1(code) in {0, .5, 1, 1.5, 2, 3, 4, 6}                                  _e2m1_value
    x̂     = ±|q| * fp32(fp32(s_b * amax) * fl(1/2688))    (TE's order, overflow-safe)  _decode_factor

plus ``_e4m3_decode`` (scale byte -> fp32) and ``_sr_step`` (the E2M1 grid step for stochastic rounding).

Worked example: a block of 16 values with max 6 in a tensor with amax 2688: S_enc = 1, s_b = e4m3(6/6) = 1
(byte 0x38), the value 5.0 has code e2m1_rne(5.0) = 6 (4.0; 5 is a tie between 4 and 6 and goes to the even
code), and decodes to 4.0 * (1 * 2688 / 2688) = 4.0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import DECODE_FACTOR_MAX as _DECODE_FACTOR_MAX
from ._common import FLT_MAX as _FLT_MAX
from ._common import INV_2688 as _INV_2688
from ._common import SIXTH as _SIXTH
from ._common import TE_ORDER_AMAX_MAX as _TE_ORDER_AMAX_MAX

FLT_MAX = tl.constexpr(_FLT_MAX)
SIXTH = tl.constexpr(_SIXTH)
INV_2688 = tl.constexpr(_INV_2688)
TE_ORDER_AMAX_MAX = tl.constexpr(_TE_ORDER_AMAX_MAX)
DECODE_FACTOR_MAX = tl.constexpr(_DECODE_FACTOR_MAX)


@triton.jit
def _decode_factor(s_b, amax):
    """Per-block decode factor, as ``formats.nvfp4.dequant_factor``: TE's order
    ``fp32(fp32(s_b * amax) * fl(1/2688))`` up to TE_ORDER_AMAX_MAX, above it
    ``min(s_b * fp32(amax * fl(1/2688)), DECODE_FACTOR_MAX)``, which cannot overflow."""
    safe = tl.minimum(s_b * (amax * INV_2688), DECODE_FACTOR_MAX)
    return tl.where(amax > TE_ORDER_AMAX_MAX, safe, (s_b * amax) * INV_2688)


@triton.jit
def _encode_scale(amax):
    """S_enc = min(2688/amax, FLT_MAX), 1 where amax == 0 (or the quotient is 0); S_dec = 1/S_enc."""
    s_enc = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    return s_enc, s_dec


@triton.jit
def _block_scale(vmax, s_enc, s_dec):
    """(s_b, E4M3 byte, enc) of block maxima ``vmax`` (>= 0, finite: poisoned domains are zeroed first), in the
    reference's association order; ``enc`` multiplies a block's values onto the E2M1 grid. Every quantizer
    kernel takes its block scales from here."""
    pre = tl.minimum(vmax * (s_enc * SIXTH), 448.0)
    s_b, sbyte = _e4m3_rne(pre)
    enc = tl.minimum(tl.math.div_rn(tl.full(s_b.shape, 1.0, tl.float32), s_b * s_dec), FLT_MAX)
    return s_b, sbyte, enc


@triton.jit
def _e4m3_rne(p):
    """Round fp32 ``p`` in [0, 448] to the nearest E4M3 value (ties to even); returns (value, byte)."""
    bits = p.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)  # below 2^-6 the E4M3 grid is the subnormal one, quantum 2^-9
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv_quantum = ((127 - (e - 3)) << 23).to(tl.float32, bitcast=True)
    t = p * inv_quantum  # exact: a power-of-two scaling, t in [0, 16]
    r = ((t + 8388608.0) - 8388608.0) * quantum  # rint(t) with ties to even, then exact rescale
    rb = r.to(tl.int32, bitcast=True)
    normal = ((((rb >> 23) & 0xFF) - 120) << 3) | ((rb >> 20) & 7)  # (e + 7) << 3 | 3 mantissa bits
    sub = (r * 512.0).to(tl.int32)  # r = k * 2^-9, k in 0..7
    byte = tl.where(r >= 0.015625, normal, sub)
    return r, byte


@triton.jit
def _e2m1_code_rn(a):
    """E2M1 code (0..7) of a = |v| >= 0 (any size: saturates to 7), round to nearest even (TE's tie table).

    a >= 1: round the fp32 bit pattern to one mantissa bit (RNE: add 0x1FFFFF + the kept bit, truncate);
    then ``bits >> 22 = 2 * (e + 127) + m`` and the code is ``2 + 2e + m = (bits >> 22) - 252``, capped at 7.
    a < 1: the grid is 0, 0.5, 1, i.e. ``code = rint(2a)``, done as ``bits(2a + 1.5 * 2^23) - 0x4B400000``.
    Same result as counting the thresholds .25 < a, .75 <= a, 1.25 < a, 1.75 <= a, 2.5 < a, 3.5 <= a, 5 < a
    (the interpreter tests check ties and their neighbours), in about 10 instructions instead of 14.
    """
    u = a.to(tl.int32, bitcast=True)
    r = u + 0x1FFFFF + ((u >> 22) & 1)
    hi = tl.minimum((r >> 22) - 252, 7)
    lo = (a * 2.0 + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
    return tl.where(u >= 0x3F800000, hi, lo)


@triton.jit
def _e2m1_value(c):
    """Magnitude of E2M1 code c in 0..7: 0, .5, 1, 1.5, 2, 3, 4, 6."""
    cf = c.to(tl.float32)
    return tl.where(c < 4, cf * 0.5, tl.where(c < 6, cf - 2.0, cf * 2.0 - 8.0))


@triton.jit
def _sr_step(a):
    return tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))


@triton.jit
def _e4m3_decode(byte):
    """fp32 value of an E4M3 byte (int32 0..255); 0x7F/0xFF decode to NaN."""
    e = (byte >> 3) & 15
    m = byte & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    v = tl.where(e == 0, sub, normal)
    v = tl.where((byte & 0x7F) == 0x7F, float("nan"), v)
    return tl.where((byte & 0x80) != 0, -v, v)

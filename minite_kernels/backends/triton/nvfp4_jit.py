"""The NVFP4 encoding as Triton device functions, shared by every kernel that writes or reads NVFP4 bytes
(``quantize_kernels.py``, ``quantize_bf16.py``, ``decode_kernels.py``): one place for the arithmetic of
``minite_kernels.formats.nvfp4``, inlined at each call site. Notes §1.2; every step fp32 round-to-nearest::

    S_enc = min(2688 / amax, FLT_MAX), 1 if amax == 0;   S_dec = 1 / S_enc           _encode_scale
    s_b   = e4m3_rne(min(vmax * (S_enc * fl(1/6)), 448))    (value and byte)          _e4m3_rne
    enc   = min(1 / (s_b * S_dec), FLT_MAX)               (with s_b: _block_scale)
    code  = e2m1_rne(min(|x| * enc, 6)) (+ 8 if x < 0)     (one magic add)           _rn_parts, _e2m1_rn
    |q|   = e2m1(code) in {0, .5, 1, 1.5, 2, 3, 4, 6}      (from the same add)        _rn_mag
    x̂     = ±|q| * fp32(fp32(s_b * amax) * fl(1/2688))    (TE's order, overflow-safe)  _decode_factor

plus ``_e2m1_value`` (code -> magnitude, for readers of packed bytes), ``_e4m3_decode`` (scale byte -> fp32)
and ``_sr_mag`` (TE's 8-bit stochastic rounding onto the E2M1 grid).

E2M1 rounding is one magic add, written once here (``_rn_parts``): with ``a = min(|y|, 6)``, ``E`` the
exponent of ``max(a, 1)`` and ``m = 2^(1 - E)`` (2 below 2: grid step 1/2; 1 in [2, 4): step 1; 1/2 in
[4, 6]: step 2), the E2M1 grid is the integer grid of ``a * m`` (exact: a power-of-two scaling), and::

    t    = a * m + (1.5 * 2^23 + 2E [+ 8 where y < 0])   (the fp32 ulp there is 1: RNE to an integer)
    code = bits(t) - bits(1.5 * 2^23)                    (the signed E2M1 code, 0..15)
    |q|  = (t - addend) * 2^(E - 1)                      (exact)

Worked example: a block of 16 values with max 6 in a tensor with amax 2688: S_enc = 1, s_b = e4m3(6/6) = 1
(byte 0x38), enc = 1. The value 5.0 has ``E = 2``, ``m = 1/2``, ``rint(2.5) = 2`` (a tie: to even), so its code
is ``2 + 2E = 6`` (4.0), which decodes to 4.0 * (1 * 2688 / 2688) = 4.0; -1.0 has ``E = 0``, ``m = 2``,
``rint(2) = 2`` and code ``2 + 8 = 10`` (-1.0).
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
MAGIC_BITS = tl.constexpr(0x4B400000)  # bits of 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer (RNE)


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
def _rn_parts(a, y, SIGNED: tl.constexpr):
    """E2M1 round-to-nearest-even of ``a`` in [0, 6] (sign from ``y``) by one FMA with a magic addend.

    With ``E = max(floor(log2 a), 0)`` (the exponent of ``max(a, 1)``, whose bits masked to the exponent
    field are ``p = (127 + E) << 23``) and ``m = 2^(1 - E)`` (``bits(m) = 0x7F800000 - p``) the E2M1 grid is
    the integer grid of ``a * m``. The addend ``c = 1.5 * 2^23 + 2E + 8 * (y < 0)`` (bits
    ``0x4B400000 + (p >> 22) - 254 [+ 8]``) is an even integer where the fp32 ulp is 1, so ``t = a * m + c``
    rounds ``a * m`` to an integer with ties to even, and ``bits(t) - 0x4B400000 = rint(a * m) + 2E +
    8 * (y < 0)`` is the signed E2M1 code. Returns ``(t, c, p)``; without ``SIGNED`` the 8 is left out.
    Callers that pack codes use ``bits(t)`` directly (``quantize_bf16``); the others call :func:`_e2m1_rn`.
    """
    p = tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000
    m = (0x7F800000 - p).to(tl.float32, bitcast=True)
    cb = (p >> 22) + (MAGIC_BITS - 254)
    if SIGNED:
        cb = tl.where(y < 0.0, cb + 8, cb)
    c = cb.to(tl.float32, bitcast=True)
    t = a * m + c
    return t, c, p


@triton.jit
def _rn_mag(t, c, p):
    """Rounded magnitude ``rint(a * m) / m`` (exact) from ``_rn_parts``: ``2^(E - 1)`` has bits
    ``p - 2^23``."""
    return (t - c) * (p - 0x800000).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_rn(a, y):
    """(signed E2M1 code 0..15, rounded magnitude) of ``a = min(|y|, 6)``, round to nearest even (TE's tie
    table: .25 -> 0, .75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); the sign bit is set where
    ``y < 0`` (so -0.0 keeps code 0, as the reference)."""
    t, c, p = _rn_parts(a, y, True)
    return t.to(tl.int32, bitcast=True) - MAGIC_BITS, _rn_mag(t, c, p)


@triton.jit
def _e2m1_value(c):
    """Magnitude of E2M1 code c in 0..7: 0, .5, 1, 1.5, 2, 3, 4, 6."""
    cf = c.to(tl.float32)
    return tl.where(c < 4, cf * 0.5, tl.where(c < 6, cf - 2.0, cf * 2.0 - 8.0))


@triton.jit
def _sr_step(a):
    return tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))


@triton.jit
def _sr_mag(a, r):
    """TE's 8-bit stochastic rounding of a = |v| (any a >= 0; a > 6 saturates) with random byte r: a point
    on the E2M1 grid (``_rn_parts`` of it is exact)."""
    u = r.to(tl.float32) * 0.00390625
    t = a + u * _sr_step(a)
    st = _sr_step(t)
    return tl.minimum(tl.floor(t * (1.0 / st)) * st, 6.0)


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

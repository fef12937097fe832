"""E8M0 power-of-two scales for MXFP8, RCEIL rounding (notes §7).

Byte ``b`` means ``2^(b-127)``; 255 is NaN. The encoder rounds UP to a power of two (cuBLAS/TE "RCEIL",
Blackwell ``cvt.rp.satfinite.ue8m0x2.f32``; not the OCP FLOOR rule) by reading the fp32 bit fields of v:

    b = exponent_field(v) + (mantissa_field(v) != 0)      for normal v, saturating at 254
    b = 1 if v > 2^-127 else 0                            for zero/subnormal v
    NaN -> 255, +inf -> 254 (satfinite)

Worked values for ``v = fp32(amax * fl(1/448))`` (block amax -> b, scale):
5.0 -> 121, 2^-6;  448 -> 127, 1;  448.5 -> 128, 2;  1.0 -> 119, 2^-8;  0.001 -> 109, 2^-18;  0 -> 0, 2^-127.
"""

from __future__ import annotations

import torch

E8M0_NAN = 255
E8M0_BIAS = 127


def e8m0_encode_rceil(v: torch.Tensor) -> torch.Tensor:
    """Encode non-negative fp32 ``v`` as E8M0 bytes (uint8), rounding up to a power of two (RCEIL)."""
    bits = v.to(torch.float32).abs().contiguous().view(torch.int32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = torch.clamp(exp + (mant != 0).to(torch.int32), max=254)
    subnormal = (mant > 0x400000).to(torch.int32)  # v > 2^-127 rounds up to 2^-126 (b=1), else b=0
    b = torch.where(exp == 0, subnormal, normal)
    b = torch.where(exp == 0xFF, torch.where(mant != 0, E8M0_NAN, 254), b)
    return b.to(torch.uint8)


def e8m0_decode(b: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 bytes to fp32 scales ``2^(b-127)`` (255 -> NaN)."""
    e = b.to(torch.int32) - E8M0_BIAS
    val = torch.ldexp(torch.ones(b.shape, dtype=torch.float64, device=b.device), e.to(torch.float64))
    return torch.where(b == E8M0_NAN, float("nan"), val).to(torch.float32)


def e8m0_inverse(b: torch.Tensor) -> torch.Tensor:
    """The exact fp32 reciprocal ``2^(127-b)`` of an E8M0 scale (b=254 -> 2^-127; 255 -> NaN)."""
    e = E8M0_BIAS - b.to(torch.int32)
    val = torch.ldexp(torch.ones(b.shape, dtype=torch.float64, device=b.device), e.to(torch.float64))
    return torch.where(b == E8M0_NAN, float("nan"), val).to(torch.float32)

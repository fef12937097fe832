"""FP8 E4M3 (``torch.float8_e4m3fn``) block-scale codec with explicit saturation.

NVFP4 block scales and MXFP8 data are E4M3 (report §2.2; notes §1.2, §7): 1 sign, 4 exponent (bias 7),
3 mantissa bits, no Inf, NaN = 0x7F/0xFF, largest finite 448, smallest subnormal 2^-9.

``e4m3_cast(v) = float8_e4m3fn(clamp(v, -448, 448))``: round to nearest even after clamping. The clamp is
required because torch's cast is not guaranteed to saturate (on CUDA 500 -> NaN; the notes measured it on
the H200), while the TE kernels use ``satfinite`` conversions. NaN stays NaN.

Worked values: 449 -> 448, 500 -> 448, 272 -> 256 (tie, even), 304 -> 320 (tie, even),
2^-10 -> 0 (tie between 0 and 2^-9), 1.5*2^-9 -> 2^-8, 282.24 -> 288 (byte 0x79).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
#: Smallest positive subnormal E4M3 value.
E4M3_MIN_SUBNORMAL = 2.0**-9


def e4m3_cast(v: torch.Tensor) -> torch.Tensor:
    """Saturating RNE cast of fp32 values to ``torch.float8_e4m3fn`` (clamp to +-448 first; NaN -> NaN)."""
    return v.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e4m3_decode(v: torch.Tensor) -> torch.Tensor:
    """Decode E4M3 (a ``float8_e4m3fn`` tensor, or its raw bytes as uint8) to fp32 exactly."""
    if v.dtype == torch.uint8:
        v = v.view(torch.float8_e4m3fn)
    return v.to(torch.float32)


def e4m3_table() -> torch.Tensor:
    """All 256 E4M3 byte values decoded to fp32 (index = byte; 0x7F and 0xFF are NaN)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)

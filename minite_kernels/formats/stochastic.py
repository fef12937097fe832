"""Stochastic rounding to E2M1 (gradients only), TE's software fallback with 8 random bits per element.

Notes §1.5 (TE ``ptx.cuh:stochastic_round_fp4_e2m1``). With ``a = |v|`` (v already clamped to [-6, 6]) and
``u = r8 / 256`` for a uniform random byte ``r8``::

    step(a) = 0.5 on [0, 2),  1 on [2, 4),  2 on [4, 6]
    t = a + u * step(a)
    q = min(floor(t / step(t)) * step(t), 6),  then the sign of v is restored

so ``a`` between grid points ``lo`` and ``lo + step`` rounds up with probability ``floor(256 f) / 256`` where
``f = (a - lo) / step``: unbiased up to the 8-bit resolution of ``u`` (the mean is at most ``step/256``
below ``a`` in magnitude). Grid values are kept exactly. Hardware SR (``cvt.rs.satfinite.e2m1x4.f32``,
Philox bits) is not reproducible bit-for-bit outside TE; test it statistically.

Worked example: v = 1.2 (lo = 1, step = .5, f = .4): r8 >= 154 gives t >= 1.5 -> 1.5, else 1.0;
P(1.5) = 102/256, mean = 1.19921875.
"""

from __future__ import annotations

import torch

from .e2m1 import E2M1_MAX


def random_bytes(
    shape: torch.Size | tuple[int, ...], *, generator: torch.Generator | None, device: torch.device | str
) -> torch.Tensor:
    """Uniform random bytes (uint8) from ``generator`` (the default generator of ``device`` when None)."""
    if generator is not None:
        device = generator.device
    return torch.randint(0, 256, tuple(shape), generator=generator, device=device, dtype=torch.uint8)


def _step(a: torch.Tensor) -> torch.Tensor:
    """Grid step at fp32 ``a`` in [0, 8): 0.5 below 2, 1 on [2, 4), 2 on [4, 8) = 2^(max(exponent(a), 0) - 1),
    read from the exponent bits (cheaper than nested ``where``)."""
    e = (a.contiguous().view(torch.int32) >> 23).clamp_(min=127)
    return ((e - 1) << 23).view(torch.float32)


def e2m1_round_stochastic(v: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """Stochastically round fp32 ``v`` to E2M1 *values* (fp32), using one random byte per element."""
    if rbits.shape != v.shape:
        raise ValueError(f"rbits shape {tuple(rbits.shape)} must equal the value shape {tuple(v.shape)}")
    v = v.to(torch.float32).clamp(-E2M1_MAX, E2M1_MAX)
    a = v.abs()
    u = rbits.to(torch.float32) * (1.0 / 256.0)
    t = a + u * _step(a)
    st = _step(t)
    q = torch.clamp(torch.floor(t / st) * st, max=E2M1_MAX)
    return torch.copysign(q, v)


def e2m1_encode_stochastic(v: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """Stochastically round fp32 ``v`` and return uint8 E2M1 codes (sign bit set iff ``v < 0``)."""
    qa = e2m1_round_stochastic(v, rbits).abs()
    # |q| is exactly on the grid {0,.5,1,1.5 | 2,3 | 4,6}: its code is 2|q|, |q|+2 or |q|/2+4 on the three
    # step regions. Keep the sign of v (a negative v that rounds to zero gets code 8, like the RN path).
    code = torch.where(qa < 2.0, qa * 2.0, torch.where(qa < 4.0, qa + 2.0, qa * 0.5 + 4.0)).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)

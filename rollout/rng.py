"""Per-row counter-based random streams: one uniform per (seed, row, step), the same on every device.

The sampler draws token ``t`` of row ``r`` with the uniform

    u(seed, r, t) = (hi >> 6) * 2^-26 + (lo >> 5) * 2^-53     (26 + 27 = 53 random bits, u in [0, 1))
    hi = h(h(seed_lo ^ h(seed_hi) ^ r * 0x9E3779B1 ^ 0x5BD1E995) ^ t * 0x85EBCA77)
    lo = h(hi ^ 0x68E31DA4)

where ``h`` is the 32-bit "lowbias32" integer hash (xor-shift, multiply, xor-shift, multiply, xor-shift) and all
arithmetic is modulo 2^32. It is a pure function of its three integers, so

- a draw does not depend on which rows share its batch, on batch compaction or on the device (CPU and CUDA
  compute the same bits: only integer ops), and a resumed run draws what the uninterrupted one drew;
- it runs inside a CUDA graph: the step counter is a device tensor and nothing touches a generator state.

The int64 ops keep every intermediate below 2^63: a 32 x 32-bit product is split into 16-bit halves.

Worked example: ``row_uniforms(0, torch.tensor([0, 1]), 0)`` gives two different numbers in [0, 1), and
``row_uniforms(0, torch.tensor([1]), 0)`` gives the second of them again.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for int64 ``x`` in [0, 2^32) and a constant ``c`` < 2^32, without int64 overflow."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & _M32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons' integer-hash search): a bijection of [0, 2^32) with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seed_word(seed: int) -> int:
    """Fold a Python int seed (any size, any sign) into the 32-bit stream key."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    hi = int(hash32(torch.tensor([s >> 32], dtype=torch.int64)).item())
    return (s & _M32) ^ hi


def row_uniforms(seed: int | torch.Tensor, rows: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """fp64 uniforms in [0, 1), one per entry of ``rows`` (int64 row ids), for token index ``step``.

    ``seed`` is a Python int (folded by :func:`seed_word`) or an int64 tensor already holding the folded key;
    ``step`` a Python int or an int64 device tensor (a graph's step counter)."""
    key = seed if isinstance(seed, torch.Tensor) else seed_word(seed)
    x = hash32((rows.to(torch.int64) * 0x9E3779B1 & _M32) ^ key ^ 0x5BD1E995)
    x = hash32(x ^ (_mul32(torch.as_tensor(step, dtype=torch.int64, device=rows.device) & _M32, 0x85EBCA77)))
    y = hash32(x ^ 0x68E31DA4)
    return (x >> 6).double() * 2.0**-26 + (y >> 5).double() * 2.0**-53

"""FP4 E2M1 codec: round-to-nearest-even encoding, decoding, nibble packing.

E2M1 (report §2.2, "NVFP4 encoding and two-level scaling"; notes §1.1) has 1 sign, 2 exponent and 1 mantissa
bit. Code ``c`` in 0..7 decodes to ``E2M1_VALUES[c] = (0, .5, 1, 1.5, 2, 3, 4, 6)``; codes 8..15 are the same
magnitudes with the sign bit set (8 is -0). There is no Inf/NaN; the largest magnitude is 6.

Round to nearest, ties to even mantissa (= even code), with saturation, exactly as TE's reference
``cast_to_fp4x2`` (inclusive/exclusive bounds alternate so that every tie lands on the even code)::

    |v| in [0, .25] -> 0      (.25, .75) -> .5     [.75, 1.25] -> 1    (1.25, 1.75) -> 1.5
           [1.75, 2.5] -> 2   (2.5, 3.5) -> 3      [3.5, 5] -> 4       (5, inf] -> 6

The sign bit is set when ``v < 0`` (strictly): ``-0.0`` encodes to code 0 like TE's reference, while a
negative value that rounds to zero, e.g. -0.1, gives code 8 ("-0"). Both decode to zero.

Packing: ``byte = code[2j] | code[2j+1] << 4`` (the even element in the low nibble; TE, torchao,
FlashInfer and vLLM agree).

Worked example: ``e2m1_encode(tensor([0.25, 0.75, 2.5, -5.5, -0.1]))`` gives codes ``[0, 2, 4, 15, 8]``;
``pack_nibbles`` of codes ``[0, 8, 1, 1]`` gives bytes ``[0x80, 0x11]``.
"""

from __future__ import annotations

import functools

import torch

#: Decoded value of each 4-bit code (index = code); code 8 is -0.0.
E2M1_VALUES: tuple[float, ...] = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
E2M1_MAX = 6.0
#: Rounding thresholds on |v|, with whether the threshold itself rounds up (True: ``>=``; False: ``>``).
E2M1_THRESHOLDS: tuple[tuple[float, bool], ...] = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)


def e2m1_table(device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 decoded E2M1 values as a tensor (index = code)."""
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def _cached_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``e2m1_table`` built once per (device, dtype): no host-to-device copy per decode, which a CUDA graph
    capture would refuse (the warm-up before a capture builds it). Internal and never written to."""
    return e2m1_table(device, dtype)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Encode already-scaled fp32 values to E2M1 codes (uint8, one code per element), RNE with saturation.

    Values are clamped to [-6, 6] first (so +-inf saturate to code 7/15). NaN encodes to code 0; callers
    that can see NaN handle it before (see ``nvfp4`` for the documented NaN/Inf rule).
    """
    v = v.to(torch.float32)
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for threshold, inclusive in E2M1_THRESHOLDS:
        code += (a >= threshold) if inclusive else (a > threshold)
    return code | ((v < 0).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode uint8 E2M1 codes (0..15, one per element) to ``dtype``."""
    return _cached_table(codes.device, dtype)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes ``[..., K]`` (K even) into bytes ``[..., K//2]``: even element in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dim, got {codes.shape[-1]}")
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(data: torch.Tensor) -> torch.Tensor:
    """Unpack bytes ``[..., K//2]`` into codes ``[..., K]`` (inverse of :func:`pack_nibbles`)."""
    data = data.to(torch.uint8)
    return torch.stack((data & 0x0F, data >> 4), dim=-1).reshape(*data.shape[:-1], data.shape[-1] * 2)

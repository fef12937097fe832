"""Exact NVFP4 / MXFP8 numerics in pure PyTorch (CPU-exact; the reference every fast path is tested against).

Report §2.2 (NVFP4 encoding and two-level scaling, ``x̂ = q · s_b · s_g``) and §5.1 (per-token outer scale);
the formulas are TE's reference numerics (project notes "nvfp4-numerics" §1–§2 and §7), restated in each module:

- ``e2m1``: FP4 E2M1 codes (RNE with TE's tie table), decode table, nibble packing (even element low).
- ``e4m3``: saturating E4M3 cast (clamp to ±448 before the cast) and decode.
- ``e8m0``: RCEIL power-of-two scales for MXFP8.
- ``stochastic``: TE's software stochastic rounding to E2M1 (8 random bits per element).
- ``rht``: the fixed 16-point random Hadamard transform (bf16).
- ``nvfp4``: :func:`quantize_nvfp4` -> :class:`NVFP4Tensor` (per-tensor / per-token amax, 1x16 / 16x16 tiles).
- ``mxfp8``: :func:`quantize_mxfp8` -> :class:`MXFP8Tensor`.
- ``swizzle``: the 128x4 block-scale layout of Blackwell GEMMs.

Worked example (notes §1.9): with tensor amax 10 and block amax 6.3 the block scale is E4M3 288 (byte 0x79),
``x = 1.0`` is stored as code 2 and decodes to ``2 * 0.5 * 288 * 10 / 2688 = 1.0714285``.
"""

from __future__ import annotations

from .e2m1 import E2M1_MAX, E2M1_VALUES, e2m1_decode, e2m1_encode, e2m1_table, pack_nibbles, unpack_nibbles
from .e4m3 import E4M3_MAX, e4m3_cast, e4m3_decode, e4m3_table
from .e8m0 import e8m0_decode, e8m0_encode_rceil, e8m0_inverse
from .mxfp8 import MXFP8_BLOCK, MXFP8Tensor, quantize_mxfp8
from .nvfp4 import (
    FLT_MAX,
    NVFP4_BLOCK,
    ROUNDINGS,
    SCALINGS,
    TILES,
    NVFP4Tensor,
    block_scales,
    dequant_factor,
    global_encode_scale,
    quantize_nvfp4,
)
from .rht import RHT_SIGNS, apply_rht, hadamard_matrix, inverse_rht, rht_matrix
from .stochastic import e2m1_encode_stochastic, e2m1_round_stochastic, random_bytes
from .swizzle import swizzle_scales_128x4, swizzled_shape, unswizzle_scales_128x4

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "FLT_MAX",
    "MXFP8_BLOCK",
    "NVFP4_BLOCK",
    "RHT_SIGNS",
    "ROUNDINGS",
    "SCALINGS",
    "TILES",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "apply_rht",
    "block_scales",
    "dequant_factor",
    "e2m1_decode",
    "e2m1_encode",
    "e2m1_encode_stochastic",
    "e2m1_round_stochastic",
    "e2m1_table",
    "e4m3_cast",
    "e4m3_decode",
    "e4m3_table",
    "e8m0_decode",
    "e8m0_encode_rceil",
    "e8m0_inverse",
    "global_encode_scale",
    "hadamard_matrix",
    "inverse_rht",
    "pack_nibbles",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "random_bytes",
    "rht_matrix",
    "swizzle_scales_128x4",
    "swizzled_shape",
    "unpack_nibbles",
    "unswizzle_scales_128x4",
]

"""Swizzled 128x4 block-scale layout consumed by Blackwell block-scaled GEMMs (cuBLAS, TE, FlashInfer).

Notes §1.3. Scales ``[M, Kb]`` (Kb = K/16 for NVFP4, K/32 for MXFP8) are zero-padded to
``[Mp, Kbp] = [roundup(M, 128), roundup(Kb, 4)]`` and stored so that element (m, kb) lands at flat index::

    idx(m, kb) = (m // 128) * (Kbp / 4) * 512 + (kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4

i.e. the padded matrix viewed as ``(Mp/128, 4, 32, Kbp/4, 4)`` is permuted to ``(0, 3, 2, 1, 4)``.
:func:`swizzle_scales_128x4` returns a contiguous ``[Mp, Kbp]`` tensor whose flat memory is in that order
(TE's scale shape); :func:`unswizzle_scales_128x4` inverts it and drops the padding.

Worked example: M=130, Kb=7 -> padded to [256, 8]; scale (m=33, kb=6) lands at flat index
0*2*512 + 1*512 + 1*16 + 1*4 + 2 = 534, i.e. row 66, column 6 of the swizzled [256, 8] tensor.
"""

from __future__ import annotations

import torch


def _roundup(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzled_shape(m: int, kb: int) -> tuple[int, int]:
    """Padded shape ``(roundup(M,128), roundup(Kb,4))`` of the swizzled scale tensor."""
    return _roundup(m, 128), _roundup(kb, 4)


def swizzle_scales_128x4(scales: torch.Tensor) -> torch.Tensor:
    """Swizzle row-major scales ``[M, Kb]`` (any 1-byte dtype, e.g. float8_e4m3fn or uint8 E8M0) to 128x4."""
    if scales.dim() != 2:
        raise ValueError(f"swizzle_scales_128x4 expects 2-D scales [M, Kb], got shape {tuple(scales.shape)}")
    if scales.element_size() != 1:
        raise TypeError(
            f"swizzle_scales_128x4 expects 1-byte scales (float8_e4m3fn or uint8), got {scales.dtype}"
        )
    m, kb = scales.shape
    mp, kbp = swizzled_shape(m, kb)
    raw = scales.contiguous().view(torch.uint8)
    padded = torch.zeros((mp, kbp), dtype=torch.uint8, device=scales.device)
    padded[:m, :kb] = raw
    out = padded.view(mp // 128, 4, 32, kbp // 4, 4).permute(0, 3, 2, 1, 4).contiguous().view(mp, kbp)
    return out.view(scales.dtype)


def unswizzle_scales_128x4(swizzled: torch.Tensor, m: int, kb: int) -> torch.Tensor:
    """Invert :func:`swizzle_scales_128x4`: swizzled scales (2-D ``[Mp, Kbp]`` or flat) -> ``[M, Kb]``."""
    mp, kbp = swizzled_shape(m, kb)
    if swizzled.numel() != mp * kbp:
        raise ValueError(
            f"swizzled scales have {swizzled.numel()} elements; M={m}, Kb={kb} need {mp}x{kbp}={mp * kbp}"
        )
    if swizzled.element_size() != 1:
        raise TypeError(f"unswizzle_scales_128x4 expects 1-byte scales, got {swizzled.dtype}")
    raw = swizzled.contiguous().view(torch.uint8).reshape(mp // 128, kbp // 4, 32, 4, 4)
    out = raw.permute(0, 3, 2, 1, 4).reshape(mp, kbp)[:m, :kb].contiguous()
    return out.view(swizzled.dtype)

"""The weight sync's writer of the FP4-weight layout: one launch turns a quantized weight's NVFP4 bytes and E4M3
block scales into the codes and E5M3 scales that ``fp4w``'s GEMM reads, in place.

The layout is ``fp4w``'s (its module docstring; :func:`~minite_kernels.backends.triton.fp4w.pack_codes` and
:func:`~minite_kernels.backends.triton.fp4w.pack_scales` are the pure-PyTorch reference, and the tests check this
kernel against them byte for byte). For 16-row group ``R``, 64-value tile ``T``, lane ``4i + t`` and K step ``s``,
the packed word takes the four source bytes::

    byte[h][e] = data[16R + 8h + i, 32T + 8s + 4e + t]       (low nibble p = 0, high nibble p = 1)
    word       = OR over h, e, p of bits(r = h + 2e, p, nibble p of byte[h][e])

with ``bits`` the placement of ``fp4w._e2m1_bits`` and ``byte[h][*] = 0`` where row ``16R + 8h + i``'s block
``4T + s`` has scale 0 (``FP4Weight.copy_rows_``' rule, so that the E5M3 byte 0 never decodes a non-zero code).
The scales go to ``out[R, 64T + 8i + 2s + h] = e5m3(scale[16R + 8h + i, 4T + s])`` through ``fp4w``'s 256-byte
table.

Worked example: a weight whose only non-zero value is code 7 (q = 6) at (row 0, column 0), scale 1.0 (E4M3 0x38):
R = T = i = t = s = 0, byte[0][0] = 0x07, so word 0 = bits(0, 0, 7) = 7 << 6 = 0x1C0 and the codes start
``C0 01 00 00``; the scale byte at (0, 0) becomes 0x50, as in ``fp4w``'s worked example.

Why a kernel: the PyTorch reference runs about fifty elementwise integer kernels per linear; before each batch
the sampler's refresh repacks every quantized linear of the model, so at the Qwen3-4B shape (252 linears) that
is about 13,000 launches, where this is one per linear.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: 64-value tiles per program
TILES = 4


@triton.jit
def _place(code, R: tl.constexpr, P: tl.constexpr):
    """E2M1 ``code`` (int32, 0..15) at fragment register R's half P of a packed word (``fp4w._e2m1_bits``)."""
    sign = (code >> 3) & 1
    mag = code & 7
    o: tl.constexpr = 16 * P
    if R < 3:
        bits = (sign << (15 - 3 * R + o)) | (mag << (6 - 3 * R + o))
    else:
        bits = (sign << (14 + o)) | ((mag >> 2) << (13 + o)) | ((mag & 3) << (10 + o))
    return bits


@triton.jit
def _byte_bits(byte, R: tl.constexpr):
    """Both nibbles of a source byte (p = 0 low, p = 1 high) placed as fragment register R."""
    return _place(byte & 15, R, 0) | _place((byte >> 4) & 15, R, 1)


@triton.jit
def _pack_kernel(data_ptr, scales_ptr, lut_ptr, codes_ptr, out_scales_ptr, K, g0, TILES: tl.constexpr):
    """Grid (groups, K / (64 TILES)). ``data`` u8 [n, K/2] and ``scales`` u8 [n, K/16] of one linear; writes
    groups ``g0 + program_id(0)`` of ``codes`` (as int32 words, [groups, 2K]) and ``out_scales`` u8 [groups, K]."""
    r = tl.program_id(0)
    t0 = tl.program_id(1) * TILES
    kh = K // 2
    kb = K // 16
    # [TILES, 8 (i), 4 (t), 4 (s)]: one packed word each
    tile = t0 + tl.arange(0, TILES)[:, None, None, None]
    i = tl.arange(0, 8)[None, :, None, None]
    t = tl.arange(0, 4)[None, None, :, None]
    s = tl.arange(0, 4)[None, None, None, :]
    row0 = r * 16 + i
    row1 = row0 + 8
    col = tile * 32 + s * 8 + t  # byte of e = 0; e = 1 is 4 further
    blk = tile * 4 + s
    sc0 = tl.load(scales_ptr + row0 * kb + blk).to(tl.int32)
    sc1 = tl.load(scales_ptr + row1 * kb + blk).to(tl.int32)
    b00 = tl.where(sc0 == 0, 0, tl.load(data_ptr + row0 * kh + col).to(tl.int32))
    b01 = tl.where(sc0 == 0, 0, tl.load(data_ptr + row0 * kh + col + 4).to(tl.int32))
    b10 = tl.where(sc1 == 0, 0, tl.load(data_ptr + row1 * kh + col).to(tl.int32))
    b11 = tl.where(sc1 == 0, 0, tl.load(data_ptr + row1 * kh + col + 4).to(tl.int32))
    word = _byte_bits(b00, 0) | _byte_bits(b10, 1) | _byte_bits(b01, 2) | _byte_bits(b11, 3)
    g = g0 + r
    words = codes_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    tl.store(words + g * (2 * K) + tile * 128 + (i * 4 + t) * 4 + s, word)
    # scales: out[g, 64 T + 8 i + 2 s + h]
    sdst = out_scales_ptr + g * K + tile * 64 + i * 8 + s * 2
    tl.store(sdst, tl.load(lut_ptr + sc0).to(tl.uint8))
    tl.store(sdst + 1, tl.load(lut_ptr + sc1).to(tl.uint8))


def pack_into(
    codes: torch.Tensor, scales_out: torch.Tensor, group: int, data: torch.Tensor, scales: torch.Tensor,
    lut: torch.Tensor,
) -> None:
    """Write one linear's NVFP4 ``data`` u8 [n, K/2] and E4M3 ``scales`` [n, K/16] into groups ``group ..
    group + n/16`` of ``codes`` u8 [G, 8K] and ``scales_out`` u8 [G, K] (``lut``: ``fp4w``'s E4M3 -> E5M3 table on
    the same device). Shapes are the caller's to check (``FP4Weight.copy_rows_``)."""
    n, kh = data.shape
    k = 2 * kh
    data = data.contiguous()
    sc = scales.contiguous().view(torch.uint8)
    tiles = next(t for t in (TILES, 2, 1) if (k // 64) % t == 0)
    _pack_kernel[(n // 16, k // (64 * tiles))](data, sc, lut, codes, scales_out, k, group, TILES=tiles)


__all__ = ["TILES", "pack_into"]

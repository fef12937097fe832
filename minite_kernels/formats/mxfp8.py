"""MXFP8 quantization: E4M3 data with one E8M0 power-of-two scale per 32 elements along K (TE-exact).

Notes §7 (TE ``quantize_mxfp8.cuh``; a candidate backward precision, report §4.3/§7.2). Per 1x32 block, fp32::

    amax = max|x| over the block
    b    = e8m0_rceil(fp32(amax * fl(1/448)))     round UP to a power of two (see ``e8m0``); 0 -> 0
    inv  = 2^(127 - b)                            exact (b = 254 -> 2^-127)
    q    = e4m3_rne(clamp(x * inv, -448, 448))    |x * inv| <= 448 by construction
    x̂    = float(q) * 2^(b - 127)

Storage: ``data`` float8_e4m3fn ``[M, K]``, ``scales`` uint8 E8M0 ``[M, K//32]`` row-major unswizzled
(``swizzle.swizzle_scales_128x4`` gives the GEMM layout).

Shapes and bad input follow ``nvfp4``: quantization along the last dim K (a positive multiple of 32, else
ValueError), 1-D = one row, >2-D flattened into rows, ``dequantize()`` returns the input's shape; a
non-floating dtype raises TypeError naming the valid dtypes; ``block`` must be 32 (the MX block size).
NaN/Inf: the scaling domain is the 32-element block; a block holding a NaN or ±Inf gets the E8M0 NaN scale
(255) and E4M3 NaN data, so it dequantizes to NaN (``nonfinite_blocks`` records it); other blocks are
unaffected.

Worked values (block amax -> scale byte, scale): 5.0 -> 121, 2^-6 (5.0 is stored as 320);
448 -> 127, 1; 448.5 -> 128, 2; 1.0 -> 119, 2^-8; 0.001 -> 109, 2^-18 (0.001 is stored as 256); 0 -> 0, 2^-127.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..capture import any_or_capturing
from ._validate import as_rows, check_choice, check_float_tensor
from .e4m3 import E4M3_MAX, e4m3_cast
from .e8m0 import E8M0_NAN, e8m0_decode, e8m0_encode_rceil, e8m0_inverse

MXFP8_BLOCK = 32


@dataclass
class MXFP8Tensor:
    """MXFP8-quantized 2-D view ``[M, K]``: ``data`` float8_e4m3fn [M, K], ``scales`` uint8 E8M0 [M, K//32]."""

    data: torch.Tensor
    scales: torch.Tensor
    shape: torch.Size
    orig_dtype: torch.dtype = torch.float32
    block: int = MXFP8_BLOCK

    def to(self, device: torch.device | str) -> MXFP8Tensor:
        """A copy with every tensor moved to ``device``."""
        return replace(self, data=self.data.to(device), scales=self.scales.to(device))

    @property
    def nonfinite_blocks(self) -> torch.Tensor:
        """Bool [M, K//32]: blocks poisoned by a NaN/Inf input (scale byte 255)."""
        return self.scales == E8M0_NAN

    def scales_f32(self) -> torch.Tensor:
        """Decoded scales ``2^(b-127)`` as fp32 [M, K//32] (NaN for byte 255)."""
        return e8m0_decode(self.scales)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``x̂ = float(q) * 2^(b-127)`` in fp32, cast to ``dtype``, in the input's shape."""
        m, k = self.data.shape
        q = self.data.to(torch.float32).view(m, k // self.block, self.block)
        return (q * self.scales_f32().unsqueeze(-1)).reshape(self.shape).to(dtype)

    def __repr__(self) -> str:
        return (
            f"MXFP8Tensor(shape={tuple(self.shape)}, orig_dtype={self.orig_dtype}, device={self.data.device})"
        )


def quantize_mxfp8(x: torch.Tensor, *, block: int = MXFP8_BLOCK) -> MXFP8Tensor:
    """Quantize ``x`` to MXFP8 (E4M3 data, RCEIL E8M0 scales per 32 elements) along its last dim."""
    check_float_tensor(x, "quantize_mxfp8")
    check_choice("block", block, (MXFP8_BLOCK,))
    orig_shape, orig_dtype = x.shape, x.dtype
    x2 = as_rows(x, block, "quantize_mxfp8")
    m, k = x2.shape
    xb = x2.view(m, k // block, block)
    amax = xb.abs().amax(dim=-1)  # NaN/Inf propagate: a non-finite block amax marks a poisoned block
    bad = ~torch.isfinite(amax)  # [M, K//32]
    if any_or_capturing(bad):  # captured: taken always, exact on finite input
        xb = torch.where(torch.isfinite(xb), xb, torch.zeros((), dtype=torch.float32, device=x2.device))
        amax = xb.abs().amax(dim=-1)
    v = amax * torch.full((), 1.0 / E4M3_MAX, dtype=torch.float32, device=x2.device)  # a fill: capturable
    b = e8m0_encode_rceil(v)
    q = e4m3_cast(xb * e8m0_inverse(b).unsqueeze(-1))

    b = torch.where(bad, torch.full((), E8M0_NAN, dtype=torch.uint8, device=x2.device), b)
    q = torch.where(bad.unsqueeze(-1), torch.full((), float("nan"), device=x2.device), q.to(torch.float32))
    q = q.to(torch.float8_e4m3fn)  # exact: q already holds E4M3 values (or NaN)
    return MXFP8Tensor(
        data=q.view(m, k), scales=b.contiguous(), shape=orig_shape, orig_dtype=orig_dtype, block=block
    )

"""The Triton backend's quantized tensor: a ``formats.NVFP4Tensor`` that also carries GEMM operands made by the
same kernel launch. Made by :class:`~minite_kernels.backends.triton.backend.TritonBackend` (``quantize``,
``quantize_token_deq``) and by the grouped weight re-quantizer (``weight_sync.WeightRequantizer``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minite_kernels.formats import NVFP4Tensor

from ._common import kernel_device_ok
from .quantize import dequantize_nvfp4_triton

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(repr=False)
class TritonNVFP4Tensor(NVFP4Tensor):
    """``NVFP4Tensor`` plus GEMM operands made by the same kernel launch (same bytes, same meaning):
    ``deq`` (BF16 dequantized values) and ``qs`` (exact BF16 ``e2m1 * s_b``), either may be None."""

    qs: torch.Tensor | None = None
    deq: torch.Tensor | None = None
    qs_transient: bool = False
    #: the E2M1 codes as the pair decode kernel's fp16 pair words [rows, 8, cols/16] (decode-sized inputs)
    qs_decode: torch.Tensor | None = None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.deq is not None and dtype == torch.bfloat16:
            deq = self.deq
            return deq if deq.shape == self.shape else deq.reshape(self.shape)
        if not kernel_device_ok(self.data):
            return super().dequantize(dtype)
        out = dequantize_nvfp4_triton(
            self.data,
            self.scales,
            self.amax,
            per_token=self.scaling == "per_token",
            dtype=torch.float32 if dtype not in _KERNEL_DTYPES else dtype,
        )
        if out.shape != self.shape:
            out = out.reshape(self.shape)
        return out if out.dtype == dtype else out.to(dtype)

    def exact_operand(self) -> torch.Tensor:
        """The BF16 ``qs`` operand (recomputed from the packed bytes if it was dropped)."""
        qs = self.qs
        if qs is None:
            qs = dequantize_nvfp4_triton(self.data, self.scales, None, per_token=False, dtype=torch.bfloat16)
            if not self.qs_transient:
                self.qs = qs
        elif self.qs_transient:
            self.qs = None
        return qs


__all__ = ["TritonNVFP4Tensor"]

"""Emulated backend: the pure-PyTorch reference every other backend is tested against.

``quantize`` calls ``minite_kernels.formats`` (TE-exact NVFP4 / MXFP8 codecs, notes §1.2, §7);
``qgemm_nt`` dequantizes both operands to FP32 and multiplies in FP32::

    Y = dequant(Q_a(a)) @ dequant(Q_b(b))ᵀ            (fp32 accumulate, then cast to out_dtype)

which equals TE's reference GEMM (sum over 16-blocks of ``outer(s_a, s_b) * (q_a @ q_bᵀ)`` times
``alpha = amax_a * amax_b / (36 * 448²)``) up to FP32 summation order. Runs on any device, including
CPU; on CUDA the FP32 matmul is kept in full FP32 (TF32 is disabled for the call).
"""

from __future__ import annotations

import torch

from minite_kernels.backends.base import Backend, QuantizedOperand, dequantize_operand
from minite_kernels.recipes import OperandSpec


class EmulatedBackend(Backend):
    name = "emulated"

    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        return (
            True,
            "emulated: pure PyTorch reference (quantize -> dequantize -> FP32 matmul), runs everywhere",
        )

    def supports_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
        return True, "emulated: quantize -> dequantize -> FP32 matmul (reference numerics)"

    def _quantize(self, x2d: torch.Tensor, spec: OperandSpec, *, generator=None) -> QuantizedOperand:
        from minite_kernels import formats

        if spec.format == "nvfp4":
            return formats.quantize_nvfp4(
                x2d,
                scaling=spec.scaling,
                tile=spec.tile,
                rounding="stochastic" if spec.stochastic_rounding else "nearest",
                rht=spec.rht,
                generator=generator,
            )
        if spec.format == "mxfp8":
            return formats.quantize_mxfp8(x2d, block=spec.tile[1])
        raise ValueError(
            f"emulated backend: cannot quantize format {spec.format!r}"
        )  # bf16 never reaches here

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype: torch.dtype) -> torch.Tensor:
        a = dequantize_operand(qa, torch.float32)
        b = dequantize_operand(qb, torch.float32)
        if a.is_cuda:
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            try:
                out = a @ b.t()
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev
        else:
            out = a @ b.t()
        return out.to(out_dtype)

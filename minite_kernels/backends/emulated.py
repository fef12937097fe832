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
        b = _dequantize_b(qb)
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


def _dequantize_b(qb) -> torch.Tensor:
    """FP32 values of the B operand. On CPU the result is memoised on the quantized object: B is usually a
    cached weight (re-quantized only when the parameter changes), and re-dequantizing it at every decode step
    cost ~60% of an emulated linear. The memo dies with the object, so it can never go stale; on CUDA nothing is
    memoised (it would double weight memory; the Triton backend is the fast path there)."""
    if isinstance(qb, torch.Tensor) or qb.data.device.type != "cpu":
        return dequantize_operand(qb, torch.float32)
    memo = getattr(qb, "_emulated_fp32", None)
    if memo is None:
        memo = dequantize_operand(qb, torch.float32)
        try:
            object.__setattr__(qb, "_emulated_fp32", memo)
        except AttributeError:  # an operand type with __slots__: just don't memoise
            pass
    return memo

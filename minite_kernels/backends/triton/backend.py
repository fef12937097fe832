"""The Triton backend: exact NVFP4 emulation on Hopper/Ampere tensor cores (report §4.2, §5.1; notes §1.4, §2).

- ``quantize``: the fused Triton quantizer (``quantize.py``), byte-identical to ``minite_kernels.formats``
  (data, scales, amax), including stochastic rounding (the same random bytes, drawn from the same generator
  as the reference) and RHT (the reference's bf16 transform, then the kernel). It returns a
  :class:`TritonNVFP4Tensor`: a ``formats.NVFP4Tensor`` that also carries ``qs = e2m1 * s_b`` in BF16 (the
  exact GEMM operand) and dequantizes with a Triton kernel (bit-equal to the reference).
- ``qgemm_nt``: ``(qs_a @ qs_bᵀ) * amax_a * amax_b / 2688²`` on BF16 tensor cores with FP32 accumulation
  (``gemm.py``), the outer scales in the epilogue.
- Everything else (MXFP8, CPU tensors, float64 GEMMs) goes to the emulated backend, with a one-time warning
  when it is a call the Triton path would normally take.

``qs`` lifetime: for operands quantized per tensor with round-to-nearest (weights, cached once per optimizer
step) ``qs`` is kept; for per-token activations and gradients it is dropped after the GEMM consumed it (the
packed bytes remain; a later GEMM recomputes ``qs`` from them), so a saved activation costs 4.5 bits/value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minite_kernels.backends.base import Backend, QuantizedOperand, capability_str, cuda_capability
from minite_kernels.formats import NVFP4Tensor
from minite_kernels.recipes import OperandSpec

from ._common import kernel_device_ok, triton_import_status, warn_once
from .gemm import scaled_mm_nt
from .quantize import dequantize_nvfp4_triton, quantize_nvfp4_triton

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(repr=False)
class TritonNVFP4Tensor(NVFP4Tensor):
    """``NVFP4Tensor`` plus the BF16 GEMM operand ``qs = e2m1 * s_b`` (exact); same bytes, same meaning."""

    qs: torch.Tensor | None = None
    qs_transient: bool = False

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if not kernel_device_ok(self.data):
            return super().dequantize(dtype)
        out = dequantize_nvfp4_triton(
            self.data,
            self.scales,
            self.amax,
            per_token=self.scaling == "per_token",
            dtype=torch.float32 if dtype not in _KERNEL_DTYPES else dtype,
        )
        return out.reshape(self.shape).to(dtype)

    def gemm_operand(self) -> torch.Tensor:
        """The BF16 ``qs`` operand (computed from the packed bytes if it was dropped)."""
        qs = self.qs
        if qs is None:
            qs = dequantize_nvfp4_triton(self.data, self.scales, None, per_token=False, dtype=torch.bfloat16)
            if not self.qs_transient:
                self.qs = qs
        elif self.qs_transient:
            self.qs = None
        return qs


def _gemm_operand(q: QuantizedOperand) -> tuple[torch.Tensor, torch.Tensor]:
    """(BF16 operand, fp32 outer amax [1] or [rows]) of a quantized (or BF16) GEMM operand."""
    if isinstance(q, torch.Tensor):  # a bf16-spec operand: amax 2688 makes the epilogue factor 1/2688
        return q, torch.full((1,), 2688.0, dtype=torch.float32, device=q.device)
    if isinstance(q, TritonNVFP4Tensor):
        return q.gemm_operand(), q.amax
    if isinstance(q, NVFP4Tensor):  # made by another backend (e.g. a cached weight): decode once, memoise
        qs = getattr(q, "_minite_qs", None)
        if qs is None or qs.device != q.data.device:
            qs = dequantize_nvfp4_triton(q.data, q.scales, None, per_token=False, dtype=torch.bfloat16)
            object.__setattr__(q, "_minite_qs", qs)
        return qs, q.amax
    raise TypeError(f"triton backend: unsupported GEMM operand {type(q).__name__}")


class TritonBackend(Backend):
    name = "triton"

    def __init__(self, device=None) -> None:
        super().__init__(device)
        from minite_kernels.backends.emulated import EmulatedBackend

        self._fallback = EmulatedBackend(device)

    # --- capability ------------------------------------------------------------------------------
    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        ok, why = triton_import_status()
        if not ok:
            return False, f"triton: {why}"
        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type != "cuda":
            return False, (
                f"triton: kernels need a CUDA GPU (sm_80+); device is {dev} "
                "(TRITON_INTERPRET=1 runs them on CPU for tests only)"
            )
        cap = cuda_capability(dev)
        if cap is None:
            return False, "triton: kernels need a CUDA GPU (sm_80+); no CUDA device is visible"
        if cap < (8, 0):
            return (
                False,
                f"triton: kernels need BF16 tensor cores (sm_80+); this GPU is {capability_str(cap)}",
            )
        return True, (
            f"triton: exact NVFP4 emulation on {capability_str(cap)} BF16 tensor cores "
            f"(fused quantize, FP32-accumulate GEMM with scales in the epilogue; {why})"
        )

    def supports_quantize(self, spec: OperandSpec) -> tuple[bool, str]:
        if spec.format != "nvfp4":
            return False, f"triton: only NVFP4 quantization has kernels ({spec.format} -> emulated)"
        return True, f"triton: fused NVFP4 quantize ({spec.summary()})"

    def supports_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
        fmts = {a_spec.format, b_spec.format}
        if not fmts <= {"nvfp4", "bf16"} or "nvfp4" not in fmts:
            return False, f"triton: NVFP4 GEMMs only ({a_spec.summary()} x {b_spec.summary()})"
        return True, (
            f"triton: {a_spec.summary()} x {b_spec.summary()} as BF16 tensor-core GEMM on exact "
            "q*s_b operands, FP32 accumulate, outer scales in the epilogue"
        )

    # --- hooks -----------------------------------------------------------------------------------
    def _kernel_ok(self, x: torch.Tensor) -> bool:
        return kernel_device_ok(x) and (x.dtype in _KERNEL_DTYPES or x.dtype == torch.float64)

    def _quantize(self, x2d: torch.Tensor, spec: OperandSpec, *, generator=None) -> QuantizedOperand:
        if not self._kernel_ok(x2d):
            warn_once(
                f"q-{x2d.device.type}-{x2d.dtype}",
                f"triton backend: cannot run kernels on a {x2d.device.type} {x2d.dtype} tensor; "
                "using the emulated (pure PyTorch) quantizer for such inputs",
            )
            return self._fallback._quantize(x2d, spec, generator=generator)
        from minite_kernels import formats

        orig_shape, orig_dtype = x2d.shape, x2d.dtype
        x = x2d
        if spec.rht:
            x = formats.apply_rht(x)  # bf16 [M, K], as the reference (notes §1.6)
        elif x.dtype == torch.float64:
            x = x.to(torch.float32)
        m, k = x.shape
        if spec.tile == (16, 16) and m % 16:
            return self._fallback._quantize(x2d, spec, generator=generator)
        rbits = None
        if spec.stochastic_rounding:
            rbits = formats.random_bytes((m, k), generator=generator, device=x.device)
        per_token = spec.scaling == "per_token"
        data, scales, amax, qs = quantize_nvfp4_triton(
            x,
            per_token=per_token,
            tile16=spec.tile == (16, 16),
            rbits=rbits,
            write_packed=True,
            write_qs=True,
        )
        transient = per_token or spec.stochastic_rounding or spec.rht
        return TritonNVFP4Tensor(
            data=data,
            scales=scales,
            amax=amax,
            shape=orig_shape,
            scaling=spec.scaling,
            tile=tuple(spec.tile),
            rounding="stochastic" if spec.stochastic_rounding else "nearest",
            rht=bool(spec.rht),
            orig_dtype=orig_dtype,
            qs=qs,
            qs_transient=transient,
        )

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype: torch.dtype) -> torch.Tensor:
        ref = qa if isinstance(qa, torch.Tensor) else qa.data
        plain_ok = all(not isinstance(q, torch.Tensor) or q.dtype == torch.bfloat16 for q in (qa, qb))
        if not kernel_device_ok(ref) or not plain_ok:
            warn_once(
                f"g-{ref.device.type}",
                f"triton backend: GEMM on {ref.device.type} tensors (or a non-BF16 unquantized operand) runs "
                "on the emulated backend",
            )
            return self._fallback._gemm(qa, qb, a_spec, b_spec, out_dtype=out_dtype)
        a, sa = _gemm_operand(qa)
        b, sb = _gemm_operand(qb)
        return scaled_mm_nt(a, b, sa, sb, out_dtype=out_dtype)


__all__ = ["TritonBackend", "TritonNVFP4Tensor"]

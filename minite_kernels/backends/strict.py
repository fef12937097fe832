"""The strict-alignment backend: the emulated backend's GEMM, with the Triton NVFP4 quantizer where it runs.

Strict alignment (``minite_kernels.strict``) needs every reduction on the token path to be batch-invariant.
The emulated backend's GEMM is one FP32 matmul on dequantized operands, which ``StrictMode`` replaces by its
fixed-order kernel. Its quantizer is row-local already, but it is about 90 PyTorch ops per call, so a strict
decode step on CUDA is bound by kernel launches. The Triton quantizer writes the same bytes (data, scales,
amax; ``tests/minite_kernels/test_triton_kernels.py``) in one launch and is row-local too: a row's codes,
scales and per-token amax depend on that row only. So this backend quantizes NVFP4 with it wherever Triton
kernels run (CUDA, or Triton's CPU interpreter) and is the emulated backend in everything else::

    Y = dequant(Q_a(a)) @ dequant(Q_b(b))ᵀ       Q: the Triton kernel where it runs, else ``formats``

The pair decode kernel (its own GEMM, not batch-invariant) is never used: quantization runs with
``decode="off"``.

Example: a [3, 64] activation quantized per token gives the same bytes here as with ``EmulatedBackend``, and
under ``StrictMode`` each output row equals the row computed alone.
"""

from __future__ import annotations

import torch

from minite_kernels.backends.base import QuantizedOperand
from minite_kernels.backends.emulated import EmulatedBackend
from minite_kernels.options import use_options
from minite_kernels.recipes import OperandSpec


class StrictBackend(EmulatedBackend):
    name = "strict"

    def __init__(self, device=None) -> None:
        super().__init__(device)
        self._triton = _triton_quantizer(self.device)  # None: formats quantizes (the emulated backend)

    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        return True, ("strict: the emulated backend's GEMM (StrictMode makes it batch-invariant), quantized by "
                      "the Triton kernel where it runs")

    @property
    def quantizer(self) -> str:
        """Which NVFP4 quantizer runs: ``triton`` or ``formats`` (the pure-PyTorch reference)."""
        return "formats" if self._triton is None else "triton"

    def _quantize(self, x2d: torch.Tensor, spec: OperandSpec, *, generator=None) -> QuantizedOperand:
        t = self._triton
        if t is not None and t.supports_quantize(spec)[0]:  # NVFP4 (inputs its kernels cannot take: formats)
            with use_options(decode="off"):
                return t.quantize(x2d, spec, generator=generator)
        return super()._quantize(x2d, spec, generator=generator)

    def clear_cache(self) -> None:
        """Forget the Triton quantizer's remembered last input (before and after a CUDA-graph capture)."""
        if self._triton is not None:
            self._triton.clear_cache()


def _triton_quantizer(device: torch.device | None):
    """A Triton backend for its quantizer when its kernels run on ``device`` (a CUDA GPU it supports, or the CPU
    under Triton's interpreter), else None."""
    if device is None or device.type not in ("cuda", "cpu"):
        return None
    try:
        from minite_kernels.backends.triton import TritonBackend
        from minite_kernels.backends.triton._common import interpret_mode
    except Exception:  # noqa: BLE001 - no usable Triton: the reference quantizer
        return None
    if device.type == "cpu":
        return TritonBackend(device) if interpret_mode() else None
    return TritonBackend(device) if TritonBackend.availability(device)[0] else None

"""Triton backend (Hopper/Ampere): exact NVFP4 emulation made fast (report §4.2, §5.1, §6.5).

Importing this package imports triton; the backend factory (``minite_kernels.backends.get_backend``) imports
it lazily, only when a CUDA device is present. Kernels, one concern per module:

- ``nvfp4_jit``    the NVFP4 encoding as device functions (scale, E4M3, E2M1 codes, decode factor), used by
                   every kernel that writes or reads NVFP4 bytes
- ``pdl_jit``      programmatic dependent launch as device functions (grid dependency control, L2 bulk
                   prefetch), used by the decode step's kernels (``decode_kernels``, ``fp4w``, ``norm_quant``)
- ``quantize``     fused NVFP4 quantize (per-tensor / per-token, 1x16 / 16x16, RN / SR) + dequantize: the
                   launchers; ``quantize_kernels`` holds the generic kernels and their math
- ``quantize_bf16`` its BF16 fast path (words of two BF16 values) and the grouped weight kernels
- ``norm_quant``   residual add + RMSNorm fused with the per-token quantize-dequantize of its output (the
                   sampler's X̂ for packed NVFP4 projections, ``GraphSampler(norm_quant=True)``)
- ``gemm``         emulated W4A4 GEMM: BF16 tensor cores on exact ``q*s_b`` operands, scales in the epilogue
- ``decode``       packed-FP4 (4.5 bits/param) decode linear for small batches (the backend routes
                   GEMMs of <= ``DECODE_MAX_ROWS`` activation rows to it: the sampler's decode steps): the
                   launchers; ``decode_kernels`` holds the kernels and their math (the first formulation,
                   the benchmarks' baseline, is ``scripts/decode_planes.py``)
- ``fp4w``         FP4-weight GEMM for the sampler's decode step at tens of rows: E2M1 codes stored as each
                   lane's MMA fragment and scales as E5M3, decoded in registers into ``wgmma``'s register
                   operand, per-tensor factors in the epilogue; ``fp4w_pack`` writes that layout from the
                   NVFP4 bytes in one launch per linear (the sampler's weight refresh)
- ``logprobs``     token log-probs + entropy from hidden states and lm_head without full logits (the learner's
                   ``trainers.learner.logprobs.response_logprobs`` on CUDA, where it applies)
- ``weight_sync``  re-quantize all linear weights after an optimizer step (CUDA-graph replay)
- ``adamw``        one grouped AdamW launch over many parameters that also records each weight's amax
- ``batch_invariant`` strict alignment's kernels: a row's bits do not depend on the batch around it
- ``backend``      :class:`TritonBackend` (the ``Backend`` interface)
- ``tensor``       :class:`TritonNVFP4Tensor`: an ``NVFP4Tensor`` with the GEMM operands of the same launch

Host plumbing: ``launcher`` (a cached launcher for the hot kernels), ``offline`` (compile for a GPU that is
not here and read the IR), ``_common`` (availability, interpreter detection, constants).

The names in ``__all__`` are this package's public seam (``rollout/`` imports Triton code only through them:
``tests/test_layering.py``). The graph sampler's own kernels (``fp4w``, ``norm_quant``) are imported on first use
of their names, so importing the backend does not import them.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._common import kernel_device_ok
from .backend import DECODE_MAX_ROWS, TritonBackend, decode_mode
from .decode import decode_linear_pairs, quantize_for_decode
from .gemm import scaled_mm_nt
from .logprobs import logprobs_and_entropy, logprobs_and_entropy_torch
from .quantize import dequantize_nvfp4_triton, quantize_nvfp4_triton
from .tensor import TritonNVFP4Tensor
from .weight_sync import WeightRequantizer

#: name -> (module, attribute): the sampler's kernels, imported when a name is first used
_LAZY: dict[str, tuple[str, str]] = {
    "FP4W_GROUP_ROWS": (".fp4w", "GROUP_ROWS"),
    "FP4W_K_TILE": (".fp4w", "K_TILE"),
    "FP4Weight": (".fp4w", "FP4Weight"),
    "fp4w_linear": (".fp4w", "fp4w_linear"),
    "prefers_fp4": (".fp4w", "prefers_fp4"),
    "add_rms_norm_deq": (".norm_quant", "add_rms_norm_deq"),
    "silu_mul_deq": (".norm_quant", "silu_mul_deq"),
}

__all__ = [
    "DECODE_MAX_ROWS",
    "FP4W_GROUP_ROWS",
    "FP4W_K_TILE",
    "FP4Weight",
    "TritonBackend",
    "TritonNVFP4Tensor",
    "WeightRequantizer",
    "add_rms_norm_deq",
    "decode_linear_pairs",
    "decode_mode",
    "dequantize_nvfp4_triton",
    "fp4w_linear",
    "kernel_device_ok",
    "logprobs_and_entropy",
    "logprobs_and_entropy_torch",
    "prefers_fp4",
    "quantize_for_decode",
    "quantize_nvfp4_triton",
    "scaled_mm_nt",
    "silu_mul_deq",
]


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name, __name__), attr)
    globals()[name] = value
    return value

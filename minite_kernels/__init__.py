"""minite_kernels: a miniTE-style NVFP4/MXFP8 learner stack (report §4–§5, §7).

Layers: ``formats`` (exact codecs) → ``recipes`` (stdlib-only precision policies) → ``backends``
(emulated | triton | te | flashinfer, lazily imported) → ``modules`` (Linear, LayerNormLinear,
GroupedLinear) → ``patching.quantize_model``.

Importing the package is cheap: nothing below is imported until first use, and nothing here imports
torch, triton, TransformerEngine or FlashInfer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from minite_kernels._version import __version__ as __version__

_LAZY: dict[str, tuple[str, str | None]] = {
    # name -> (module, attribute or None for the module itself)
    "quantize_nvfp4": ("minite_kernels.formats", "quantize_nvfp4"),
    "quantize_mxfp8": ("minite_kernels.formats", "quantize_mxfp8"),
    "NVFP4Tensor": ("minite_kernels.formats", "NVFP4Tensor"),
    "MXFP8Tensor": ("minite_kernels.formats", "MXFP8Tensor"),
    "get_qlinear_params": ("minite_kernels.recipes", "get_qlinear_params"),
    "list_recipes": ("minite_kernels.recipes", "list_recipes"),
    "PrecisionRecipe": ("minite_kernels.recipes", "PrecisionRecipe"),
    "get_backend": ("minite_kernels.backends", "get_backend"),
    "quantize_model": ("minite_kernels.patching", "quantize_model"),
    "QuantizationReport": ("minite_kernels.patching", "QuantizationReport"),
    "modules": ("minite_kernels.modules", None),
    # the seams the packages above use (``rollout/`` imports minite_kernels only through names exported here or
    # by ``minite_kernels.backends.triton``: tests/test_layering.py)
    "Linear": ("minite_kernels.modules.linear", "Linear"),
    "WeightCache": ("minite_kernels.modules.weight_cache", "WeightCache"),
    "ModelWeightSync": ("minite_kernels.modules.weight_sync", "ModelWeightSync"),
    "backend_status": ("minite_kernels.backends", "backend_status"),
    # the fast lane (``modules/fast_lane.py``) as the sampler's packed projections run it
    "module_lane": ("minite_kernels.modules.functional", "module_lane"),
    "lane_call_ok": ("minite_kernels.modules.fast_lane", "call_ok"),
    "lane_deq_ok": ("minite_kernels.modules.fast_lane", "deq_ok"),
    "lane_deq_linear": ("minite_kernels.modules.fast_lane", "deq_linear"),
    "lane_weight": ("minite_kernels.modules.fast_lane", "lane_weight"),
    "lane_qweight": ("minite_kernels.modules.fast_lane", "lane_qweight"),
    # strict alignment (``strict.py``)
    "StrictMode": ("minite_kernels.strict", "StrictMode"),
    "strict_active": ("minite_kernels.strict", "strict_active"),
    "strict_decode_attention": ("minite_kernels.strict", "decode_attention"),
    "strict_linear_backend": ("minite_kernels.strict", "linear_backend"),
    # loading HF causal LMs (``hf_models.py``; ``rollout.models`` re-exports it)
    "load_model_and_tokenizer": ("minite_kernels.hf_models", "load_model_and_tokenizer"),
    "ModelLoadError": ("minite_kernels.hf_models", "ModelLoadError"),
    "SMOLLM2_ALIASES": ("minite_kernels.hf_models", "SMOLLM2_ALIASES"),
    "cache_root": ("minite_kernels.hf_models", "cache_root"),
    "resolve_dtype": ("minite_kernels.hf_models", "resolve_dtype"),
    "smollm2_cache_dir": ("minite_kernels.hf_models", "smollm2_cache_dir"),
}

__all__ = [
    "SMOLLM2_ALIASES",
    "Linear",
    "MXFP8Tensor",
    "ModelLoadError",
    "ModelWeightSync",
    "NVFP4Tensor",
    "PrecisionRecipe",
    "QuantizationReport",
    "StrictMode",
    "WeightCache",
    "backend_status",
    "cache_root",
    "get_backend",
    "get_qlinear_params",
    "lane_call_ok",
    "lane_deq_linear",
    "lane_deq_ok",
    "lane_qweight",
    "lane_weight",
    "list_recipes",
    "load_model_and_tokenizer",
    "module_lane",
    "modules",
    "quantize_model",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "resolve_dtype",
    "smollm2_cache_dir",
    "strict_active",
    "strict_decode_attention",
    "strict_linear_backend",
]

if TYPE_CHECKING:  # pragma: no cover
    from minite_kernels import modules
    from minite_kernels.backends import backend_status, get_backend
    from minite_kernels.formats import MXFP8Tensor, NVFP4Tensor, quantize_mxfp8, quantize_nvfp4
    from minite_kernels.hf_models import (
        SMOLLM2_ALIASES,
        ModelLoadError,
        cache_root,
        load_model_and_tokenizer,
        resolve_dtype,
        smollm2_cache_dir,
    )
    from minite_kernels.modules.fast_lane import call_ok as lane_call_ok
    from minite_kernels.modules.fast_lane import deq_linear as lane_deq_linear
    from minite_kernels.modules.fast_lane import deq_ok as lane_deq_ok
    from minite_kernels.modules.fast_lane import lane_qweight, lane_weight
    from minite_kernels.modules.functional import module_lane
    from minite_kernels.modules.linear import Linear
    from minite_kernels.modules.weight_cache import WeightCache
    from minite_kernels.modules.weight_sync import ModelWeightSync
    from minite_kernels.patching import QuantizationReport, quantize_model
    from minite_kernels.recipes import PrecisionRecipe, get_qlinear_params, list_recipes
    from minite_kernels.strict import StrictMode, strict_active
    from minite_kernels.strict import decode_attention as strict_decode_attention
    from minite_kernels.strict import linear_backend as strict_linear_backend


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'minite_kernels' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

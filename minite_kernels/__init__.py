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

__version__ = "0.1.0"

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
}

__all__ = [
    "MXFP8Tensor",
    "NVFP4Tensor",
    "PrecisionRecipe",
    "QuantizationReport",
    "get_backend",
    "get_qlinear_params",
    "list_recipes",
    "modules",
    "quantize_model",
    "quantize_mxfp8",
    "quantize_nvfp4",
]

if TYPE_CHECKING:  # pragma: no cover
    from minite_kernels import modules
    from minite_kernels.backends import get_backend
    from minite_kernels.formats import MXFP8Tensor, NVFP4Tensor, quantize_mxfp8, quantize_nvfp4
    from minite_kernels.patching import QuantizationReport, quantize_model
    from minite_kernels.recipes import PrecisionRecipe, get_qlinear_params, list_recipes


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

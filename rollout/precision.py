"""A sampler's model under a precision recipe, and its quantized weights re-made after an update.

Shared by the local engine (its model, or the sampler's own copy under ``precision.sampler``) and the minite
rollout of ``engine=verl`` (``rollout/verl_backend``), so that both patch and re-quantize the same way:

- :func:`patch_precision`: ``bf16`` leaves the linears as they are; any other name goes through
  ``minite_kernels.quantize_model``. ``exclude`` patterns and block indices stay in high precision (``lm_head``
  in it keeps the output head unquantized, otherwise the head is quantized too); under ``alignment=strict`` the
  quantized linears run on the strict backend (``minite_kernels.strict.linear_backend``).
- :class:`Requantizer`: after the parameters changed in place, minite's grouped re-quantizer
  (``ModelWeightSync``) re-makes every weight it covers where the Triton kernels run, and a 1-token forward
  re-makes the rest (quantized weight caches are keyed on the parameter version, so that forward misses exactly
  the stale ones; when the grouped sync covered everything it is skipped).
"""
from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Mapping
from typing import Any

import torch


def resolved_recipe(name: str):
    """The ``PrecisionRecipe`` a precision name other than ``bf16`` stands for (``auto``: ``$MINITE_RECIPE``,
    else minite's default)."""
    from minite_kernels import get_qlinear_params

    return get_qlinear_params(None if name == "auto" else name)


def resolved_recipe_name(name: str) -> str:
    """:func:`resolved_recipe`'s name; ``bf16`` stays ``bf16`` (plain linears, no recipe)."""
    return name if name == "bf16" else resolved_recipe(name).name


def patch_precision(model: Any, recipe: str | Mapping[str, Any], *, exclude=(), backend: str = "auto", alignment: str = "default",
                    run_dir: pathlib.Path | None = None) -> dict[str, Any]:
    """Patch ``model``'s linears in place with ``recipe`` (a name, ``auto``: minite's default, or a recipe's
    fields, ``PrecisionRecipe.to_dict()``); returns what was done.
    ``run_dir``: where ``quantize_model`` records its layer report (None: nowhere)."""
    if recipe == "bf16":
        return {"recipe": "bf16", "patched": False, "note": "plain torch linears in the model's dtype"}
    from minite_kernels import quantize_model

    if alignment == "strict":  # dequantized GEMMs as plain matmuls, which StrictMode computes
        from minite_kernels import strict_linear_backend

        backend = strict_linear_backend(backend)
    report = quantize_model(model, None if recipe == "auto" else recipe,
                            exclude=[e for e in exclude if e != "lm_head"] or None, run_dir=run_dir,
                            backend=backend, lm_head="lm_head" not in exclude)
    return {"recipe": report.recipe, "patched": True, "coverage": report.coverage,
            "quantized_layers": len(report.swapped), "backend": report.backend}


def triton_kernels_ok(device: torch.device) -> bool:
    """minite_kernels' Triton backend runs on ``device`` (its own availability check: CUDA, sm_80+, Triton)."""
    from minite_kernels import backend_status

    return device.type == "cuda" and backend_status("triton", device)[0]


def weight_cache_misses(model) -> int:
    """How many times the model's quantized weight caches (every ``WeightCache`` a module holds) have
    (re)quantized a weight."""
    try:
        from minite_kernels import WeightCache
    except ImportError:
        return 0
    return sum(v.misses for m in model.modules() for v in vars(m).values() if isinstance(v, WeightCache))


class Requantizer:
    """``requantize()`` after ``model``'s parameters changed in place (module docstring); returns its metrics
    (the grouped sync's, and ``perf/requantized_weights``: weights the 1-token forward re-made). ``optimizer``:
    one that records each weight's amax (minite's AdamW) saves the grouped sync a read of every weight;
    ``mode``: a context for the forward (strict alignment)."""

    def __init__(self, model, pad_id: int, *, optimizer=None, mode=contextlib.nullcontext) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        self.optimizer = optimizer
        self.mode = mode
        self.device = next(model.parameters()).device
        self.triton_ok = triton_kernels_ok(self.device)
        self._grouped = None  # built on the first call (after the optimizer has state)

    def __call__(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.triton_ok:
            if self._grouped is None:
                from minite_kernels import ModelWeightSync

                self._grouped = ModelWeightSync(self.model, self.optimizer)
            metrics = self._grouped.sync()
            if not self._grouped.unsynced:
                metrics["perf/requantized_weights"] = 0.0
                return metrics
        before = weight_cache_misses(self.model)
        with torch.no_grad(), self.mode():
            self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device), use_cache=False)
        metrics["perf/requantized_weights"] = float(weight_cache_misses(self.model) - before)
        return metrics

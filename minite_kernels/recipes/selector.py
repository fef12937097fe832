"""Per-layer recipe selection (report §4.3 "layer-name overrides and layer-number exclusions"): block indices in
module names, name patterns, and :class:`LayerSelector`. Standard library only.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from minite_kernels.recipes.env import get_qlinear_params
from minite_kernels.recipes.spec import PrecisionRecipe, RecipeError

_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)")


def layer_index(module_name: str) -> int | None:
    """Transformer block index in a module name (``model.layers.3.mlp.up_proj`` → 3), else None."""
    m = _LAYER_RE.search(module_name)
    return int(m.group(1)) if m else None


def name_matches(pattern: str, module_name: str) -> bool:
    """``re:<regex>`` (``re.search``) or a shell glob matched against the full dotted name."""
    if pattern.startswith("re:"):
        return re.search(pattern[3:], module_name) is not None
    return fnmatch.fnmatchcase(module_name, pattern)


@dataclass(frozen=True)
class LayerSelector:
    """Which recipe each layer gets: base recipe, name overrides (first match wins), exclusions → BF16.

    ``overrides``: ``((pattern, recipe_or_name), ...)``; ``exclude``: layer indices (negative counts from the
    end: ``-1`` is the last block) or name patterns; excluded layers keep BF16 (selective precision,
    report §4.3).
    """

    recipe: PrecisionRecipe
    overrides: tuple[tuple[str, PrecisionRecipe], ...] = ()
    exclude: tuple[int | str, ...] = ()
    num_layers: int | None = None

    @classmethod
    def build(
        cls,
        recipe: str | PrecisionRecipe | None,
        overrides: Mapping[str, str | PrecisionRecipe]
        | Iterable[tuple[str, str | PrecisionRecipe]]
        | None = None,
        exclude: Iterable[int | str] | int | str | None = None,
        num_layers: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> LayerSelector:
        base = get_qlinear_params(recipe, env=env)
        items = overrides.items() if isinstance(overrides, Mapping) else (overrides or ())
        ov = []
        for pattern, r in items:
            if not isinstance(pattern, str) or not pattern:
                raise RecipeError(
                    f"override pattern must be a non-empty string (glob or 're:regex'), got {pattern!r}"
                )
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as e:
                    raise RecipeError(f"override pattern {pattern!r} is not a valid regex: {e}") from None
            ov.append((pattern, get_qlinear_params(r, env=env)))
        if exclude is None:
            excl: tuple = ()
        elif isinstance(exclude, (int, str)):
            excl = (exclude,)
        else:
            excl = tuple(exclude)
        for e in excl:
            if isinstance(e, bool) or not isinstance(e, (int, str)):
                raise RecipeError(
                    f"exclude entries must be layer indices (int) or name patterns (str), got {e!r}"
                )
            if isinstance(e, int) and num_layers is not None and not -num_layers <= e < num_layers:
                raise RecipeError(
                    f"exclude layer index {e} is out of range for a model with {num_layers} layers"
                )
        return cls(base, tuple(ov), excl, num_layers)

    def select(self, module_name: str) -> tuple[PrecisionRecipe | None, str]:
        """(recipe, why) for a module; ``None`` = keep it in BF16 (excluded)."""
        idx = layer_index(module_name)
        for e in self.exclude:
            if isinstance(e, str) and name_matches(e, module_name):
                return None, f"excluded by pattern {e!r}"
            if isinstance(e, int) and idx is not None:
                target = e if e >= 0 or self.num_layers is None else self.num_layers + e
                if idx == target:
                    return None, f"excluded layer {idx}" + (f" (index {e})" if e < 0 else "")
        for pattern, r in self.overrides:
            if name_matches(pattern, module_name):
                return r, f"override {pattern!r}"
        return self.recipe, "base recipe"

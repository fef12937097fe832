"""Which precision recipe a run gets: explicit name > ``$MINITE_RECIPE`` > :data:`DEFAULT_RECIPE`, and the
``DISABLE_BACKWARD_QUANT=1`` backward bypass (report §4.3, §7.2). Standard library only.

A recipe is given by name (looked up in the registry), as a :class:`PrecisionRecipe`, or as its fields: a mapping,
or a JSON object as the name or as ``$MINITE_RECIPE`` (``json.dumps(recipe.to_dict())``; how ``engine=verl`` hands
its workers the recipe the driver resolved, so that a recipe registered only in the driver works there too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from minite_kernels.recipes.catalogue import _REGISTRY
from minite_kernels.recipes.spec import PrecisionRecipe, RecipeError, _valid

ENV_RECIPE = "MINITE_RECIPE"
ENV_DISABLE_BACKWARD_QUANT = "DISABLE_BACKWARD_QUANT"
DEFAULT_RECIPE = "nvfp4_per_token_bf16_bwd"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _from_fields(value, where: str) -> PrecisionRecipe:
    """A recipe from its fields: a mapping, or a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RecipeError(f"recipe{where} starts like a JSON object but is not one: {e}") from None
    return PrecisionRecipe.from_dict(dict(value))


def resolve_recipe(
    name: str | PrecisionRecipe | Mapping | None = None, *, env: Mapping[str, str] | None = None
) -> tuple[PrecisionRecipe, str]:
    """Resolve a recipe and say where it came from: ``"explicit"``, ``"env:MINITE_RECIPE"`` or ``"default"``.

    ``DISABLE_BACKWARD_QUANT=1`` in ``env`` (default ``os.environ``) applies the backward bypass to the result.
    """
    env = os.environ if env is None else env
    if isinstance(name, PrecisionRecipe):
        recipe, source = name, "explicit"
    elif isinstance(name, Mapping) or (isinstance(name, str) and name.lstrip().startswith("{")):
        recipe, source = _from_fields(name, ""), "explicit"
    elif name is None and env.get(ENV_RECIPE, "").lstrip().startswith("{"):
        recipe, source = _from_fields(env[ENV_RECIPE], f" (from ${ENV_RECIPE})"), f"env:{ENV_RECIPE}"
    else:
        if name is not None:
            source = "explicit"
        elif env.get(ENV_RECIPE):
            name, source = env[ENV_RECIPE].strip(), f"env:{ENV_RECIPE}"
        else:
            name, source = DEFAULT_RECIPE, "default"
        if not isinstance(name, str):
            raise RecipeError(f"recipe must be a name or a PrecisionRecipe, got {type(name).__name__}")
        if name not in _REGISTRY:
            where = f" (from ${ENV_RECIPE})" if source.startswith("env") else ""
            raise RecipeError(f"unknown precision recipe {name!r}{where}; {_valid(name, _REGISTRY)}")
        recipe = _REGISTRY[name]
    if _truthy(env.get(ENV_DISABLE_BACKWARD_QUANT)) and not recipe.backward_bypass:
        recipe = recipe.with_backward_bypass()
    return recipe, source


def get_qlinear_params(
    name: str | PrecisionRecipe | None = None, *, env: Mapping[str, str] | None = None
) -> PrecisionRecipe:
    """The recipe to use: explicit ``name`` > ``$MINITE_RECIPE`` > ``nvfp4_per_token_bf16_bwd`` (report §4.3)."""
    return resolve_recipe(name, env=env)[0]

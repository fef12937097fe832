"""Named precision recipes: how each of the three GEMMs of a linear layer computes.

Standard library only, so ``python -m minite_kernels recipes`` / ``describe`` work without torch
(report §4.2: "the registry and inspection entry points use only the Python standard library").

A linear layer ``Y = X Wᵀ`` runs three GEMMs, each written as ``A @ Bᵀ`` with both operands
quantized along the contraction dim (the last dim of each 2-D operand):

=======  ===========  ===========  ============================
GEMM     A            B            result
=======  ===========  ===========  ============================
fprop    X   [M,K]    W   [N,K]    Y  [M,N]
dgrad    dY  [M,N]    Wᵀ  [K,N]    dX [M,K]
wgrad    dYᵀ [N,M]    Xᵀ  [K,M]    dW [N,K]
=======  ===========  ===========  ============================

Each operand has an :class:`OperandSpec` (format, scaling scope, tile, RHT, stochastic rounding);
a :class:`GemmSpec` pairs two; a :class:`PrecisionRecipe` names fprop/dgrad/wgrad plus where the
backward GEMMs take X and W from (``backward_operands``), report §4.3, and which kernels compute them where
several can (:class:`KernelChoice`, ``kernels``: the GEMM formulation, decode routing, the autograd lane, what
backward saves).

Selection (report §4.3, §7.2): explicit recipe > ``$MINITE_RECIPE`` > :data:`DEFAULT_RECIPE`.
``DISABLE_BACKWARD_QUANT=1`` turns any recipe's backward into BF16 GEMMs on the original (unquantized)
operands: the "layer bypass" of report §4.3/§7.2, recorded as ``backward_bypass=True``.

Example::

    >>> r = get_qlinear_params("nvfp4_per_token")
    >>> r.fprop.a.scaling, r.fprop.b.tile, r.wgrad.a.rht, r.dgrad.a.stochastic_rounding
    ('per_token', (16, 16), True, True)
    >>> r.fprop.summary(), r.wgrad.summary()
    ('nvfp4/tok x nvfp4/16x16', 'nvfp4/rht/sr x nvfp4/rht')

The package, one concern a module (each imports only the ones before it):

- :mod:`~minite_kernels.recipes.spec`: the types (:class:`OperandSpec`, :class:`GemmSpec`,
  :class:`PrecisionRecipe`), their vocabularies and :class:`RecipeError`;
- :mod:`~minite_kernels.recipes.catalogue`: the registry and the built-in recipes;
- :mod:`~minite_kernels.recipes.env`: selection (explicit, ``$MINITE_RECIPE``, default) and the backward bypass;
- :mod:`~minite_kernels.recipes.selector`: per-layer selection (:class:`LayerSelector`).

Every name is re-exported here: ``from minite_kernels.recipes import X``.
"""

from __future__ import annotations

from minite_kernels.recipes.catalogue import (
    _REGISTRY,  # noqa: F401  (private, for callers of the former module)
    list_recipes,
    recipe_names,
    register_recipe,
)
from minite_kernels.recipes.env import (
    DEFAULT_RECIPE,
    ENV_DISABLE_BACKWARD_QUANT,
    ENV_RECIPE,
    _truthy,  # noqa: F401  (private; minite_kernels.cli reads it)
    get_qlinear_params,
    resolve_recipe,
)
from minite_kernels.recipes.selector import LayerSelector, layer_index, name_matches
from minite_kernels.recipes.spec import (
    BACKWARD_OPERANDS,
    BF16,
    BF16_GEMM,
    BLOCK_K,
    DEFAULT_KERNELS,
    FORMATS,
    GEMM_OPERANDS,
    GEMM_ROLES,
    GEMMS,
    GROUPS,
    KERNEL_CHOICES,
    ROLES,
    SCALINGS,
    SUMMARY_LEGEND,
    TILES,
    GemmSpec,
    KernelChoice,
    OperandSpec,
    PrecisionRecipe,
    RecipeError,
)

__all__ = [
    "BACKWARD_OPERANDS",
    "BF16",
    "BF16_GEMM",
    "BLOCK_K",
    "DEFAULT_KERNELS",
    "DEFAULT_RECIPE",
    "ENV_DISABLE_BACKWARD_QUANT",
    "ENV_RECIPE",
    "FORMATS",
    "GEMMS",
    "GEMM_OPERANDS",
    "GEMM_ROLES",
    "GROUPS",
    "KERNEL_CHOICES",
    "ROLES",
    "SCALINGS",
    "SUMMARY_LEGEND",
    "TILES",
    "GemmSpec",
    "KernelChoice",
    "LayerSelector",
    "OperandSpec",
    "PrecisionRecipe",
    "RecipeError",
    "get_qlinear_params",
    "layer_index",
    "list_recipes",
    "name_matches",
    "recipe_names",
    "register_recipe",
    "resolve_recipe",
]

"""The precision recipe catalogue: the registry, :func:`register_recipe`, the built-in recipes and their listing.
Standard library only.
"""

from __future__ import annotations

from minite_kernels.recipes.spec import (
    BF16,
    GROUPS,
    GemmSpec,
    OperandSpec,
    PrecisionRecipe,
    RecipeError,
    _valid,
)


def _nv(scaling: str = "per_tensor", tile=(1, 16), rht: bool = False, sr: bool = False) -> OperandSpec:
    return OperandSpec("nvfp4", scaling, tile, rht, sr)


_MX = OperandSpec("mxfp8")
_W2D = _nv(tile=(16, 16))  # weights: 16x16 tiles, so the transposed copy is exactly the transpose
_NVFP4_BWD = {  # TE NVFP4BlockScaling backward defaults: SR on grads, RHT on both wgrad operands
    "dgrad": GemmSpec(_nv(sr=True), _W2D),
    "wgrad": GemmSpec(_nv(rht=True, sr=True), _nv(rht=True)),
}
_MXFP8_BWD = {"dgrad": GemmSpec(_MX, _MX), "wgrad": GemmSpec(_MX, _MX)}
_PER_TOKEN_FPROP = GemmSpec(_nv("per_token"), _W2D)
_PER_TOKEN_FPROP_1D = GemmSpec(_nv("per_token"), _nv())  # weights in 1x16 blocks: no transposed copy needed

_REGISTRY: dict[str, PrecisionRecipe] = {}


def register_recipe(recipe: PrecisionRecipe, *, replace: bool = False) -> PrecisionRecipe:
    """Add a recipe to the registry (report §7.3: a new recipe declares its purpose and dependencies here)."""
    if not isinstance(recipe, PrecisionRecipe):
        raise TypeError(f"register_recipe expects a PrecisionRecipe, got {type(recipe).__name__}")
    if recipe.name in _REGISTRY and not replace:
        raise RecipeError(f"recipe {recipe.name!r} is already registered (pass replace=True to overwrite)")
    _REGISTRY[recipe.name] = recipe
    return recipe


for _r in (
    PrecisionRecipe(
        "bf16",
        group="common",
        backward_operands="original",
        description="No quantization: the three GEMMs run in the parameter dtype (BF16 baseline).",
    ),
    PrecisionRecipe(
        "nvfp4_per_tensor",
        fprop=GemmSpec(_nv(), _W2D),
        **_NVFP4_BWD,
        group="reference",
        description="TE NVFP4BlockScaling defaults: per-tensor activations, 16x16 weights; NVFP4 backward with "
        "SR on gradients and RHT on the wgrad operands.",
        requires=("torch", "optional: transformer_engine>=2.20 or flashinfer on sm_100+"),
    ),
    PrecisionRecipe(
        "nvfp4_per_token",
        fprop=_PER_TOKEN_FPROP,
        **_NVFP4_BWD,
        group="common",
        description="NVFP4 forward with per-token (row-scaled) activation amax and 16x16 weights; NVFP4 backward "
        "as TE's defaults (SR on gradients, RHT on wgrad operands). Report §5.1.",
        requires=("torch", "optional: transformer_engine>=2.20 (row_scaled_activation) on sm_100+"),
    ),
    PrecisionRecipe(
        "nvfp4_per_token_bf16_bwd",
        fprop=_PER_TOKEN_FPROP,
        backward_operands="dequantized_forward",
        group="common",
        description="NVFP4 per-token forward; BF16 dgrad/wgrad on operands dequantized from the forward values "
        "(TE nvfp4_row_scaled_fwd_high_precision_bwd). The default recipe.",
        requires=("torch", "optional: transformer_engine>=2.20 on sm_100+"),
    ),
    PrecisionRecipe(
        "nvfp4_per_token_w1x16_bf16_bwd",
        fprop=_PER_TOKEN_FPROP_1D,
        backward_operands="dequantized_forward",
        group="common",
        description="NVFP4 per-token forward with weights in 1x16 blocks (the forward GEMM's own layout); BF16 "
        "dgrad/wgrad on the dequantized forward operands. With a BF16 backward nothing reads the transposed "
        "weight, so 2-D weight tiles buy nothing and cost accuracy (benchmarks/learning/variants.md).",
        requires=("torch", "optional: transformer_engine>=2.20 on sm_100+"),
    ),
    PrecisionRecipe(
        "nvfp4_per_token_mxfp8_bwd",
        fprop=_PER_TOKEN_FPROP,
        **_MXFP8_BWD,
        group="experimental",
        description="NVFP4 per-token forward; MXFP8 (E4M3, 1x32 E8M0 blocks) dgrad/wgrad, quantized from the "
        "original high-precision operands (TE nvfp4_row_scaled_fwd_mxfp8_bwd).",
        requires=("torch", "optional: transformer_engine>=2.20 on sm_100+"),
    ),
    PrecisionRecipe(
        "w4a16_nvfp4",
        fprop=GemmSpec(BF16, _nv()),
        backward_operands="dequantized_forward",
        group="common",
        description="Weight-only NVFP4 (1x16 blocks, per-tensor amax; the vLLM/ModelOpt W4A16 layout): activations "
        "and gradients stay BF16; dgrad uses the dequantized weight (STE, like verl's QAT w4a16).",
    ),
    PrecisionRecipe(
        "mxfp8",
        fprop=GemmSpec(_MX, _MX),
        **_MXFP8_BWD,
        group="reference",
        description="MXFP8 (E4M3 data, E8M0 RCEIL scale per 32 elements) for all three GEMMs, TE MXFP8BlockScaling.",
        requires=("torch", "optional: transformer_engine>=2.20 on sm_100+"),
    ),
):
    register_recipe(_r)


def list_recipes(group: str | None = None) -> list[PrecisionRecipe]:
    """Registered recipes in registration order, optionally filtered by purpose group."""
    if group is not None and group not in GROUPS:
        raise RecipeError(f"group={group!r} is unknown; {_valid(group, GROUPS)}")
    return [r for r in _REGISTRY.values() if group is None or r.group == group]


def recipe_names() -> list[str]:
    return list(_REGISTRY)

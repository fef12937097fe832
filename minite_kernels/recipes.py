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
backward GEMMs take X and W from (``backward_operands``), report §4.3.

Selection (report §4.3, §7.2): explicit recipe > ``$MINITE_RECIPE`` > :data:`DEFAULT_RECIPE`.
``DISABLE_BACKWARD_QUANT=1`` turns any recipe's backward into BF16 GEMMs on the original (unquantized)
operands: the "layer bypass" of report §4.3/§7.2, recorded as ``backward_bypass=True``.

Example::

    >>> r = get_qlinear_params("nvfp4_per_token")
    >>> r.fprop.a.scaling, r.fprop.b.tile, r.wgrad.a.rht, r.dgrad.a.stochastic_rounding
    ('per_token', (16, 16), True, True)
    >>> r.fprop.summary(), r.wgrad.summary()
    ('nvfp4/tok x nvfp4/16x16', 'nvfp4/rht/sr x nvfp4/rht')
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from minite_util.choices import did_you_mean

FORMATS = ("bf16", "nvfp4", "mxfp8")
SCALINGS = {"bf16": ("none",), "nvfp4": ("per_tensor", "per_token"), "mxfp8": ("block",)}
TILES = {"bf16": (None,), "nvfp4": ((1, 16), (16, 16)), "mxfp8": ((1, 32),)}
#: elements per scale block along K (the contraction dim); bf16 has no alignment requirement
BLOCK_K = {"bf16": 1, "nvfp4": 16, "mxfp8": 32}
GROUPS = ("common", "reference", "experimental")
BACKWARD_OPERANDS = ("quantized", "dequantized_forward", "original")
ROLES = ("activation", "weight", "grad")
GEMMS = ("fprop", "dgrad", "wgrad")
#: operand roles (A, B) of each GEMM
GEMM_ROLES = {"fprop": ("activation", "weight"), "dgrad": ("grad", "weight"), "wgrad": ("grad", "activation")}
#: operand labels (A, B) of each GEMM, for messages and tables
GEMM_OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w^T"), "wgrad": ("dy^T", "x^T")}

SUMMARY_LEGEND = (
    "nvfp4 = E2M1 + E4M3 scale per 1x16 block + per-tensor fp32 amax; /tok = per-token amax, /16x16 = 2-D tiles, "
    "/rht = random Hadamard transform, /sr = stochastic rounding; mxfp8 = E4M3 + E8M0 scale per 1x32 block"
)
ENV_RECIPE = "MINITE_RECIPE"
ENV_DISABLE_BACKWARD_QUANT = "DISABLE_BACKWARD_QUANT"
DEFAULT_RECIPE = "nvfp4_per_token_bf16_bwd"


class RecipeError(ValueError):
    """An unknown or contradictory precision recipe; the message names the field and the valid values."""


def _valid(name: str, choices: Iterable[str]) -> str:
    """The tail of an error message: ``valid: a, b; did you mean 'a'?``."""
    choices = list(choices)
    return f"valid: {', '.join(choices)}{did_you_mean(name, choices, cutoff=0.0)}"


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized (along its last dim).

    ``scaling``/``tile`` default per format: nvfp4 → ``per_tensor``, ``(1, 16)``; mxfp8 → ``block``,
    ``(1, 32)``; bf16 → ``none``, ``None``. ``format="bf16"`` means "not quantized": the operand keeps
    its dtype (bf16 under mixed precision, fp32 in an fp32 model).
    """

    format: str = "bf16"
    scaling: str | None = None
    tile: tuple[int, int] | None = None
    rht: bool = False
    stochastic_rounding: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise RecipeError(
                f"OperandSpec.format={self.format!r} is unknown; {_valid(str(self.format), FORMATS)}"
            )
        if self.scaling is None:
            object.__setattr__(self, "scaling", SCALINGS[self.format][0])
        if self.tile is None and self.format != "bf16":
            object.__setattr__(self, "tile", TILES[self.format][0])
        if self.tile is not None:
            object.__setattr__(self, "tile", tuple(int(t) for t in self.tile))
        if self.scaling not in SCALINGS[self.format]:
            raise RecipeError(
                f"OperandSpec.scaling={self.scaling!r} is invalid for format {self.format!r}; "
                f"{_valid(str(self.scaling), SCALINGS[self.format])}"
            )
        if self.tile not in TILES[self.format]:
            raise RecipeError(
                f"OperandSpec.tile={self.tile!r} is invalid for format {self.format!r}; valid: {TILES[self.format]}"
            )
        if self.format == "nvfp4" and self.scaling == "per_token" and self.tile == (16, 16):
            raise RecipeError(
                "OperandSpec.tile=(16, 16) contradicts scaling='per_token': per-token (row-scaled) NVFP4 is 1x16 only "
                "(each row has its own outer amax, a 16x16 tile would span 16 of them); use tile=(1, 16)"
            )
        if self.format != "nvfp4" and (self.rht or self.stochastic_rounding):
            which = "rht" if self.rht else "stochastic_rounding"
            raise RecipeError(
                f"OperandSpec.{which}=True is only valid for format 'nvfp4', not {self.format!r}"
            )

    @property
    def quantized(self) -> bool:
        return self.format != "bf16"

    @property
    def block_k(self) -> int:
        """Alignment the contraction dim needs for this operand (16 NVFP4, 32 MXFP8, 1 BF16)."""
        return BLOCK_K[self.format]

    @property
    def block_rows(self) -> int:
        """Alignment the row dim needs (16 for 16x16 tiles, else 1)."""
        return self.tile[0] if self.tile else 1

    def summary(self) -> str:
        """Compact label: ``nvfp4`` is per-tensor 1x16 round-to-nearest; suffixes mark the differences
        (``tok`` per-token amax, ``16x16`` 2-D tiles, ``rht``, ``sr`` stochastic rounding)."""
        if not self.quantized:
            return "bf16"
        parts = [self.format]
        if self.scaling == "per_token":
            parts.append("tok")
        if self.format == "nvfp4" and self.tile != (1, 16):
            parts.append("x".join(map(str, self.tile)))
        if self.rht:
            parts.append("rht")
        if self.stochastic_rounding:
            parts.append("sr")
        return "/".join(parts)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tile"] = list(self.tile) if self.tile else None
        return d


BF16 = OperandSpec("bf16")


@dataclass(frozen=True)
class GemmSpec:
    """The two operand specs of one GEMM ``A @ Bᵀ`` (see the module table for which is which)."""

    a: OperandSpec = BF16
    b: OperandSpec = BF16

    @property
    def quantized(self) -> bool:
        return self.a.quantized or self.b.quantized

    def summary(self) -> str:
        return f"{self.a.summary()} x {self.b.summary()}"

    def to_dict(self) -> dict:
        return {"a": self.a.to_dict(), "b": self.b.to_dict()}


BF16_GEMM = GemmSpec(BF16, BF16)


@dataclass(frozen=True)
class PrecisionRecipe:
    """A named precision policy for the three GEMMs of a linear layer (report §4.3, Table 9).

    ``backward_operands`` says where dgrad/wgrad take X and W from:
      - ``"quantized"``: the original high-precision X, W, quantized afresh per the dgrad/wgrad specs
        (TE's default: row and column copies are quantized separately from the input, never requantized);
      - ``"dequantized_forward"``: the values the forward GEMM actually used (dequantized from the
        forward quantization), then the dgrad/wgrad specs (TE's ``*_fwd_high_precision_bwd`` factories,
        ``HybridQuantizer(columnwise_source="rowwise_dequantized")``); with BF16 backward specs this is the
        exact gradient of the quantized forward (STE through the quantizer);
      - ``"original"``: the original BF16 X, W with no backward quantization at all (the layer bypass,
        ``DISABLE_BACKWARD_QUANT=1``); requires BF16 dgrad/wgrad specs.
    dY is never quantized in the forward, so it always comes from autograd and only its spec applies.
    """

    name: str
    fprop: GemmSpec = BF16_GEMM
    dgrad: GemmSpec = BF16_GEMM
    wgrad: GemmSpec = BF16_GEMM
    group: str = "experimental"
    description: str = ""
    requires: tuple[str, ...] = ("torch",)
    backward_operands: str = "quantized"
    backward_bypass: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RecipeError("PrecisionRecipe.name must be a non-empty string")
        if self.group not in GROUPS:
            raise RecipeError(
                f"PrecisionRecipe.group={self.group!r} is unknown; {_valid(str(self.group), GROUPS)}"
            )
        if self.backward_operands not in BACKWARD_OPERANDS:
            raise RecipeError(
                f"PrecisionRecipe.backward_operands={self.backward_operands!r} is unknown; "
                f"{_valid(str(self.backward_operands), BACKWARD_OPERANDS)}"
            )
        object.__setattr__(self, "requires", tuple(self.requires))
        for gname in GEMMS:
            g = getattr(self, gname)
            if not isinstance(g, GemmSpec):
                raise RecipeError(f"PrecisionRecipe.{gname} must be a GemmSpec, got {type(g).__name__}")
            for side, role, spec in zip(("a", "b"), GEMM_ROLES[gname], (g.a, g.b)):
                where = f"PrecisionRecipe.{gname}.{side}"
                if spec.stochastic_rounding and role != "grad":
                    raise RecipeError(
                        f"{where}.stochastic_rounding=True on a {role} operand: stochastic rounding is for "
                        "gradients only (dgrad.a, wgrad.a), as in TE's NVFP4BlockScaling"
                    )
                if spec.rht and gname != "wgrad":
                    raise RecipeError(
                        f"{where}.rht=True outside wgrad: the random Hadamard transform is applied only to the "
                        "wgrad operands (dy^T and x^T), where the transforms cancel; valid: wgrad.a, wgrad.b"
                    )
            if g.a.quantized and g.b.quantized and g.a.format != g.b.format:
                raise RecipeError(
                    f"PrecisionRecipe.{gname}: operands {g.a.format!r} and {g.b.format!r} differ; a quantized GEMM "
                    "needs both operands in one format (or one of them bf16)"
                )
            if g.a.rht != g.b.rht:
                raise RecipeError(
                    f"PrecisionRecipe.{gname}: rht is set on one operand only (a={g.a.rht}, b={g.b.rht}); the "
                    "Hadamard transforms cancel only when both wgrad operands are transformed"
                )
        if self.backward_operands == "original" and (self.dgrad.quantized or self.wgrad.quantized):
            raise RecipeError(
                "PrecisionRecipe.backward_operands='original' means the backward keeps the original BF16 operands, "
                f"but dgrad={self.dgrad.summary()!r} / wgrad={self.wgrad.summary()!r} quantize; use 'quantized' "
                "or 'dequantized_forward', or make dgrad/wgrad bf16"
            )

    # --- views -----------------------------------------------------------------------------------
    @property
    def quantized(self) -> bool:
        return any(getattr(self, g).quantized for g in GEMMS)

    @property
    def forward_precision(self) -> str:
        return self.fprop.summary()

    @property
    def backward_precision(self) -> str:
        s = f"dgrad {self.dgrad.summary()}; wgrad {self.wgrad.summary()}; operands {self.backward_operands}"
        return s + (" (DISABLE_BACKWARD_QUANT bypass)" if self.backward_bypass else "")

    def gemm(self, name: str) -> GemmSpec:
        if name not in GEMMS:
            raise RecipeError(f"unknown GEMM {name!r}; {_valid(name, GEMMS)}")
        return getattr(self, name)

    def feature_alignment(self) -> tuple[int, int]:
        """(in_features, out_features) multiples a layer needs: K is fprop's contraction dim, N dgrad's.

        (wgrad contracts over tokens, which the backend zero-pads, so the token count is free.)
        """
        k = max(self.fprop.a.block_k, self.fprop.b.block_k)
        n = max(self.dgrad.a.block_k, self.dgrad.b.block_k)
        return k, n

    def with_backward_bypass(self) -> PrecisionRecipe:
        """BF16 dgrad/wgrad on the original operands (``DISABLE_BACKWARD_QUANT=1``, report §7.2)."""
        return dataclasses.replace(
            self, dgrad=BF16_GEMM, wgrad=BF16_GEMM, backward_operands="original", backward_bypass=True
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "group": self.group,
            "description": self.description,
            "requires": list(self.requires),
            "backward_operands": self.backward_operands,
            "backward_bypass": self.backward_bypass,
            "fprop": self.fprop.to_dict(),
            "dgrad": self.dgrad.to_dict(),
            "wgrad": self.wgrad.to_dict(),
            "forward_precision": self.forward_precision,
            "backward_precision": self.backward_precision,
        }


# --- the registry ---------------------------------------------------------------------------------
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


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def resolve_recipe(
    name: str | PrecisionRecipe | None = None, *, env: Mapping[str, str] | None = None
) -> tuple[PrecisionRecipe, str]:
    """Resolve a recipe and say where it came from: ``"explicit"``, ``"env:MINITE_RECIPE"`` or ``"default"``.

    ``DISABLE_BACKWARD_QUANT=1`` in ``env`` (default ``os.environ``) applies the backward bypass to the result.
    """
    env = os.environ if env is None else env
    if isinstance(name, PrecisionRecipe):
        recipe, source = name, "explicit"
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


# --- per-layer selection (report §4.3 "layer-name overrides and layer-number exclusions") ----------
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

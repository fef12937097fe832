"""Precision recipe types: :class:`OperandSpec`, :class:`GemmSpec`, :class:`PrecisionRecipe`, their vocabularies
(formats, scalings, tiles, GEMMs and operand roles) and :class:`RecipeError`. Standard library only.

Each type has ``to_dict`` and its inverse ``from_dict`` (``from_dict(r.to_dict()) == r``), so a recipe can be
written as plain data (YAML, JSON) and travel whole to another process: ``engine=verl`` hands its workers the
resolved recipe's fields, not a name they would have to look up in their own registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
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

    @classmethod
    def from_dict(cls, d: dict) -> OperandSpec:
        return cls(**_fields(cls, d, "OperandSpec"))


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

    @classmethod
    def from_dict(cls, d: dict) -> GemmSpec:
        kw = _fields(cls, d, "GemmSpec")
        return cls(**{k: OperandSpec.from_dict(v) for k, v in kw.items()})


BF16_GEMM = GemmSpec(BF16, BF16)

#: field -> valid values (first: default) of :class:`KernelChoice`
KERNEL_CHOICES: dict[str, tuple[str, ...]] = {
    "gemm": ("dequant", "exact", "exact_fused"),
    "decode": ("auto", "off"),
    "lane": ("auto", "off"),
    "save_activations": ("dequantized", "packed"),
}


@dataclass(frozen=True)
class KernelChoice:
    """Which kernels compute a recipe's GEMMs where more than one can (as torchao's ``gemm_kernel_choice``).

    Part of the recipe, so it travels with it (``to_dict``) and each linear resolves it once, when its plan is
    made (``modules/functional.py``), not per call. On the Triton backend:

    - ``gemm``: the NVFP4 GEMM formulation. ``dequant``: ``bf16(x̂) @ bf16(ŵ)ᵀ`` (cuBLAS, FP32 accumulate);
      ``exact``: ``(qs_a @ qs_bᵀ) * amax_a * amax_b / 2688²`` (cuBLAS, then an FP32 scaling pass);
      ``exact_fused``: the same in one Triton kernel. The two formulations round differently.
    - ``decode``: ``auto`` runs GEMMs of at most 4 per-token activation rows on the packed-FP4 pair kernel;
      ``off`` keeps them on the ``gemm`` path.
    - ``lane``: ``auto`` lets eligible dense calls take the low-overhead autograd lane; ``off`` sends every call
      down the generic path (same values).
    - ``save_activations``: what backward keeps of a quantized input: ``dequantized`` (its BF16 copy, no
      dequantize in backward) or ``packed`` (its NVFP4 bytes, 3.6x fewer, dequantized again; same values).

    Backends without these kernels ignore the fields. ``MINITE_TRITON_GEMM`` and the other variables of
    :mod:`minite_kernels.options` override them process-wide, for debugging only.
    """

    gemm: str = "dequant"
    decode: str = "auto"
    lane: str = "auto"
    save_activations: str = "dequantized"

    def __post_init__(self) -> None:
        for name, valid in KERNEL_CHOICES.items():
            value = getattr(self, name)
            if value not in valid:
                raise RecipeError(f"KernelChoice.{name}={value!r} is unknown; {_valid(str(value), valid)}")

    def summary(self) -> str:
        """The fields that differ from the defaults, ``gemm=exact decode=off``; ``default`` if none."""
        default = KernelChoice()
        parts = [f"{n}={getattr(self, n)}" for n in KERNEL_CHOICES if getattr(self, n) != getattr(default, n)]
        return " ".join(parts) or "default"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelChoice:
        return cls(**_fields(cls, d, "KernelChoice"))


DEFAULT_KERNELS = KernelChoice()


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
    kernels: KernelChoice = DEFAULT_KERNELS

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
        if not isinstance(self.kernels, KernelChoice):
            raise RecipeError(f"PrecisionRecipe.kernels must be a KernelChoice, got {type(self.kernels).__name__}")
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
            "kernels": self.kernels.to_dict(),
            "forward_precision": self.forward_precision,
            "backward_precision": self.backward_precision,
        }

    @classmethod
    def from_dict(cls, d: dict) -> PrecisionRecipe:
        """The recipe ``to_dict`` wrote (its derived ``forward_precision`` / ``backward_precision`` are ignored);
        missing fields take their defaults, unknown ones raise."""
        kw = _fields(cls, d, "PrecisionRecipe", derived=("forward_precision", "backward_precision"))
        for g in GEMMS:
            if g in kw:
                kw[g] = GemmSpec.from_dict(kw[g])
        if "kernels" in kw:
            kw["kernels"] = KernelChoice.from_dict(kw["kernels"])
        return cls(**kw)

    def with_kernels(self, **changes: str) -> PrecisionRecipe:
        """This recipe with some :class:`KernelChoice` fields changed (same name: the GEMMs' precision is the
        same, the kernels that compute it differ); an unknown field raises naming the valid ones."""
        unknown = [k for k in changes if k not in KERNEL_CHOICES]
        if unknown:
            raise RecipeError(f"KernelChoice has no field {unknown[0]!r}; {_valid(unknown[0], KERNEL_CHOICES)}")
        return dataclasses.replace(self, kernels=dataclasses.replace(self.kernels, **changes))


def _fields(cls, d, what: str, derived: tuple[str, ...] = ()) -> dict:
    """``d``'s items that are fields of dataclass ``cls`` (a mapping; unknown keys other than ``derived`` raise)."""
    if not isinstance(d, dict):
        raise RecipeError(f"{what} takes a mapping of its fields, got {type(d).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names) - set(derived))
    if unknown:
        raise RecipeError(f"{what} has no field {unknown[0]!r}; {_valid(unknown[0], names)}")
    return {k: v for k, v in d.items() if k in names}


"""Process-wide switches for debugging and benchmarks: one frozen object, read from the environment once.

Which kernels compute a recipe's GEMMs is part of the recipe (``PrecisionRecipe.kernels``, a
:class:`~minite_kernels.recipes.KernelChoice`), resolved once per linear when its plan is made. The switches
here are the only other say, all in one place:

=================  ======================  =============================================================
field              environment default     values (first: default)
=================  ======================  =============================================================
gemm               MINITE_TRITON_GEMM      recipe | dequant | exact | exact_fused  (NVFP4 GEMM formulation)
decode             MINITE_TRITON_DECODE    recipe | auto | off    (packed pair kernel for <= 4-row GEMMs)
lane               MINITE_LINEAR_LANE      recipe | auto | off    (the dense linear's low-overhead lane)
save_activations   MINITE_SAVE_ACTIVATIONS recipe | dequantized | packed (what backward keeps of an input)
launch             MINITE_TRITON_LAUNCH    cached | jit     (host launcher of the Triton kernels)
pdl                MINITE_TRITON_PDL       off | on | head | bare  (programmatic dependent launch, sm_90+)
=================  ======================  =============================================================

``recipe`` (the default of the first four) leaves the choice to each recipe; any other value overrides every
recipe's (:func:`resolve_kernels`), e.g. ``MINITE_TRITON_GEMM=exact`` to check a run against the exact
formulation. ``launch`` and ``pdl`` are how kernels are launched, not which: they have no recipe field.

The process default comes from those variables when ``minite_kernels.options`` is first imported
(:meth:`Options.from_env`); later changes to ``os.environ`` are not seen. Change it in code instead:

    from minite_kernels.options import options, set_options, use_options
    with use_options(gemm="exact"):      # this block (and asyncio tasks made in it); new threads: the default
        y = model(x)
    set_options(decode="off")            # the process default from now on
    options().to_dict()                  # {"gemm": "recipe", "decode": "off", ...}: recorded in run metadata

A linear's plan keeps the options object it was resolved under and is made again when the active one is another
object (one identity check per call, no field lookups). Every path gives the same values where the formats are
exact (the tests compare them); the choices trade speed and memory only, except ``gemm``, whose ``exact*``
formulations round differently from ``dequant``.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from minite_kernels.recipes.spec import DEFAULT_KERNELS, KERNEL_CHOICES, KernelChoice
from minite_util.choices import did_you_mean

#: the value of a :class:`KernelChoice` field that leaves the choice to the recipe
RECIPE = "recipe"
#: field -> (environment variable, valid values with the default first)
FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemm": ("MINITE_TRITON_GEMM", (RECIPE, *KERNEL_CHOICES["gemm"])),
    "decode": ("MINITE_TRITON_DECODE", (RECIPE, *KERNEL_CHOICES["decode"])),
    "launch": ("MINITE_TRITON_LAUNCH", ("cached", "jit")),
    "pdl": ("MINITE_TRITON_PDL", ("off", "on", "head", "bare")),
    "lane": ("MINITE_LINEAR_LANE", (RECIPE, *KERNEL_CHOICES["lane"])),
    "save_activations": ("MINITE_SAVE_ACTIVATIONS", (RECIPE, *KERNEL_CHOICES["save_activations"])),
}


@dataclass(frozen=True)
class Options:
    """One set of execution options (see the module docstring); validated on construction."""

    gemm: str = RECIPE
    decode: str = RECIPE
    launch: str = "cached"
    pdl: str = "off"
    lane: str = RECIPE
    save_activations: str = RECIPE

    def __post_init__(self) -> None:
        for name, (_, valid) in FIELDS.items():
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(f"Options.{name}={value!r} is not valid{did_you_mean(value, valid)}; "
                                 f"valid: {', '.join(valid)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Options:
        """The options the ``MINITE_*`` variables of ``environ`` (default ``os.environ``) ask for; values are
        stripped and lower-cased, an unset variable means the default, a bad value raises naming the variable."""
        env = os.environ if environ is None else environ
        kw = {}
        for name, (var, valid) in FIELDS.items():
            if var in env:
                value = env[var].strip().lower()
                if value not in valid:
                    raise ValueError(f"{var}={env[var]!r} is not valid{did_you_mean(value, valid)}; "
                                     f"valid: {', '.join(valid)}")
                kw[name] = value
        return cls(**kw)

    def replace(self, **changes: str) -> Options:
        unknown = [k for k in changes if k not in FIELDS]
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r}{did_you_mean(unknown[0], FIELDS)}; "
                            f"valid: {', '.join(FIELDS)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @property
    def overrides(self) -> dict[str, str]:
        """The :class:`KernelChoice` fields these options set instead of the recipe."""
        return {n: getattr(self, n) for n in KERNEL_CHOICES if getattr(self, n) != RECIPE}


#: environment variable -> field (benchmarks name their variants by the variable)
ENV_FIELDS = {var: name for name, (var, _) in FIELDS.items()}

_default = Options.from_env()
_scoped: contextvars.ContextVar[Options | None] = contextvars.ContextVar("minite_options", default=None)


def options() -> Options:
    """The active options: the innermost :func:`use_options`, else the process default."""
    scoped = _scoped.get()
    return _default if scoped is None else scoped


def set_options(**changes: str) -> Options:
    """Change the process default (fields not named keep their value); returns the previous default."""
    global _default
    previous, _default = _default, _default.replace(**changes)
    return previous


def set_env_option(var: str, value: str | None) -> Options:
    """``set_options`` by environment variable name (``value`` None: the field's default); for benchmarks that
    compare the values of one variable. Returns the previous default."""
    if var not in ENV_FIELDS:
        raise ValueError(f"{var!r} is not a minite option variable{did_you_mean(var, ENV_FIELDS)}; "
                         f"valid: {', '.join(ENV_FIELDS)}")
    name = ENV_FIELDS[var]
    return set_options(**{name: FIELDS[name][1][0] if value is None else value.strip().lower()})


@functools.lru_cache(maxsize=256)
def _resolve(kernels: KernelChoice, opts: Options) -> KernelChoice:
    over = opts.overrides
    return dataclasses.replace(kernels, **over) if over else kernels


def resolve_kernels(kernels: KernelChoice = DEFAULT_KERNELS, opts: Options | None = None) -> KernelChoice:
    """``kernels`` (a recipe's choice) with the fields ``opts`` (default: the active options) override; both are
    frozen, so the result is cached by value. A linear's plan calls this once; the backend used without a plan,
    per call."""
    return _resolve(kernels, options() if opts is None else opts)


@contextlib.contextmanager
def use_options(**changes: str) -> Iterator[Options]:
    """Run a block under the active options with ``changes``."""
    token = _scoped.set(options().replace(**changes))
    try:
        yield options()
    finally:
        _scoped.reset(token)

"""The minite rollout's settings: one frozen object, carried through verl's config as
``actor_rollout_ref.rollout.engine_kwargs.minite.<field>`` (verl keeps ``engine_kwargs`` a free mapping, with one
entry per backend: ``vllm``, ``sglang``, ...).

    settings = MiniteRolloutSettings(recipe="nvfp4_per_token_w1x16_bf16_bwd")
    settings.overrides()   # ['+actor_rollout_ref.rollout.engine_kwargs.minite.recipe=...', ...]
    MiniteRolloutSettings.from_rollout_config(rollout_config)   # in verl's worker: the same object back

The precision fields mean what ``precision.*`` means for ``engine=local`` (``trainers.config.PrecisionConfig``):
the sampler's model is quantized with ``recipe`` exactly as the local engine quantizes its sampler copy.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minite_util.choices import did_you_mean
from rollout.local import ALIGNMENTS
from rollout.select import ENGINES, FP4_WEIGHTS, NORM_QUANT

ENGINE_KWARGS_KEY = "minite"
OVERRIDE_PREFIX = f"actor_rollout_ref.rollout.engine_kwargs.{ENGINE_KWARGS_KEY}"


@dataclass(frozen=True)
class MiniteRolloutSettings:
    #: the sampler's precision recipe: ``bf16`` (plain linears in the rollout dtype), a minite recipe name, or a
    #: recipe's fields (``PrecisionRecipe.to_dict()``: what ``engine=verl`` sends, so that each rollout worker
    #: builds the driver's recipe, one registered only in the driver included; kept as the normalised fields)
    recipe: str | Mapping[str, Any] = "bf16"
    #: module-name patterns (glob or ``re:regex``) left in high precision; ``lm_head`` keeps the head unquantized
    exclude: tuple[str, ...] = ("lm_head",)
    #: minite backend: auto | emulated | triton | te | flashinfer | strict
    backend: str = "auto"
    #: default, or strict (batch-invariant reductions, ``minite_kernels.strict``)
    alignment: str = "default"
    #: auto (the CUDA-graph engine on CUDA, the reference loop on CPU) | graph | loop (``rollout.select``)
    sampler: str = "auto"
    #: rows per sampler batch (None: every queued request of one kind in one batch)
    batch_size: int | None = None
    #: auto | on | off (true / false read as on / off): the graph engine's fused norm + NVFP4 activation quantizer
    #: (``rollout.graph_sampler``; auto: where it holds FP4-weight groups)
    norm_quant: str = "auto"
    #: auto | on | off: the graph engine's FP4-weight GEMMs (``rollout.fp4_weights``, ``rollout.packed``)
    fp4_weights: str = "auto"
    #: how long the server gathers concurrent requests before it starts a batch (verl sends one request per
    #: sample, from several agent-loop workers at once)
    batch_wait_ms: float = 20.0

    def __post_init__(self) -> None:
        if isinstance(self.norm_quant, bool):
            object.__setattr__(self, "norm_quant", "on" if self.norm_quant else "off")
        for name, choices in (("alignment", ALIGNMENTS), ("sampler", ENGINES), ("fp4_weights", tuple(FP4_WEIGHTS)),
                              ("norm_quant", tuple(NORM_QUANT))):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"minite rollout: {name}={value!r} is not valid{did_you_mean(value, choices)}; "
                                 f"valid choices: {', '.join(choices)}")
        if isinstance(self.recipe, Mapping):
            from minite_kernels import PrecisionRecipe

            try:
                fields = PrecisionRecipe.from_dict(dict(self.recipe)).to_dict()
            except (TypeError, ValueError) as e:
                raise ValueError(f"minite rollout: recipe fields: {e}") from None
            object.__setattr__(self, "recipe", fields)
        elif not isinstance(self.recipe, str) or not self.recipe:
            raise ValueError(f"minite rollout: recipe={self.recipe!r} must be 'bf16', a minite recipe name or a "
                             "recipe's fields (PrecisionRecipe.to_dict())")
        exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        if not all(isinstance(e, str) for e in exclude):
            raise TypeError(f"minite rollout: exclude={list(exclude)!r} must list module-name patterns (strings)")
        object.__setattr__(self, "exclude", exclude)
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or int(self.batch_size) < 1):
            raise ValueError(f"minite rollout: batch_size={self.batch_size!r} must be >= 1 or null")
        if float(self.batch_wait_ms) < 0:
            raise ValueError(f"minite rollout: batch_wait_ms={self.batch_wait_ms!r} must be >= 0")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> MiniteRolloutSettings:
        """The settings from ``engine_kwargs.minite`` (a dict or an OmegaConf node); unknown keys are an error."""
        values = _plain(values) or {}
        unknown = [k for k in values if k not in cls.fields()]
        if unknown:
            raise ValueError(f"{OVERRIDE_PREFIX}.{unknown[0]} is not a minite rollout setting"
                             f"{did_you_mean(unknown[0], cls.fields())}; valid: {', '.join(cls.fields())}")
        return cls(**values)

    @classmethod
    def from_rollout_config(cls, config: Any) -> MiniteRolloutSettings:
        """The settings from verl's ``RolloutConfig`` (or its DictConfig)."""
        engine_kwargs = _get(config, "engine_kwargs") or {}
        return cls.from_mapping(_get(engine_kwargs, ENGINE_KWARGS_KEY))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["exclude"] = list(self.exclude)
        return d

    def overrides(self) -> list[str]:
        """Hydra overrides that put these settings into verl's config (``+`` adds the keys verl does not have)."""
        return [f"+{OVERRIDE_PREFIX}.{k}={hydra_value(v)}" for k, v in self.to_dict().items()]


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping) or hasattr(obj, "get"):
        return obj.get(key)
    return getattr(obj, key, None)


def _plain(values: Any) -> dict | None:
    if values is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(values, DictConfig):
            return OmegaConf.to_container(values, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    if not isinstance(values, Mapping):
        raise TypeError(f"{OVERRIDE_PREFIX} must be a mapping of minite rollout settings, got {type(values).__name__}")
    return dict(values)


def hydra_value(value: Any, *, quote: bool = False) -> str:
    """A Hydra override value: literals for bools, numbers and null; lists in brackets and mappings in braces;
    strings plain when they are plain names (``quote``: always quoted), else quoted; Hydra reads a backslash as an
    escape only before a quote or the closing quote, so only those are doubled and a regex arrives as written."""
    if quote:
        return _quoted(str(value))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    s = str(value)
    if re.fullmatch(r"[A-Za-z_][\w.\-/]*", s) and s not in ("null", "true", "false"):
        return s
    return _quoted(s)


def _quoted(s: str) -> str:
    s = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, s)
    return "'" + s.replace("'", "\\'") + "'"

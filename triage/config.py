"""TriageConfig: every constant of the TRIAGE loss, validated on construction.

Values the report publishes (§3.1, Appendix B): 64-token gate segments, mean tiers -1.5 / -0.5 with
weights 0.1 / 0.3 / 1.0, tail threshold -6 with cap k = 2 and attenuation 0.9, 128-token repair
segments, pseudo-Huber repair. Values it does not publish are chosen in ``docs/TRIAGE.md`` and are
marked "(ours)": repair boundary -0.5, Huber delta 1.0, repair coefficient 0.1. The TIS cap C = 2 follows
verl's default. The PPO clip ratios are not published either: the project's single definition is
:data:`CLIP_RATIO_LOW`, :data:`CLIP_RATIO_HIGH` and :data:`CLIP_RATIO_C` below, which the trainer's
``algorithm.clip_ratio_*`` defaults also use.

Example::

    >>> TriageConfig(repair=False).repair_coef
    0.1
    >>> TriageConfig(gate_segment_len=0)
    Traceback (most recent call last):
    ...
    ValueError: TriageConfig.gate_segment_len must be a positive int, got 0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minite_util.choices import did_you_mean

#: PPO clip range [1 - low, 1 + high] and dual-clip bound for A < 0. The report does not state its values;
#: these are DAPO's clip-higher (0.28 above, 0.2 below) and verl's dual-clip 3. verl's own actor defaults to 0.2
#: above, so ``triage.verl.verl_overrides`` always passes the ratios.
CLIP_RATIO_LOW = 0.2
CLIP_RATIO_HIGH = 0.28
CLIP_RATIO_C = 3.0


@dataclass(frozen=True)
class TriageConfig:
    """Constants of ``docs/TRIAGE.md``; ablation switches ``gate``, ``repair``, ``tis``."""

    # §2 direction gate (report Appendix B)
    gate_segment_len: int = 64
    gate_tier_low: float = -1.5  # mu < gate_tier_low                    -> gate_weight_low
    gate_tier_high: float = -0.5  # gate_tier_low <= mu < gate_tier_high -> gate_weight_mid, else high
    gate_weight_low: float = 0.1
    gate_weight_mid: float = 0.3
    gate_weight_high: float = 1.0
    gate_tail_threshold: float = -6.0  # a valid token with delta < this counts toward k
    gate_tail_k_cap: int = 2  # w_tail = 1 - gate_tail_attenuation * min(k / gate_tail_k_cap, 1)
    gate_tail_attenuation: float = 0.9
    # §4 repair (report §3.1; constants ours)
    repair_segment_len: int = 128
    repair_boundary: float = -0.5
    repair_huber_delta: float = 1.0
    repair_coef: float = 0.1
    # §1 TIS (verl's default cap) and PPO clipping (the constants above)
    tis_cap: float = 2.0
    clip_ratio_low: float = CLIP_RATIO_LOW
    clip_ratio_high: float = CLIP_RATIO_HIGH
    clip_ratio_c: float = CLIP_RATIO_C
    # ablation switches
    gate: bool = True
    repair: bool = True
    tis: bool = True
    # compute the §6 diagnostics together with the loss (metrics dict); the loss value does not depend on it
    diagnostics: bool = True
    # on CUDA, run the fused pass padded to a shape bucket and replayed as a CUDA graph (``triage.graphs``): the
    # same kernels with one launch; values equal the eager pass's up to the order of fp32 sums
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise TypeError(f"TriageConfig.{f.name} must be a bool, got {value!r}")
            elif f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"TriageConfig.{f.name} must be an int, got {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"TriageConfig.{f.name} must be a finite number, got {value!r}")
        for name in ("gate_segment_len", "repair_segment_len", "gate_tail_k_cap"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TriageConfig.{name} must be a positive int, got {getattr(self, name)}")
        if not self.gate_tier_low < self.gate_tier_high:
            raise ValueError(
                "TriageConfig tiers out of order: need gate_tier_low < gate_tier_high, got "
                f"gate_tier_low={self.gate_tier_low}, gate_tier_high={self.gate_tier_high}"
            )
        if not 0.0 < self.gate_weight_low <= self.gate_weight_mid <= self.gate_weight_high <= 1.0:
            raise ValueError(
                "TriageConfig tier weights out of order: need 0 < gate_weight_low <= gate_weight_mid <= "
                f"gate_weight_high <= 1, got gate_weight_low={self.gate_weight_low}, "
                f"gate_weight_mid={self.gate_weight_mid}, gate_weight_high={self.gate_weight_high}"
            )
        if not 0.0 <= self.gate_tail_attenuation < 1.0:
            raise ValueError(
                f"TriageConfig.gate_tail_attenuation must be in [0, 1), got {self.gate_tail_attenuation}"
            )
        if self.repair_huber_delta <= 0:
            raise ValueError(f"TriageConfig.repair_huber_delta must be > 0, got {self.repair_huber_delta}")
        if self.repair_coef < 0:
            raise ValueError(f"TriageConfig.repair_coef must be >= 0, got {self.repair_coef}")
        if self.tis_cap <= 0:
            raise ValueError(f"TriageConfig.tis_cap must be > 0, got {self.tis_cap}")
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ValueError(f"TriageConfig.clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}")
        if self.clip_ratio_high < 0:
            raise ValueError(f"TriageConfig.clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_c <= 1.0:
            raise ValueError(
                f"TriageConfig.clip_ratio_c must be > 1 (dual-clip bound), got {self.clip_ratio_c}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | TriageConfig | None) -> TriageConfig:
        """Build from a dict / OmegaConf node; unknown keys are an error naming the closest field."""
        if values is None:
            return cls()
        if isinstance(values, cls):
            return values
        if not isinstance(values, Mapping):
            raise TypeError(f"TriageConfig.from_mapping expects a mapping, got {type(values).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key == "_target_":
                continue
            if key not in names:
                raise ValueError(f"unknown TriageConfig field {key!r}{did_you_mean(key, names)}; "
                                 f"valid fields: {', '.join(names)}")
            kwargs[key] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


DEFAULT_CONFIG = TriageConfig()

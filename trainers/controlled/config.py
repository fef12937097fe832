"""The controlled study's settings: frozen dataclasses, read from a YAML study file plus ``key=value`` overrides.

    python -m trainers.controlled recipes/studies/controlled.yaml learning.seeds=8 gradient.seeds=16

Every key is checked before anything runs: an unknown key is a one-line error naming the closest key and the
valid ones, a bad value names the key, the value and what it must be (``ControlledConfigError``). Values are
parsed with OmegaConf's grammar (numbers, booleans, ``[a,b]`` lists).

Worked example::

    >>> load_controlled(None, ["task.length=256"]).task.length
    256
    >>> load_controlled(None, ["task.lenght=256"])
    Traceback (most recent call last):
    ...
    trainers.controlled.config.ControlledConfigError: unknown config key 'task.lenght'; did you mean 'task.length'? (valid: ...
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from dataclasses import dataclass, field

from minite_util.choices import did_you_mean
from trainers.config import ConfigError, build

#: the injected sampler mismatches, each studied on its own (``trainers.controlled.mismatch``)
KINDS = ("noise", "temperature", "burst", "nvfp4")
#: the estimators: samples from the learner itself, and ways of using a mismatched sampler's samples (TRIAGE and
#: its two parts on top of TIS, as ablations)
ARMS = ("on_policy", "none", "tis", "triage", "gate_only", "repair_only")
#: the magnitude each kind's sweep varies (``gradient.sweep``)
SWEEP_PARAM = {"noise": "noise_sigma", "temperature": "temperature", "burst": "burst_logit"}


class ControlledConfigError(ConfigError):
    """A bad study file or override; the message names the key, the value and the valid choices."""


@dataclass(frozen=True)
class TaskConfig:
    vocab: int = 8  # tokens 0..V-1; a prompt is (start token, stride), both in 0..V-1
    length: int = 512  # response tokens T
    prompts: int = 4  # prompts per batch (GRPO groups)
    group: int = 8  # samples per prompt


@dataclass(frozen=True)
class PolicyConfig:
    hidden: int = 64  # units of each of the two tanh layers (a multiple of 16: NVFP4 blocks run along K)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0  # max gradient norm, per seed (0: off)


@dataclass(frozen=True)
class MismatchConfig:
    noise_sigma: float = 1.0  # noise: i.i.d. N(0, sigma^2) added to every sampler logit
    temperature: float = 1.5  # temperature: the sampler's softmax temperature
    burst_prob: float = 0.1  # burst: the share of 64-token windows that hold a burst
    burst_logit: float = 8.0  # burst: the logit added, at every position of a burst, to one random token
    burst_window: int = 64  # burst: the window length (TRIAGE's gate segment)
    nvfp4_recipe: str = "nvfp4_per_token_w1x16_bf16_bwd"  # nvfp4: the forward GEMMs of this minite recipe
    nvfp4_head: bool = True  # nvfp4: quantize the output layer too (the trainer's default leaves lm_head out)


@dataclass(frozen=True)
class GradientConfig:
    seeds: int = 400  # independent batches per (snapshot, mismatch, arm)
    snapshots: tuple[int, ...] = (10, 25, 45)  # the on-policy training steps of the parameters examined
    reference_batches: int = 8000  # on-policy batches averaged into the reference gradient
    chunk: int = 100  # seeds computed at once (memory)
    # magnitudes each kind is also measured at (its SWEEP_PARAM); the mismatch section's value is the headline
    sweep: dict = field(default_factory=lambda: {"noise": [0.5, 2.0], "temperature": [0.7, 1.25, 2.0],
                                                 "burst": [4.0, 12.0]})


@dataclass(frozen=True)
class LearningConfig:
    seeds: int = 100  # training runs per (mismatch, arm), all at once
    steps: int = 100
    eval_every: int = 5  # the learner's exact expected reward every N steps (and at step 0)
    checkpoint_every: int = 25  # steps between resumable checkpoints in work_dir (0: none)


@dataclass(frozen=True)
class StatsConfig:
    bootstrap: int = 10000  # resamples of the seeds for every confidence interval
    permutations: int = 20000  # random sign flips for every paired p-value
    level: float = 0.95  # confidence level
    seed: int = 0


@dataclass(frozen=True)
class ControlledConfig:
    name: str = "controlled"
    output_dir: str = "benchmarks/controlled"  # results: json, markdown, figures (small; committed)
    work_dir: str = "runs/controlled"  # resumable parts and checkpoints
    kinds: tuple[str, ...] = KINDS
    arms: tuple[str, ...] = ARMS
    seed: int = 0  # every random draw is a function of (seed, purpose, seed index, step)
    threads: int = 1  # torch CPU threads (0: torch's default)
    task: TaskConfig = field(default_factory=TaskConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)
    gradient: GradientConfig = field(default_factory=GradientConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _choices(key: str, values: tuple[str, ...], valid: tuple[str, ...]) -> None:
    for v in values:
        if v not in valid:
            raise ControlledConfigError(f"{key}: {v!r} is not valid{did_you_mean(v, valid)}; valid choices: "
                                        + ", ".join(valid))
    if not values or len(set(values)) != len(values):
        raise ControlledConfigError(f"{key} must be a non-empty list without repeats, got {list(values)}")


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ControlledConfigError(f"{key}={value!r} must be >= {low}")


def validate(cfg: ControlledConfig) -> ControlledConfig:
    """Check every value's range (types are checked while building); returns ``cfg``."""
    from minite_kernels.recipes import RecipeError, resolve_recipe

    _choices("kinds", cfg.kinds, KINDS)
    _choices("arms", cfg.arms, ARMS)
    t = cfg.task
    for key, value, low in (("task.vocab", t.vocab, 2), ("task.length", t.length, 1), ("task.prompts", t.prompts, 1),
                            ("task.group", t.group, 2), ("threads", cfg.threads, 0),
                            ("gradient.seeds", cfg.gradient.seeds, 2), ("gradient.reference_batches",
                                                                         cfg.gradient.reference_batches, 1),
                            ("gradient.chunk", cfg.gradient.chunk, 1), ("learning.seeds", cfg.learning.seeds, 2),
                            ("learning.steps", cfg.learning.steps, 1), ("learning.eval_every",
                                                                        cfg.learning.eval_every, 1),
                            ("learning.checkpoint_every", cfg.learning.checkpoint_every, 0),
                            ("stats.bootstrap", cfg.stats.bootstrap, 100), ("stats.permutations",
                                                                            cfg.stats.permutations, 100),
                            ("optim.grad_clip", cfg.optim.grad_clip, 0.0), ("mismatch.noise_sigma",
                                                                            cfg.mismatch.noise_sigma, 0.0),
                            ("mismatch.burst_logit", cfg.mismatch.burst_logit, 0.0),
                            ("mismatch.burst_window", cfg.mismatch.burst_window, 1)):
        _at_least(key, value, low)
    if 2 * t.vocab % 16:
        raise ControlledConfigError(f"task.vocab={t.vocab}: the policy's input (2 * vocab one-hots) must be a "
                                    "multiple of 16, the NVFP4 block along K; valid: 8, 16, 24, ...")
    if cfg.policy.hidden < 16 or cfg.policy.hidden % 16:
        raise ControlledConfigError(f"policy.hidden={cfg.policy.hidden} must be a positive multiple of 16 "
                                    "(the NVFP4 block along K)")
    if not cfg.optim.lr > 0:
        raise ControlledConfigError(f"optim.lr={cfg.optim.lr} must be > 0")
    if not cfg.mismatch.temperature > 0:
        raise ControlledConfigError(f"mismatch.temperature={cfg.mismatch.temperature} must be > 0")
    if not 0.0 <= cfg.mismatch.burst_prob <= 1.0:
        raise ControlledConfigError(f"mismatch.burst_prob={cfg.mismatch.burst_prob} must be in [0, 1]")
    if not 0.5 < cfg.stats.level < 1.0:
        raise ControlledConfigError(f"stats.level={cfg.stats.level} must be in (0.5, 1)")
    try:
        resolve_recipe(cfg.mismatch.nvfp4_recipe, env={})
    except RecipeError as e:
        raise ControlledConfigError(f"mismatch.nvfp4_recipe: {e}") from None
    snaps = cfg.gradient.snapshots
    if not snaps or any(s < 0 for s in snaps) or len(set(snaps)) != len(snaps):
        raise ControlledConfigError(f"gradient.snapshots={list(snaps)} must be distinct steps >= 0")
    for kind, levels in cfg.gradient.sweep.items():
        if kind not in SWEEP_PARAM:
            raise ControlledConfigError(f"gradient.sweep: {kind!r} has no sweep{did_you_mean(kind, SWEEP_PARAM)};"
                                        f" valid: {', '.join(SWEEP_PARAM)}")
        if isinstance(levels, (str, bytes)) or not isinstance(levels, (list, tuple)) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in levels):
            raise ControlledConfigError(f"gradient.sweep.{kind}={levels!r} must be a list of numbers > 0")
    return cfg


def load_controlled(path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = ()) -> ControlledConfig:
    """The study file (None: the code defaults) with ``key=value`` overrides, built and validated."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    where = "overrides"
    try:
        parts = []
        if path is not None:
            p = pathlib.Path(path)
            if not p.is_file():
                raise ControlledConfigError(f"study file {str(p)!r} does not exist")
            where = str(p)
            parts.append(OmegaConf.load(p))
        parts.append(OmegaConf.from_dotlist(list(overrides)))
        tree = OmegaConf.to_container(OmegaConf.merge(*parts))
    except OmegaConfBaseException as e:
        raise ControlledConfigError(f"{where}: cannot parse the study or its overrides ({e})") from None
    try:  # keys and types: the trainer's schema builder (trainers.config.build); its errors become this module's
        cfg = build(ControlledConfig, tree or {})
    except ConfigError as e:
        raise ControlledConfigError(str(e)) from None
    return validate(cfg)

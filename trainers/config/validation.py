"""Building and checking a configuration: each key and value typed against the schema as a :class:`Config` is
built (:func:`build`; an unknown key names the closest valid one), then the cross-field checks (:func:`validate`)."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import types
import typing
from typing import Any, Literal, Union

from minite_util.choices import did_you_mean
from trainers import losses
from trainers.config.schema import (
    SELF_BUILT,
    AlgorithmConfig,
    ArithmeticConfig,
    Config,
    ConfigError,
    DataConfig,
    EvalConfig,
    OptimConfig,
    RolloutConfig,
    TrainerConfig,
    _hints,
    _is_dc,
    all_keys,
)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, root: type = Config) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and ("on" if value else "off") in choices:
            return "on" if value else "off"  # YAML 1.1 reads an unquoted on / off as a boolean
        if value in choices:
            return value
        raise ConfigError(f"{key}={value!r} is not valid{did_you_mean(value, choices)}; valid choices: "
                          + ", ".join(repr(c) for c in choices))
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, root)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}={value!r} must be {_describe(tp)}" + (f" ({errors[0]})" if errors else ""))
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            if isinstance(value, str) and typing.get_args(tp)[-1] is Ellipsis:
                value = [value]
            else:
                raise ConfigError(f"{key}={value!r} must be a list")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", root) for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}={list(value)!r} must have {len(args)} items")
        return tuple(_coerce(v, a, f"{key}[{i}]", root) for i, (v, a) in enumerate(zip(value, args)))
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # 1e400 parses as inf, .nan as nan: neither is a setting
                raise ConfigError(f"{key}={value!r} must be a finite number")
            return float(value)
        raise ConfigError(f"{key}={value!r} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}={value!r} must be a string")
    if tp in SELF_BUILT:
        try:
            return tp.from_mapping(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{key}: {e}") from None
    if _is_dc(tp):
        return build(tp, value, key + ".", root)
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def _unknown(key: str, root: type = Config) -> ConfigError:
    valid = all_keys(root)
    hint = did_you_mean(key, valid, cutoff=0.5)
    if not hint:  # the same leaf under another section
        leaf = key.rsplit(".", 1)[-1]
        hint = did_you_mean(leaf, [k for k in valid if k.rsplit(".", 1)[-1] == leaf], cutoff=0.0)
    # the trainer's schema is too long to print in one line; a smaller one (trainers.controlled) lists its keys
    where = ("list them all with `python -m trainers.grpo --keys`" if root is Config
             else "valid: " + ", ".join(valid))
    return ConfigError(f"unknown config key {key!r}{hint} ({where})")


def build(cls: type, data: Any, prefix: str = "", root: type | None = None) -> Any:
    """Build dataclass `cls` from a nested mapping, validating every key and value.

    ``root`` is the schema the whole mapping follows (default: ``cls``), whose keys an unknown key is matched
    against; any frozen-dataclass schema works (``trainers.controlled.config`` builds its own with it)."""
    root = cls if root is None else root
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            raise _unknown(key, root)
        kwargs[k] = _coerce(v, hints[k], key, root)
    obj = cls(**kwargs)
    _check_values(obj, prefix)
    return obj


def _positive(obj: Any, prefix: str, *names: str, allow_zero: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is not None and (v < 0 if allow_zero else v <= 0):
            raise ConfigError(f"{prefix}{n}={v!r} must be {'>= 0' if allow_zero else '> 0'}")


def _check_values(obj: Any, prefix: str) -> None:
    if isinstance(obj, RolloutConfig):
        _positive(obj, prefix, "prompts_per_step", "n", "max_new_tokens", "batch_size")
        _positive(obj, prefix, "temperature", allow_zero=True)
        if not 0 < obj.top_p <= 1:
            raise ConfigError(f"{prefix}top_p={obj.top_p} must be in (0, 1]")
        if obj.top_k == 0 or obj.top_k < -1:
            raise ConfigError(f"{prefix}top_k={obj.top_k} must be -1 (off) or >= 1")
    elif isinstance(obj, AlgorithmConfig):
        _positive(obj, prefix, "ppo_epochs", "mini_batches", "micro_batch_size", "clip_ratio_c")
        _positive(obj, prefix, "clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy_coeff",
                  "micro_batch_tokens", "log_prob_micro_batch_size", "log_prob_micro_batch_tokens",
                  allow_zero=True)
        if obj.clip_ratio_c <= 1:
            raise ConfigError(f"{prefix}clip_ratio_c={obj.clip_ratio_c} must be > 1 (dual-clip bound)")
    elif isinstance(obj, OptimConfig):
        _positive(obj, prefix, "lr", "eps")
        _positive(obj, prefix, "weight_decay", "grad_clip", "warmup_steps", allow_zero=True)
    elif isinstance(obj, TrainerConfig):
        _positive(obj, prefix, "max_steps", "logprob_chunk_size", "keep_checkpoints", "max_consecutive_nan")
        _positive(obj, prefix, "save_every", allow_zero=True)
        _positive(obj, prefix, "cpu_threads")
        _positive(obj, prefix, "log_samples", allow_zero=True)
    elif isinstance(obj, EvalConfig):
        _positive(obj, prefix, "every", "temperature", allow_zero=True)
        _positive(obj, prefix, "limit", "samples", "max_new_tokens", "batch_size")
        if not 0 < obj.top_p <= 1:
            raise ConfigError(f"{prefix}top_p={obj.top_p} must be in (0, 1]")
    elif isinstance(obj, ArithmeticConfig):
        _positive(obj, prefix, "size")
        bad = [lv for lv in obj.levels if lv not in (1, 2, 3, 4)]
        if bad or not obj.levels:
            raise ConfigError(f"{prefix}levels={list(obj.levels)} must be a non-empty list drawn from [1, 2, 3, 4]")
    elif isinstance(obj, DataConfig):
        _positive(obj, prefix, "max_prompt_tokens", "limit")


def validate(cfg: Config) -> Config:
    """Cross-field checks (the per-field ones ran while building)."""
    if cfg.rollout.top_p < 1 or cfg.rollout.top_k != -1:
        raise ConfigError(
            f"rollout.top_p={cfg.rollout.top_p} / rollout.top_k={cfg.rollout.top_k}: truncated sampling is refused "
            "for training. The learner would have to recompute log-probs under the same truncation, and a token "
            "the sampler kept can fall outside the learner's (differently rounded) top-p set, giving an infinite "
            "gap (verl issue #6240). Use top_p=1, top_k=-1 (the RL default); the sampler supports truncation "
            "for evaluation.")
    for key, name in (("precision.learner", cfg.precision.learner), ("precision.sampler", cfg.precision.sampler),
                      ("eval.precision", cfg.eval.precision)):
        if name in ("bf16", "auto", None):
            continue
        try:
            from minite_kernels.recipes import recipe_names
        except ImportError:  # pragma: no cover - minite_kernels ships with this project
            break
        valid = ["bf16", "auto"] + [n for n in recipe_names() if n != "bf16"]
        if name not in valid:
            raise ConfigError(f"{key}={name!r} is not a precision recipe{did_you_mean(name, valid)}; "
                              "valid choices: "
                              + ", ".join(valid))
    if cfg.precision.alignment == "strict" and cfg.precision.learner != cfg.precision.sampler:
        raise ConfigError(
            f"precision.learner={cfg.precision.learner!r} != precision.sampler={cfg.precision.sampler!r}: strict "
            "alignment makes the sampler compute the learner's bits, which needs one precision recipe for both. "
            "Set them equal (precision=NAME), or use precision.alignment=default")
    if cfg.engine == "verl" and any(isinstance(e, int) for e in cfg.precision.exclude):
        raise ConfigError(
            f"precision.exclude={list(cfg.precision.exclude)!r}: block indices apply to engine=local; with "
            "engine=verl name the modules instead (e.g. 're:layers\\.0\\.'), so the learner and vLLM's ignore "
            "list agree")
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", cfg.model.device):
        raise ConfigError(f"model.device={cfg.model.device!r} is not a device; valid: auto, cpu, cuda, cuda:N, mps")
    if cfg.precision.alignment == "strict" and cfg.engine != "local":
        raise ConfigError(
            f"precision.alignment=strict runs with engine=local (its sampler and learner share the strict kernels); "
            f"got engine={cfg.engine}. Use engine=local, or precision.alignment=default")
    if cfg.precision.alignment == "strict" and cfg.precision.backend not in ("auto", "strict", "emulated"):
        raise ConfigError(
            f"precision.alignment=strict runs the quantized linears as dequantized GEMMs, which the batch-invariant "
            f"kernels compute (backend strict: the Triton quantizer where it runs; emulated: pure PyTorch); got "
            f"precision.backend={cfg.precision.backend}. Valid with strict: auto, strict, emulated")
    if cfg.eval.precision is not None and not cfg.eval.every:
        raise ConfigError(f"eval.precision={cfg.eval.precision} adds an eval to the run's own (eval.every), which "
                          "is 0: set eval.every=N, or eval.precision=null")
    if cfg.eval.every:
        from eval.task import get_task, task_names

        if not cfg.eval.tasks or len(set(cfg.eval.tasks)) != len(cfg.eval.tasks):
            raise ConfigError(f"eval.tasks={list(cfg.eval.tasks)!r} must list distinct tasks; valid tasks: "
                              f"{', '.join(task_names())}")
        for t in cfg.eval.tasks:
            try:
                get_task(t)
            except ValueError as e:
                raise ConfigError(f"eval.tasks: {e}") from None
        if cfg.engine == "verl":
            raise ConfigError(f"eval.every={cfg.eval.every} runs on engine=local; engine=verl validates on its val "
                              "split with verl's own trainer.test_freq (verl.extra=[trainer.test_freq=N]). Use "
                              "eval.every=0 with engine=verl")
    if cfg.engine == "verl" and cfg.optim.impl == "minite":
        raise ConfigError("optim.impl='minite' applies to engine=local; verl's FSDP workers build their own "
                          "optimizer (valid with engine=verl: 'auto', 'torch')")
    try:
        losses.check(cfg.algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    group = cfg.rollout.prompts_per_step * cfg.rollout.n
    if group % cfg.algorithm.mini_batches:
        raise ConfigError(f"algorithm.mini_batches={cfg.algorithm.mini_batches} must divide "
                          f"rollout.prompts_per_step * rollout.n = {group}")
    if cfg.trainer.resume not in ("auto", "force", "never") and not pathlib.Path(cfg.trainer.resume).is_dir():
        raise ConfigError(f"trainer.resume={cfg.trainer.resume!r}: valid choices are 'auto', 'force', 'never' or an "
                          "existing checkpoint directory")
    if cfg.reward.fn is not None and ":" not in cfg.reward.fn:
        raise ConfigError(f"reward.fn={cfg.reward.fn!r} must look like 'package.module:function'")
    return cfg

"""Reward functions for the trainer: built-in verifiable scorers and the ``reward.fn=module:function`` hook.

A reward function has verl's ``compute_score`` signature, so the same function works with ``engine=local``
and ``engine=verl`` (``reward.custom_reward_function``)::

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None)
        -> float | int | bool | dict            # a dict must hold "score"; its other numeric keys are logged

``solution_str`` is the decoded response (special tokens skipped), ``ground_truth`` the gold answer and
``extra_info`` holds ``question``, ``index`` and ``step``. It is called with keyword arguments. An exception
or a non-finite / non-numeric result stops the run with an error naming the function and the sample; the
step is not applied, so earlier steps and checkpoints are untouched.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

RewardFn = Callable[..., Any]


class RewardError(RuntimeError):
    """The reward function failed or returned something that is not a score."""


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Built-in scorer: GSM8K-style last-number / '####' answers for arithmetic and GSM8K, math-verify otherwise."""
    from scoring.math import score_gsm8k, score_math

    if data_source in ("arithmetic", "openai/gsm8k", "gsm8k"):
        return float(score_gsm8k(solution_str, ground_truth))
    return float(score_math(solution_str, ground_truth))


def load_reward_fn(spec: str | None) -> tuple[RewardFn, str]:
    """Resolve ``module:function`` (or None for the built-in scorer) to (callable, name)."""
    if spec is None:
        return compute_score, "trainers.rewards.registry:compute_score"
    if ":" not in spec:
        raise RewardError(f"reward.fn={spec!r} must look like 'package.module:function'")
    mod_name, fn_name = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise RewardError(f"reward.fn={spec!r}: cannot import module {mod_name!r} ({e})") from e
    fn = getattr(mod, fn_name, None)
    if fn is None or not callable(fn):
        public = sorted(n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n)))
        raise RewardError(f"reward.fn={spec!r}: module {mod_name!r} has no function {fn_name!r}; "
                          f"callables there: {', '.join(public) or '(none)'}")
    return fn, spec


def score_one(fn: RewardFn, name: str, *, data_source: str, response: str, ground_truth: str, extra_info: dict,
              sample: str) -> tuple[float, dict[str, float]]:
    """Call a reward function, validate its result, and return (score, extra numeric fields)."""
    try:
        out = fn(data_source=data_source, solution_str=response, ground_truth=ground_truth, extra_info=extra_info)
    except Exception as e:
        raise RewardError(f"reward function {name} raised {type(e).__name__}: {e} on {sample} "
                          f"(response {response[:200]!r})") from e
    extra: dict[str, float] = {}
    if isinstance(out, dict):
        if "score" not in out:
            raise RewardError(f"reward function {name} returned a dict without 'score' on {sample}: {out!r}")
        extra = {k: float(v) for k, v in out.items()
                 if k != "score" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        out = out["score"]
    if isinstance(out, bool):
        out = float(out)
    if not isinstance(out, (int, float)) or not math.isfinite(float(out)):
        raise RewardError(f"reward function {name} returned {out!r} on {sample}; expected a finite number "
                          "(or a dict with a 'score')")
    return float(out), extra

"""Held-out evaluation inside a training run (``eval.every``; verl's ``trainer.test_freq``).

After every ``eval.every``-th step and after the last step, the run's own sampler answers the ``eval.tasks`` of
``python -m eval``: the policy exactly as it samples rollouts (the same model object, precision recipe and
alignment, the CUDA graphs already captured), so no checkpoint is loaded and no second process starts. The results
go where ``eval run`` puts them, ``<output_dir>/eval/step_<N>/`` (``results.json``, ``results.md``,
``samples.jsonl``, next to the checkpoint ``checkpoints/step_<N>`` they describe), and into that step's metrics:

    val/<task>     mean over the k samples of the task's primary score (e.g. val/arithmetic_cot 0.41)
    val/average    the equal-weighted mean over tasks
    timing/eval_s  wall time of the evaluation (not counted in perf/step_s)

With ``eval.precision`` (say ``bf16``) the same eval also runs under that one sampler precision, on a copy of the
policy the trainer keeps for it (:class:`CommonEval`), into ``<output_dir>/eval@bf16/step_<N>/`` and
``val@bf16/<task>``: every arm of a study read at one precision, next to its own. Where the run's own sampler
already is that precision (same recipe, ``lm_head`` alone kept high, default alignment), its results are copied.

Generation is seeded by ``eval.seed`` alone and the global RNG states are restored afterwards, so a run with evals
draws the same rollouts as one without. A step whose ``results.json`` exists is not evaluated again: a resumed run
keeps the evals it already has, and drops those of steps after the checkpoint it resumes from.
"""
from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

import torch

from trainers.config import Config


def due(cfg: Config, step: int) -> bool:
    """Whether the run evaluates after ``step`` (1-based): every ``eval.every`` steps, and after the last."""
    every = cfg.eval.every
    return bool(every) and (step % every == 0 or step == cfg.trainer.max_steps)


def check(cfg: Config) -> None:
    """Load what the evals need (each task's rows, IFEval's checkers) before training starts, so a missing piece
    fails now, not at the first eval step."""
    if not cfg.eval.every:
        return
    from eval.data import load_rows
    from eval.task import get_task

    from trainers.config import ConfigError

    for name in cfg.eval.tasks:
        task = get_task(name)
        try:
            load_rows(task)
            if task.name == "ifeval":
                from eval.ifeval_checkers import instruction_registry

                instruction_registry()
        except (OSError, ValueError, ImportError) as e:
            raise ConfigError(f"eval.tasks: {name} cannot be evaluated: {e}") from None


def eval_dir(run_dir: pathlib.Path, step: int, precision: str | None = None) -> pathlib.Path:
    """``<run>/eval/step_<N>`` (``precision``: ``<run>/eval@<precision>/step_<N>``), named as the checkpoint of
    that step (``trainers.checkpoint``)."""
    return run_dir / ("eval" if precision is None else f"eval@{precision}") / f"step_{step:06d}"


def drop_after(run_dir: pathlib.Path, step: int) -> list[str]:
    """Remove the evals of steps after ``step``, where a resumed (or restarted, ``step`` 0) run continues: they
    describe the interrupted execution's later policy, as its metrics rows after ``step`` do. Returns their names."""
    import shutil

    gone = []
    for d in sorted(d for top in ("eval", "eval@*") for d in run_dir.glob(f"{top}/step_*")):
        if d.is_dir() and d.name[5:].isdigit() and int(d.name[5:]) > step:
            shutil.rmtree(d)
            gone.append(d.name if d.parent.name == "eval" else f"{d.parent.name}/{d.name}")
    return gone


def metrics_of(results: dict, prefix: str = "val") -> dict[str, float]:
    """``<prefix>/<task>`` and ``<prefix>/average`` from an ``eval run`` results dict."""
    out = {f"{prefix}/{name}": float(t["mean"]) for name, t in results["tasks"].items() if "mean" in t}
    avg = results.get("average") or {}
    if avg.get("mean") is not None:
        out[f"{prefix}/average"] = float(avg["mean"])
    return out


def evaluate(cfg: Config, step: int, *, sampler, tokenizer, precision: dict[str, Any], device: torch.device,
             run_dir: pathlib.Path, common: bool = False) -> dict[str, float]:
    """Evaluate the current policy after ``step``; returns the ``val/*`` metrics (those on disk if the step was
    evaluated before). ``common``: ``sampler`` is the :class:`CommonEval` one, under ``eval.precision``, and the
    results go to ``eval@<precision>`` and ``val@<precision>/*``."""
    import json

    from eval.engines import GenerationParams
    from eval.engines.local import LocalEngine
    from eval.runner import RunConfig, run_eval

    tag = cfg.eval.precision if common else None
    prefix = "val" if tag is None else f"val@{tag}"
    out_dir = eval_dir(run_dir, step, tag)
    done = out_dir / "results.json"
    if done.is_file():
        try:
            return metrics_of(json.loads(done.read_text()), prefix)
        except (ValueError, KeyError, TypeError):  # unreadable: evaluate again, run_eval replaces it
            pass
    e = cfg.eval
    recipe = precision.get("recipe") if precision.get("patched") else None
    alignment = "default" if common else cfg.precision.alignment
    rc = RunConfig(model=f"{cfg.model.path} (training step {step})", tasks=tuple(e.tasks),
                   samples={t: e.samples for t in e.tasks}, precision=recipe, protocol="quick",
                   alignment=alignment, limit=e.limit, output_dir=str(out_dir),
                   params=GenerationParams(temperature=e.temperature, top_p=e.top_p, max_new_tokens=e.max_new_tokens,
                                           seed=e.seed, batch_size=e.batch_size),
                   device=str(device), dtype=cfg.model.dtype)
    engine = LocalEngine.of_sampler(sampler, tokenizer, precision=recipe, alignment=alignment,
                                    quantization=precision, info={"model": rc.model, "training_step": step})
    t0 = time.perf_counter()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the run's RNG streams continue as without the eval
        results = run_eval(rc, engine=engine, show_progress=False)
    metrics = metrics_of(results, prefix)
    shown = ", ".join(f"{k[len(prefix) + 1:]} {v:.3f}" for k, v in metrics.items())
    took = time.perf_counter() - t0
    metrics["timing/eval_s" if tag is None else f"timing/eval@{tag}_s"] = took
    print(f"[trainers] eval{'' if tag is None else ' @' + tag} after step {step}: {shown} ({took:.1f} s, {out_dir})",
          file=sys.stderr)
    return metrics


def own_is_common(cfg: Config) -> bool:
    """Whether the run's own sampler already is ``eval.precision`` as :class:`CommonEval` would patch it: the same
    recipe, ``lm_head`` alone kept high (plain linears: nothing to keep), default alignment."""
    from rollout.precision import resolved_recipe_name

    p, own = cfg.eval.precision, cfg.precision.sampler
    if p is None or cfg.precision.alignment != "default" or resolved_recipe_name(p) != resolved_recipe_name(own):
        return False
    return own == "bf16" or [str(e) for e in cfg.precision.exclude] == ["lm_head"]


class CommonEval:
    """The policy under ``eval.precision``, for the second eval: a copy of the unpatched model, patched with that
    recipe (``lm_head`` kept high, default alignment), with its own sampler. :meth:`refresh` copies the learner's
    parameters into it (in place) and re-quantizes, before each eval."""

    def __init__(self, cfg: Config, model, tokenizer) -> None:
        import copy

        from rollout import make_sampler
        from rollout.precision import Requantizer, patch_precision

        self.model = copy.deepcopy(model).requires_grad_(False).eval()  # called before any recipe patches ``model``
        self.precision = patch_precision(self.model, cfg.eval.precision, exclude=("lm_head",),
                                         backend=cfg.precision.backend)
        self.sampler = make_sampler(self.model, tokenizer, batch_size=cfg.eval.batch_size,
                                    engine=cfg.rollout.sampler, alignment="default")
        self._requantize = Requantizer(self.model, self.sampler.pad_id)

    def refresh(self, learner) -> None:
        theirs = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, p in learner.named_parameters():
                theirs[name].copy_(p)
        if self.precision.get("patched"):
            self._requantize()


def evaluate_common(cfg: Config, step: int, *, common: CommonEval | None, learner, tokenizer,
                    device: torch.device, run_dir: pathlib.Path) -> dict[str, float]:
    """The ``eval.precision`` eval after ``step`` (``val@<precision>/*``). ``common`` None: the run's own sampler
    is that precision (:func:`own_is_common`), and its eval of this step, already made, is copied."""
    import json
    import shutil

    tag = cfg.eval.precision
    if common is not None:
        common.refresh(learner)
        return evaluate(cfg, step, sampler=common.sampler, tokenizer=tokenizer, precision=common.precision,
                        device=device, run_dir=run_dir, common=True)
    src, dst = eval_dir(run_dir, step), eval_dir(run_dir, step, tag)
    if not (dst / "results.json").is_file():
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    return metrics_of(json.loads((dst / "results.json").read_text()), f"val@{tag}")

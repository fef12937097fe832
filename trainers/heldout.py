"""Held-out evaluation inside a training run (``eval.every``; verl's ``trainer.test_freq``).

After every ``eval.every``-th step and after the last step, the run's own sampler answers the ``eval.tasks`` of
``python -m eval``: the policy exactly as it samples rollouts (the same model object, precision recipe and
alignment, the CUDA graphs already captured), so no checkpoint is loaded and no second process starts. The results
go where ``eval run`` puts them, ``<output_dir>/eval/step_<N>/`` (``results.json``, ``results.md``,
``samples.jsonl``, next to the checkpoint ``checkpoints/step_<N>`` they describe), and into that step's metrics:

    val/<task>     mean over the k samples of the task's primary score (e.g. val/arithmetic_cot 0.41)
    val/average    the equal-weighted mean over tasks
    timing/eval_s  wall time of the evaluation (not counted in perf/step_s)

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


def eval_dir(run_dir: pathlib.Path, step: int) -> pathlib.Path:
    """``<run>/eval/step_<N>``: named as the checkpoint of that step (``trainers.checkpoint``)."""
    return run_dir / "eval" / f"step_{step:06d}"


def drop_after(run_dir: pathlib.Path, step: int) -> list[str]:
    """Remove the evals of steps after ``step``, where a resumed (or restarted, ``step`` 0) run continues: they
    describe the interrupted execution's later policy, as its metrics rows after ``step`` do. Returns their names."""
    import shutil

    gone = []
    for d in sorted((run_dir / "eval").glob("step_*")):
        if d.is_dir() and d.name[5:].isdigit() and int(d.name[5:]) > step:
            shutil.rmtree(d)
            gone.append(d.name)
    return gone


def metrics_of(results: dict) -> dict[str, float]:
    """``val/<task>`` and ``val/average`` from an ``eval run`` results dict."""
    out = {f"val/{name}": float(t["mean"]) for name, t in results["tasks"].items() if "mean" in t}
    avg = results.get("average") or {}
    if avg.get("mean") is not None:
        out["val/average"] = float(avg["mean"])
    return out


def evaluate(cfg: Config, step: int, *, sampler, tokenizer, precision: dict[str, Any], device: torch.device,
             run_dir: pathlib.Path) -> dict[str, float]:
    """Evaluate the current policy after ``step``; returns the ``val/*`` metrics (those on disk if the step was
    evaluated before)."""
    import json

    from eval.engines import GenerationParams
    from eval.engines.local import LocalEngine
    from eval.runner import RunConfig, run_eval

    out_dir = eval_dir(run_dir, step)
    done = out_dir / "results.json"
    if done.is_file():
        try:
            return metrics_of(json.loads(done.read_text()))
        except (ValueError, KeyError, TypeError):  # unreadable: evaluate again, run_eval replaces it
            pass
    e = cfg.eval
    recipe = precision.get("recipe") if precision.get("patched") else None
    rc = RunConfig(model=f"{cfg.model.path} (training step {step})", tasks=tuple(e.tasks),
                   samples={t: e.samples for t in e.tasks}, precision=recipe, protocol="quick",
                   alignment=cfg.precision.alignment, limit=e.limit, output_dir=str(out_dir),
                   params=GenerationParams(temperature=e.temperature, top_p=e.top_p, max_new_tokens=e.max_new_tokens,
                                           seed=e.seed, batch_size=e.batch_size),
                   device=str(device), dtype=cfg.model.dtype)
    engine = LocalEngine.of_sampler(sampler, tokenizer, precision=recipe, alignment=cfg.precision.alignment,
                                    quantization=precision, info={"model": rc.model, "training_step": step})
    t0 = time.perf_counter()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the run's RNG streams continue as without the eval
        results = run_eval(rc, engine=engine, show_progress=False)
    metrics = metrics_of(results)
    shown = ", ".join(f"{k[4:]} {v:.3f}" for k, v in metrics.items())
    metrics["timing/eval_s"] = time.perf_counter() - t0
    print(f"[trainers] eval after step {step}: {shown} ({metrics['timing/eval_s']:.1f} s, {out_dir})", file=sys.stderr)
    return metrics

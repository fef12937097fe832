"""What the runs left on disk, summarised: metrics and eval results read back, per-run records,
the mean and sample std over seeds per arm, and the arms against the baseline (:func:`summarize`)."""
from __future__ import annotations

import json
import math
import pathlib
import statistics
import time
from typing import Any

from trainers.provenance import read_code
from trainers.study.config import StudyConfig, _config_dict, max_steps
from trainers.study.evals import step0_args

#: metrics averaged over every step of a run for the table (key in metrics.jsonl -> column)
STEP_MEANS = {
    "mismatch/abs_gap_mean": "abs_gap_mean",
    "mismatch/gap_q05": "gap_q05",
    "triage/gated_token_frac": "gated_token_frac",
    "triage/gate_grad_shift": "gate_grad_shift",
    "triage/repair_loss": "repair_loss",
    "response/length_mean": "response_length",
}


def read_metrics(run: pathlib.Path) -> list[dict]:
    from trainers.plots import read_rows

    try:
        return read_rows(run)
    except FileNotFoundError:
        return []


def is_complete(run: pathlib.Path, steps: int) -> bool:
    rows = read_metrics(run)
    return bool(rows) and max(int(r.get("step", 0)) for r in rows) >= steps


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f


def _finite(xs) -> list[float]:
    return [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]


def reward_at(rows: list[dict], step: int, window: int) -> float:
    """Mean ``reward/mean`` over the ``window`` steps ending at ``step`` (NaN if the run did not get there)."""
    vals = _finite(_num(r.get("reward/mean")) for r in rows if step - window < int(r.get("step", 0)) <= step)
    return sum(vals) / len(vals) if vals and max(int(r.get("step", 0)) for r in rows) >= step else float("nan")


def results_dir(run: pathlib.Path) -> pathlib.Path | None:
    """The eval to report: that of the highest evaluated step (the latest checkpoint's once it is evaluated; a
    restarted run has dropped the evals of its earlier execution)."""
    done = sorted(d for d in (run / "eval").glob("step_*") if (d / "results.json").is_file())
    return done[-1] if done else None


def _accuracy(path: pathlib.Path) -> float | None:
    """Mean over tasks of an ``eval run`` results.json (None if it has no task means)."""
    res = json.loads(path.read_text())
    means = [t["mean"] for t in res.get("tasks", {}).values() if "mean" in t]
    return sum(means) / len(means) if means else None


def eval_accuracy(run: pathlib.Path) -> float | None:
    where = results_dir(run)
    path = None if where is None else where / "results.json"
    if path is None or not path.is_file():
        return None
    return _accuracy(path)


def eval_accuracies(run: pathlib.Path, precision: str | None = None) -> dict[int, float]:
    """Held-out accuracy of every evaluated checkpoint of ``run``: {step: accuracy} (``precision``: the evals under
    the study's ``eval.precision``, ``<run>/eval@<precision>``)."""
    out = {}
    for d in sorted((run / ("eval" if precision is None else f"eval@{precision}")).glob("step_*")):
        acc = _accuracy(d / "results.json") if (d / "results.json").is_file() else None
        if acc is not None and d.name[5:].isdigit():
            out[int(d.name[5:])] = acc
    return out


def run_record(cfg: StudyConfig, arm: str, seed: int, steps: int) -> dict:
    run = cfg.run_dir(arm, seed)
    rows = read_metrics(run)
    last = max((int(r.get("step", 0)) for r in rows), default=0)
    rec: dict[str, Any] = {"recipe": arm, "seed": seed, "steps": last, "complete": last >= steps,
                           "run_dir": str(run)}
    rec["final_reward"] = reward_at(rows, last, cfg.window) if rows else float("nan")
    for k in steps_at(cfg, steps):
        rec[f"reward@{k}"] = reward_at(rows, k, cfg.window)
    rec["eval_accuracy"] = eval_accuracy(run)
    where = results_dir(run)
    rec["eval_checkpoint"] = where.name if where is not None and rec["eval_accuracy"] is not None else None
    rec["eval_by_step"] = eval_accuracies(run)
    common = cfg.eval.precision if cfg.eval is not None else None
    rec["eval_common_by_step"] = eval_accuracies(run, common) if common is not None else {}
    for key, name in STEP_MEANS.items():
        vals = _finite(_num(r.get(key)) for r in rows if key in r)
        rec[name] = sum(vals) / len(vals) if vals else None
    times = _finite(_num(r.get("perf/step_s")) for r in rows)
    rec["step_s"] = statistics.median(times) if times else None
    held = _finite(_num(r.get("perf/gpu_reserved_gb")) for r in rows)
    rec["gpu_reserved_gb"] = max(held) if held else None  # what gpu_gb_per_run must cover, less the CUDA context
    rec["code"] = [e["digest"] for e in read_code(run)]  # trainers.provenance: one per execution on other code
    return rec


def code_versions(runs: list[dict]) -> dict:
    """Which code the runs that ran came from: ``versions`` (digest -> runs whose every step ran it), ``mixed``
    (runs whose steps ran several versions), ``unrecorded`` (runs from before the trainer recorded it)."""
    out: dict[str, Any] = {"versions": {}, "mixed": [], "unrecorded": []}
    for r in runs:
        if r["steps"] <= 0:
            continue
        name = f"{r['recipe']}/seed{r['seed']}"
        if not r.get("code"):
            out["unrecorded"].append(name)
        elif len(set(r["code"])) > 1:
            out["mixed"].append(name)
        else:
            out["versions"].setdefault(r["code"][0], []).append(name)
    return out


def steps_at(cfg: StudyConfig, steps: int) -> tuple[int, ...]:
    if cfg.steps_at:
        return cfg.steps_at
    return tuple(sorted({max(1, steps * q // 4) for q in (1, 2, 3, 4)}))


def _agg(values: list) -> dict | None:
    vals = _finite(v for v in values if v is not None)
    if not vals:
        return None
    return {"mean": sum(vals) / len(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals),
            "min": min(vals), "max": max(vals)}


def summarize(cfg: StudyConfig, steps: dict[str, int]) -> dict:
    """Every run of the study's arms and of those it borrows (``steps``: each arm's planned steps; a borrowed arm
    missing there takes this study's setting for it)."""
    steps = {arm: steps[arm] if arm in steps else max_steps(cfg, arm) for arm in cfg.compared_arms}
    runs = [run_record(cfg, arm, seed, steps[arm]) for arm in cfg.compared_arms for seed in cfg.seeds]
    cols = ["final_reward", "eval_accuracy", "step_s", "gpu_reserved_gb", *STEP_MEANS.values()]
    arms = {}
    for arm in cfg.compared_arms:
        planned = [r for r in runs if r["recipe"] == arm]
        mine = [r for r in planned if r["steps"] > 0]  # seeds not run (yet) do not enter the statistics
        keys = ["steps"] + [f"reward@{k}" for k in steps_at(cfg, steps[arm])] + cols
        arms[arm] = {k: _agg([r.get(k) for r in mine]) for k in keys}
        arms[arm]["seeds"] = len(mine)
        arms[arm]["seeds_planned"] = len(planned)
        by_step = sorted({k for r in mine for k in r["eval_by_step"]})
        arms[arm]["eval_by_step"] = {k: _agg([r["eval_by_step"].get(k) for r in mine]) for k in by_step}
        by_step = sorted({k for r in mine for k in r["eval_common_by_step"]})
        arms[arm]["eval_common_by_step"] = {k: _agg([r["eval_common_by_step"].get(k) for r in mine])
                                            for k in by_step}
        arms[arm]["eval_step0"] = step0_accuracy(cfg, arm)
        arms[arm]["eval_common_step0"] = step0_accuracy(cfg, arm, common=True)
    out = {"study": cfg.name, "config": _config_dict(cfg), "runs": runs, "arms": arms,
           "code": code_versions(runs), "date": time.strftime("%Y-%m-%d")}
    if cfg.baseline is not None:
        out["vs_baseline"] = {"baseline": cfg.baseline, "arms": comparisons(cfg, runs)}
    contrasts = [(a, cfg.baseline) for a in cfg.compared_arms if cfg.baseline is not None and a != cfg.baseline]
    contrasts += [c for c in cfg.pairs if c not in contrasts]
    if contrasts:
        out["paired"] = paired_comparisons(runs, arms, contrasts)
    return out


def step0_accuracy(cfg: StudyConfig, arm: str, common: bool = False) -> float | None:
    """The untrained model's held-out accuracy under ``arm``'s eval (``common``: under ``eval.precision``)."""
    base = step0_args(cfg, arm, common)
    res = None if base is None else base[0] / "results.json"
    return _accuracy(res) if res is not None and res.is_file() else None


def paired_comparisons(runs: list[dict], arms: dict, contrasts: list[tuple[str, str]]) -> list[dict]:
    """Each ``(arm, against)`` contrast (every arm against the baseline, then the study's ``pairs``), paired by
    seed (``trainers.paired``): the area under the held-out curve and the last shared step's accuracy, under each
    run's own precision (``own``) and under the study's ``eval.precision`` (``common``), with the untrained model
    as step 0 where it was evaluated. One ``{"arm", "against", "own", "common"}`` per contrast."""
    from trainers.paired import paired_curves

    def curves(arm: str, key: str) -> dict[int, dict[int, float]]:
        return {r["seed"]: r[key] for r in runs if r["recipe"] == arm and r[key]}

    out = []
    for arm, base in contrasts:
        row: dict = {"arm": arm, "against": base}
        for name, key, s0 in (("own", "eval_by_step", "eval_step0"),
                              ("common", "eval_common_by_step", "eval_common_step0")):
            r = paired_curves(curves(arm, key), curves(base, key), step0=(arms[arm][s0], arms[base][s0]))
            if r is not None:
                row[name] = r
        out.append(row)
    return out


def comparisons(cfg: StudyConfig, runs: list[dict]) -> dict:
    """Every other arm against ``cfg.baseline`` at equal steps, over the seeds that reached them: held-out
    accuracy per evaluated step (``eval@<step>``) and reward at ``steps_at`` (``reward@<step>``), each
    ``trainers.compare.compare`` (difference of means, Welch standard error, exact permutation p-value)."""
    from trainers.compare import compare

    def values(arm: str) -> dict[str, list[float]]:
        got: dict[str, list[float]] = {}
        for r in runs:
            if r["recipe"] != arm:
                continue
            pairs = [(f"eval@{k}", v) for k, v in r["eval_by_step"].items()]
            pairs += [(k, v) for k, v in r.items() if k.startswith("reward@")]
            for k, v in pairs:
                if v is not None and math.isfinite(v):
                    got.setdefault(k, []).append(float(v))
        return got

    base = values(cfg.baseline)
    out = {}
    for arm in cfg.compared_arms:
        if arm == cfg.baseline:
            continue
        mine = values(arm)
        out[arm] = {k: compare(mine[k], base[k]) for k in sorted(mine, key=_metric_order) if k in base}
    return out


def _metric_order(key: str) -> tuple[str, int]:
    name, step = key.split("@")
    return name, int(step)

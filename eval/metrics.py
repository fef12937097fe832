"""avg@k with its spread, and the equal-weighted task average (report §6.2.2, Table 6-8).

For a task with k runs r_1..r_k (each scores one response per example), for every metric m:

    mean_m = (1/k) * sum_j m(r_j)          std_m = sqrt( sum_j (m(r_j) - mean_m)^2 / (k - 1) )   (0 if k = 1)

and the run average is the unweighted mean over tasks of each task's primary-metric mean ("the five tasks
receive equal weight, independent of evaluation counts"). Example: runs scoring 0.5, 0.7 give mean 0.6,
std 0.1414; tasks at 0.6 and 0.2 average to 0.4 whatever their sizes.
"""
from __future__ import annotations

import math

from eval.task import SampleScore, Task


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def summarize_task(task: Task, runs: list[list[SampleScore]]) -> dict:
    """Summary of k runs of one task: per-metric mean, std and the per-run values."""
    per_run = [task.aggregate(r) for r in runs]
    metrics = {}
    for name in task.metric_names:
        values = [m[name] for m in per_run]
        mean, std = mean_std(values)
        metrics[name] = {"mean": mean, "std": std, "per_sample": values}
    primary = metrics[task.primary_metric]
    return {
        "task": task.name,
        "title": task.title,
        "primary_metric": task.primary_metric,
        "mean": primary["mean"],
        "std": primary["std"],
        "k": len(runs),
        "n": len(runs[0]) if runs else 0,
        "metrics": metrics,
    }


def equal_weighted_average(summaries: dict[str, dict]) -> dict:
    means = [s["mean"] for s in summaries.values()]
    return {"mean": sum(means) / len(means) if means else 0.0, "tasks": list(summaries), "weighting": "equal"}

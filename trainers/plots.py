"""Figure-2-style training panels from run directories (report §3.2, Fig. 2; §6.2.2, Fig. 5).

Panels (left to right): reward, entropy, mean |gap| (``mismatch/abs_gap_mean``), negative tail depth
(``mismatch/neg_tail_depth`` = -q_0.05(delta), report Fig. 1). Thin lines are raw per-step values, thick lines a
centred moving mean of ``window`` steps (the report uses 21); each run is labelled with its recipe. Reads
``<run>/metrics.jsonl`` only, so it works on runs from either engine and on partial runs. The trainer writes
``<run>/curves.png`` at the end of every run; ``scripts/plot_run.py`` overlays several runs.

Example: ``plot([Path("runs/a"), Path("runs/b")], Path("fig2.png"))``.
"""
from __future__ import annotations

import json
import math
import pathlib

from minite_kernels.fileio import atomic_path

PANELS = [("reward/mean", "reward"), ("actor/entropy", "entropy"), ("mismatch/abs_gap_mean", "mean |gap|"),
          ("mismatch/neg_tail_depth", "negative tail depth  -q0.05(δ)")]


def read_rows(run: pathlib.Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (is {run} a run directory of python -m trainers.grpo?)")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def label_of(run: pathlib.Path) -> str:
    cfg = run / "config.yaml"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            if line.startswith("recipe:"):
                return f"{line.split(':', 1)[1].strip()} ({run.name})"
    return run.name


def smooth(values: list[float], window: int) -> list[float]:
    out = []
    h = window // 2
    for i in range(len(values)):
        seg = [v for v in values[max(0, i - h): i + h + 1] if math.isfinite(v)]
        out.append(sum(seg) / len(seg) if seg else float("nan"))
    return out


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _figure(n: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4), squeeze=False)
    return plt, fig, list(axes[0])


def _smoothed(rows: list[dict], key: str, window: int) -> dict[int, float]:
    """``{step: moving mean of key}`` over the rows that carry ``key``."""
    sel = [r for r in rows if key in r]
    return dict(zip((r["step"] for r in sel), smooth([_num(r[key]) for r in sel], window)))


def plot_groups(groups: dict[str, list[pathlib.Path]], out: pathlib.Path, window: int = 5,
                title: str | None = None, panels: int = len(PANELS)) -> pathlib.Path:
    """One line per group (e.g. a recipe over seeds): the mean over its runs of each run's moving mean, with a
    min-max band over the runs, up to the last step every run of the group reached; the first ``panels``
    panels of :data:`PANELS`."""
    plt, fig, axes = _figure(panels)
    for i, (label, runs) in enumerate(groups.items()):
        series = []
        for run in runs:
            rows = read_rows(run)
            series.append({key: _smoothed(rows, key, window) for key, _ in PANELS[:panels]})
        for ax, (key, name) in zip(axes, PANELS[:panels]):
            steps = sorted({st for s in series for st in s[key]})
            if not steps:
                continue
            # only the steps every run reached, so that each point averages the same runs
            per_step = [[s[key][st] for s in series if st in s[key] and math.isfinite(s[key][st])] for st in steps]
            pts = [(st, sum(v) / len(v), min(v), max(v)) for st, v in zip(steps, per_step) if len(v) == len(series)]
            if not pts:
                continue
            xs, mean, lo, hi = zip(*pts)
            ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
            ax.plot(xs, mean, color=f"C{i}", lw=2.0, label=f"{label} (n={len(runs)})")
            ax.set_title(name)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(plt, fig, out, title)


def plot(runs: list[pathlib.Path], out: pathlib.Path, window: int = 5, title: str | None = None) -> pathlib.Path:
    plt, fig, axes = _figure(len(PANELS))
    for i, run in enumerate(runs):
        rows = read_rows(run)
        color = f"C{i}"
        for ax, (key, name) in zip(axes, PANELS):
            pts = [(r["step"], _num(r.get(key))) for r in rows if key in r]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, color=color, alpha=0.35, lw=0.8)
            ax.plot(xs, smooth(list(ys), window), color=color, lw=2.0, label=label_of(run))
            ax.set_title(name)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(plt, fig, out, title)


def _save(plt, fig, out: pathlib.Path, title: str | None) -> pathlib.Path:
    """Write the figure atomically (temp file + rename), readable as the umask allows."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=120, format=(out.suffix.lstrip(".") or "png"))
    finally:
        plt.close(fig)
    return out

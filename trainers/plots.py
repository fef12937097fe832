"""Figure-2-style training panels from run directories (report §3.2, Fig. 2; §6.2.2, Fig. 5).

Panels (left to right): reward, entropy, mean |gap| (``mismatch/abs_gap_mean``), negative tail depth
(``mismatch/neg_tail_depth`` = -q_0.05(delta), report Fig. 1); :data:`HELDOUT` is the held-out accuracy panel
(``val/average``, logged at the eval steps). Thin lines are raw per-step values, thick lines a centred moving mean
of ``window`` steps (the report uses 21), and every figure says so in its caption. Each arm keeps its colour in
every study (``trainers.palette``: by the arm's role, not its position). Reads ``<run>/metrics.jsonl`` only, so it
works on runs from either engine and on partial runs. The trainer writes ``<run>/curves.png`` at the end of every
run; ``scripts/plot_run.py`` overlays several runs.

Example: ``plot([Path("runs/a"), Path("runs/b")], Path("fig2.png"))``.
"""
from __future__ import annotations

import json
import math
import pathlib

from minite_util.fileio import atomic_path
from trainers.palette import colours

PANELS = [("reward/mean", "training reward (batch mean)"), ("actor/entropy", "entropy (nats / token)"),
          ("mismatch/abs_gap_mean", "mean |gap| (nats)"), ("mismatch/neg_tail_depth", "negative tail depth  -q0.05(δ)")]
HELDOUT = [("val/average", "held-out accuracy")]


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
                title: str | None = None, panels: int | list[tuple[str, str]] = len(PANELS)) -> pathlib.Path:
    """One colour per group (an arm over seeds, coloured by its role): each run's raw values as thin lines, and
    the mean over the group's runs of each run's moving mean as a thick line, up to the last step every run of the
    group reached. ``panels``: the first N of :data:`PANELS`, or a list of ``(metrics key, axis label)``."""
    chosen = PANELS[:panels] if isinstance(panels, int) else list(panels)
    plt, fig, axes = _figure(len(chosen))
    palette = colours(groups)
    sparse = False
    for label, runs in groups.items():
        col = palette[label]
        series, raw = [], []
        for run in runs:
            rows = read_rows(run)
            series.append({key: _smoothed(rows, key, window) for key, _ in chosen})
            raw.append({key: [(r["step"], _num(r[key])) for r in rows if key in r] for key, _ in chosen})
        for ax, (key, name) in zip(axes, chosen):
            for r in raw:
                if r[key]:
                    xs, ys = zip(*r[key])
                    ax.plot(xs, ys, color=col, lw=0.6, alpha=0.35, marker="." if len(xs) < 12 else None)
            steps = sorted({st for s in series for st in s[key]})
            if not steps:
                continue
            sparse |= len(steps) < 2 * window
            # only the steps every run reached, so that each point averages the same runs
            per_step = [[s[key][st] for s in series if st in s[key] and math.isfinite(s[key][st])] for st in steps]
            pts = [(st, sum(v) / len(v)) for st, v in zip(steps, per_step) if len(v) == len(series)]
            if not pts:
                continue
            xs, mean = zip(*pts)
            ax.plot(xs, mean, color=col, lw=2.0, label=f"{label} (n={len(runs)})")
            ax.set_ylabel(name)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    caption = "Thin lines: each seed's raw value at every logged step. Thick lines: " + (
        f"the mean over seeds of each seed's centred {window}-step moving mean" if window > 1 else
        "the mean over seeds, unsmoothed") + " (n = seeds per arm)."
    if sparse and window > 1:
        caption += f" Where a metric is logged at fewer than {2 * window} steps, the window spans neighbouring evals."
    return _save(plt, fig, out, title, caption)


def plot(runs: list[pathlib.Path], out: pathlib.Path, window: int = 5, title: str | None = None) -> pathlib.Path:
    plt, fig, axes = _figure(len(PANELS))
    labels = [label_of(run) for run in runs]
    recipes = [lab.split(" (")[0] for lab in labels]
    # one colour per recipe (its role's, as in every study) when the runs are different recipes; else one per run
    palette = colours(recipes) if len(set(recipes)) == len(recipes) else None
    for i, run in enumerate(runs):
        rows = read_rows(run)
        color = palette[recipes[i]] if palette else f"C{i}"
        for ax, (key, name) in zip(axes, PANELS):
            pts = [(r["step"], _num(r.get(key))) for r in rows if key in r]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, color=color, alpha=0.35, lw=0.8)
            ax.plot(xs, smooth(list(ys), window), color=color, lw=2.0, label=labels[i])
            ax.set_ylabel(name)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(plt, fig, out, title, f"Thin lines: raw value at every step. Thick lines: centred {window}-step "
                                       "moving mean of the same values.")


def _save(plt, fig, out: pathlib.Path, title: str | None, caption: str | None = None) -> pathlib.Path:
    """Write the figure atomically (temp file + rename), readable as the umask allows."""
    if title:
        fig.suptitle(title)
    if caption:
        import textwrap

        lines = textwrap.wrap(caption, int(fig.get_figwidth() * 14))
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=7.5, ha="left", va="bottom")
        fig.tight_layout(rect=(0, min(0.4, 0.035 * len(lines) * 3.4 / fig.get_figheight() + 0.02), 1, 1))
    else:
        fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=120, format=(out.suffix.lstrip(".") or "png"))
    finally:
        plt.close(fig)
    return out

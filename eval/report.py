"""Writing run results (atomically) and rendering them as markdown: one run, or several side by side
like the report's Table 6-8 (tasks as columns, percentage-point differences in the last rows)."""
from __future__ import annotations

import json
import os
import pathlib

from minite_util.fileio import atomic_write_json, atomic_write_text  # noqa: F401 - re-exported for eval


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def run_markdown(results: dict) -> str:
    tasks = results["tasks"]
    lines = [f"# Evaluation: {results['model']}", ""]
    lines += ["| task | metric | k | n | avg@k (%) | std (pp) |", "| --- | --- | --- | --- | --- | --- |"]
    for s in tasks.values():
        lines.append(f"| {s['title']} | {s['primary_metric']} | {s['k']} | {s['n']} | {pct(s['mean'])} | "
                     f"{pct(s['std'])} |")
    lines.append(f"| **Average** (equal weight) | | | | **{pct(results['average']['mean'])}** | |")
    for s in tasks.values():
        if len(s["metrics"]) > 1:
            lines += ["", f"{s['title']} metrics: " + ", ".join(
                f"{m} {pct(v['mean'])} ± {pct(v['std'])}" for m, v in s["metrics"].items())]
    lines += ["", "## Protocol", ""]
    for key, value in results["protocol"].items():
        shown = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
        lines.append(f"- **{key}**: {shown}")
    return "\n".join(lines) + "\n"


def load_run(path: str | os.PathLike) -> dict:
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"no results at {path}: pass an `eval run` output directory or its results.json")
    try:
        with open(p, encoding="utf-8") as f:
            results = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{p} is not valid JSON ({type(e).__name__})") from None
    if not isinstance(results, dict) or not isinstance(results.get("tasks"), dict):
        raise ValueError(f"{p} is not an `eval run` results file (no 'tasks' mapping)")
    for name, t in results["tasks"].items():
        missing = [k for k in ("mean", "title") if not isinstance(t, dict) or k not in t]
        if missing or not isinstance(t["mean"], (int, float)):
            raise ValueError(f"{p}: task {name!r} lacks {missing or ['a numeric mean']}; is it an `eval run` "
                             "results file?")
    results.setdefault("name", p.parent.name)
    return results


def compare_table(runs: list[dict], names: list[str] | None = None) -> tuple[str, dict]:
    """Markdown table and a JSON-able dict. Average is recomputed over the tasks every run has."""
    names = names or [r.get("name", f"run{i}") for i, r in enumerate(runs)]
    order: list[str] = []
    for r in runs:
        order += [t for t in r["tasks"] if t not in order]
    common = [t for t in order if all(t in r["tasks"] for r in runs)]
    titles = {t: next(r["tasks"][t]["title"] for r in runs if t in r["tasks"]) for t in order}

    def avg(r: dict) -> float:
        return sum(r["tasks"][t]["mean"] for t in common) / len(common) if common else float("nan")

    rows = {n: {**{t: r["tasks"][t]["mean"] for t in order if t in r["tasks"]}, "average": avg(r)}
            for n, r in zip(names, runs)}
    base = names[0]
    deltas = {f"{n} - {base}": {k: 100 * (v - rows[base][k]) for k, v in rows[n].items() if k in rows[base]}
              for n in names[1:]}
    header = "| run | " + " | ".join(titles[t] for t in order) + " | Average |"
    lines = [header, "|" + " --- |" * (len(order) + 2)]
    for n in names:
        cells = [pct(rows[n][t]) if t in rows[n] else "–" for t in order]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {pct(rows[n]['average'])} |")
    for label, d in deltas.items():
        cells = [f"{d[t]:+.2f}" if t in d else "–" for t in order]
        lines.append(f"| Δ pp ({label}) | " + " | ".join(cells) + f" | {d['average']:+.2f} |")
    note = "" if len(common) == len(order) else \
        f"\nAverage over the tasks all runs have: {', '.join(titles[t] for t in common)}.\n"
    return "\n".join(lines) + "\n" + note, {"runs": rows, "differences_pp": deltas, "average_tasks": common}

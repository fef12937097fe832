"""Summarise the metrics of engine=verl and engine=local runs into one JSON (``scripts/verl_e2e.sh`` writes it).

    python scripts/verl_e2e_metrics.py verl=runs/verl_e2e/verl local=runs/verl_e2e/local > metrics.json

Each run directory holds ``metrics.jsonl`` (and, for a resumed verl run, ``metrics.1.jsonl``, ...): verl's file
logger writes ``{"step": N, "data": {...}}`` lines, the local engine flat ``{"step": N, ...}`` ones. Rows are read in
file order and a later row of the same step replaces an earlier one (a resumed run repeats no step, but an
interrupted one may). Per run: the per-step series of the compared quantities, their means, and the reward's
mean over the first and the last five steps. The two engines name the quantities differently; a metric is
found under any of its names, also behind a prefix (verl reports the loss's metrics under ``actor/``).

With runs named ``verl`` and ``local``, ``prompts`` says whether they trained on the same prompts at each step:
for every question the local run logged (``samples.jsonl``, a few per step), whether verl's ``data/train.parquet``
holds it among that step's rows (``prompts_per_step`` rows a step, read unshuffled; ``trainers/engines/
verl_data.py``). Example: local logged "What is 8 + 7?" at step 1 and verl's first 4 rows hold it: step 1 same.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys

#: compared quantity -> its names (verl's first, then the local engine's)
FIELDS = {
    "reward": ("critic/score/mean", "reward/mean"),
    "abs_gap_mean": ("mismatch/abs_gap_mean",),
    "gap_q05": ("mismatch/gap_q05",),
    "gated_token_frac": ("triage/gated_token_frac",),
    "tis_clip_frac": ("tis/clip_frac",),
    "response_length": ("response_length/mean", "response/length_mean"),
    "step_s": ("timing_s/step", "perf/step_s"),
    "rollout_s": ("timing_s/gen", "timing/rollout_s"),
    "update_weights_s": ("timing_s/update_weights", "timing/sync_s"),
}


def read_rows(run: pathlib.Path) -> dict[int, dict]:
    files = sorted(run.glob("metrics*.jsonl"), key=lambda p: (p.name != "metrics.jsonl", p.name))
    rows: dict[int, dict] = {}
    for f in files:
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            data = row.get("data", row)
            rows[int(row["step"])] = {k: v for k, v in data.items() if isinstance(v, (int, float))}
    return dict(sorted(rows.items()))


def pick(row: dict, names: tuple[str, ...]) -> float | None:
    for name in names:
        for key, value in row.items():
            if key == name or key.endswith("/" + name):
                return float(value)
    return None


def summarise(run: pathlib.Path) -> dict:
    rows = read_rows(run)
    series = {q: [pick(r, names) for r in rows.values()] for q, names in FIELDS.items()}
    out: dict = {"dir": str(run), "steps": list(rows), "files": sorted(p.name for p in run.glob("metrics*.jsonl")),
                 "series": series, "mean": {}}
    for q, values in series.items():
        v = [x for x in values if x is not None and math.isfinite(x)]
        out["mean"][q] = sum(v) / len(v) if v else None
    r = [x for x in series["reward"] if x is not None]
    out["reward_first5"] = sum(r[:5]) / len(r[:5]) if r else None
    out["reward_last5"] = sum(r[-5:]) / len(r[-5:]) if r else None
    return out


def _prompts_per_step(run: pathlib.Path) -> int | None:
    """``rollout.prompts_per_step`` of the run's resolved ``config.yaml`` (the trainer writes it)."""
    import yaml

    cfg = run / "config.yaml"
    return int(yaml.safe_load(cfg.read_text())["rollout"]["prompts_per_step"]) if cfg.is_file() else None


def same_prompts(verl: pathlib.Path, local: pathlib.Path, prompts_per_step: int) -> dict | None:
    """Per step the local run logged a sample of: whether verl's rows of that step hold the sample's question;
    None without verl's parquet or local samples."""
    parquet, samples = verl / "data" / "train.parquet", local / "samples.jsonl"
    if not parquet.is_file() or not samples.is_file():
        return None
    import pyarrow.parquet as pq

    questions = [row["extra_info"]["question"] for row in pq.read_table(parquet).to_pylist()]
    logged: dict[int, set[str]] = {}
    for line in samples.read_text().splitlines():
        if line.strip():
            s = json.loads(line)
            logged.setdefault(int(s["step"]), set()).add(s["question"])
    k = prompts_per_step
    same = {step: qs <= set(questions[(step - 1) * k: step * k]) for step, qs in sorted(logged.items())}
    return {"steps": len(same), "same": sum(same.values()), "differ_at": [s for s, ok in same.items() if not ok]}


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print("usage: python scripts/verl_e2e_metrics.py NAME=RUN_DIR [NAME=RUN_DIR ...]", file=sys.stderr)
        return 2
    runs = dict(a.split("=", 1) for a in argv)
    missing = [d for d in runs.values() if not any(pathlib.Path(d).glob("metrics*.jsonl"))]
    if missing:
        print(f"error: no metrics*.jsonl in {missing[0]}", file=sys.stderr)
        return 1
    out = {name: summarise(pathlib.Path(d)) for name, d in runs.items()}
    if "verl" in runs and "local" in runs:
        verl, local = pathlib.Path(runs["verl"]), pathlib.Path(runs["local"])
        k = _prompts_per_step(local)
        out["prompts"] = None if k is None else same_prompts(verl, local, k)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

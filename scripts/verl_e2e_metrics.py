"""Summarise the metrics of engine=verl and engine=local runs into one JSON (``scripts/verl_e2e.sh`` writes it).

    python scripts/verl_e2e_metrics.py verl=runs/verl_e2e/verl local=runs/verl_e2e/local > metrics.json

Each run directory holds ``metrics.jsonl`` (and, for a resumed verl run, ``metrics.1.jsonl``, ...): verl's file
logger writes ``{"step": N, "data": {...}}`` lines, the local engine flat ``{"step": N, ...}`` ones. Rows are read in
file order and a later row of the same step replaces an earlier one (a resumed run repeats no step, but an
interrupted one may). Per run: the per-step series of the compared quantities, their means, and the reward's
mean over the first and the last five steps. The two engines name the quantities differently; a metric is
found under any of its names, also behind a prefix (verl reports the loss's metrics under ``actor/``).
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


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print("usage: python scripts/verl_e2e_metrics.py NAME=RUN_DIR [NAME=RUN_DIR ...]", file=sys.stderr)
        return 2
    runs = dict(a.split("=", 1) for a in argv)
    missing = [d for d in runs.values() if not any(pathlib.Path(d).glob("metrics*.jsonl"))]
    if missing:
        print(f"error: no metrics*.jsonl in {missing[0]}", file=sys.stderr)
        return 1
    print(json.dumps({name: summarise(pathlib.Path(d)) for name, d in runs.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

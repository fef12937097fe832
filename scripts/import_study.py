"""Record a study that ran elsewhere (a lent GPU): unpack its ``study.tgz`` into
``benchmarks/learning/study_NAME`` and rebuild the table, summary and figures there.

Kept per run: ``config.yaml``, ``metrics.jsonl``, ``code.json`` (which code ran it, ``trainers/provenance.py``)
and each eval's ``results.json``/``results.md`` (``eval/`` and, with
``eval.precision``, ``eval@<precision>/``); kept per
study: the step-0 evals and ``study.json`` (the grid's configuration as it ran). Not kept: checkpoints, logs,
run metadata (host paths, timestamps). A run in the archive replaces the recorded one of the same arm and seed
only if it reached at least as many steps, so a shorter rerun never overwrites a longer record. Paths in the
summary are relative to the repository when the destination is inside it.

    python scripts/import_study.py OUT/arithmetic/study.tgz arithmetic
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainers.study import load_study, max_steps, read_metrics, summarize, write_outputs

RUN_FILES = ("config.yaml", "metrics.jsonl", "code.json")
EVAL_FILES = ("results.json", "results.md")


def _steps(run: pathlib.Path) -> int:
    rows = read_metrics(run)
    return int(max((r.get("step", 0) for r in rows), default=0))


def _copy_results(evals: pathlib.Path, dst: pathlib.Path) -> None:
    """Each ``evals/<name>/`` that holds a ``results.json``: its result files into ``dst/<name>/``."""
    for res in sorted(evals.glob("*/results.json")):
        out = dst / res.parent.name
        out.mkdir(parents=True, exist_ok=True)
        for f in EVAL_FILES:
            if (res.parent / f).is_file():
                shutil.copy2(res.parent / f, out / f)


def import_runs(src: pathlib.Path, dst: pathlib.Path, arms: list[str], seeds: list[int]) -> list[str]:
    """Copy the kept files of every run in ``src`` that is at least as long as its record in ``dst``; returns
    one line per run saying what happened."""
    dst.mkdir(parents=True, exist_ok=True)
    said = []
    for arm in arms:
        for seed in seeds:
            new, old = src / arm / f"seed{seed}", dst / arm / f"seed{seed}"
            if not (new / "metrics.jsonl").is_file():
                continue
            n_new, n_old = _steps(new), _steps(old) if old.is_dir() else -1
            if n_new < n_old:
                said.append(f"{arm}/seed{seed}: kept the record ({n_old} steps; the archive has {n_new})")
                continue
            if old.is_dir():
                shutil.rmtree(old)
            old.mkdir(parents=True)
            for f in RUN_FILES:
                if (new / f).is_file():
                    shutil.copy2(new / f, old / f)
            for evals in sorted(new.glob("eval*")):  # eval/ (own precision) and eval@<precision>/ (eval.precision)
                _copy_results(evals, old / evals.name)
            was = f" (the record had {n_old})" if n_old >= 0 else " (new)"
            said.append(f"{arm}/seed{seed}: {n_new} steps{was}")
    if (src / "study.json").is_file():
        shutil.copy2(src / "study.json", dst / "study.json")
    _copy_results(src / "step0", dst / "step0")
    return said


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", type=pathlib.Path, help="study.tgz from scripts/h200_study.sh")
    ap.add_argument("name", help="the study: recipes/studies/NAME.yaml")
    ap.add_argument("--dest", type=pathlib.Path, default=None,
                    help="where to record it (default: benchmarks/learning/study_NAME)")
    a = ap.parse_args(argv)
    spec = ROOT / "recipes" / "studies" / f"{a.name}.yaml"
    if not spec.is_file():
        names = sorted(p.stem for p in (ROOT / "recipes" / "studies").glob("*.yaml"))
        ap.error(f"no study {a.name!r}; choose one of {', '.join(names)}")
    dest = (a.dest or ROOT / "benchmarks" / "learning" / f"study_{a.name}").resolve()
    if dest.is_relative_to(ROOT):  # the recorded summary names repository paths, not this machine's
        dest = dest.relative_to(ROOT)
        os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(a.archive) as tar:
            tar.extractall(tmp, filter="data")
        src = pathlib.Path(tmp) / f"study_{a.name}"
        if not src.is_dir():
            ap.error(f"{a.archive} holds no study_{a.name}/ folder")
        cfg = load_study(spec, [f"output_dir={dest}"])
        for line in import_runs(src, dest, list(cfg.arms), list(cfg.seeds)):
            print(line)
    cfg = load_study(spec, [f"output_dir={dest}"])
    write_outputs(cfg, summarize(cfg, {arm: max_steps(cfg, arm) for arm in cfg.arms}))
    print(f"wrote {dest}/table.md, summary.json, reward.png, panels.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

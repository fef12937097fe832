"""Running a study: the training and eval processes, ``parallel`` at a time, stopped at the time limit
(:func:`_run_all`), and the whole grid, resumed where it stopped, then summarised (:func:`run_study`)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from minite_util.fileio import atomic_write_text
from trainers.study.config import StudyConfig, _config_dict, max_steps, study_threads, train_args
from trainers.study.evals import _eval_due, eval_args, eval_dir, step0_args
from trainers.study.results import is_complete, summarize
from trainers.study.tables import write_outputs

#: seconds a run stopped at the time limit gets to finish its step and save it before it is killed
STOP_GRACE_S = 90.0


def gpu_total_gb() -> float | None:
    """The first GPU's memory in GB, from ``nvidia-smi`` (no CUDA context in the study's own process); None
    without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out[0]) * 2**20 / 1e9 if out else None  # MiB


def run_parallel(cfg: StudyConfig, total_gb: float | None = None) -> int:
    """How many runs go at once: ``cfg.parallel``, capped at ``total_gb // cfg.gpu_gb_per_run`` (at least 1) when
    the runs train on CUDA and the GPU's size is known (``total_gb``, default :func:`gpu_total_gb`).
    Example: parallel 16 and 19 GB per run give 4 runs on an H100 (81,559 MiB = 85.5 GB) and 7 on an H200
    (143,771 MiB = 150.8 GB)."""
    if cfg.gpu_gb_per_run <= 0 or not str(cfg.train.get("model.device", "")).startswith("cuda"):
        return cfg.parallel
    total = gpu_total_gb() if total_gb is None else total_gb
    if total is None:
        return cfg.parallel
    return max(1, min(cfg.parallel, int(total // cfg.gpu_gb_per_run)))


def _child_env(parallel: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(study_threads(parallel)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _launch(cmd: list[str], log: pathlib.Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


def _run_all(jobs: list[tuple[str, list[str], pathlib.Path]], parallel: int, say,
             stop_at: float | None = None) -> dict[str, int | None]:
    """Run ``(name, cmd, log)`` jobs, ``parallel`` at a time; returns each name's exit status. At ``stop_at``
    (a ``time.monotonic()`` value) running jobs are terminated and pending ones skipped: status None."""
    env = _child_env(parallel)
    pending, running, status = list(jobs), {}, {}
    try:
        return _schedule(pending, running, status, parallel, env, say, stop_at)
    finally:  # interrupted (Ctrl-C, a kill of the study): no run keeps going unwatched, holding its directory
        for proc, _, _ in running.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait()


def _schedule(pending, running, status, parallel, env, say, stop_at):
    while pending or running:
        if stop_at is not None and time.monotonic() >= stop_at:
            # SIGTERM: each run finishes its step and saves it (trainers.stopping); after STOP_GRACE_S, SIGKILL
            for proc, _, _ in running.values():
                proc.terminate()
            deadline = time.monotonic() + STOP_GRACE_S
            for name, (proc, _, _) in running.items():
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                    how = "after saving its step"
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    how = f"killed after {STOP_GRACE_S:.0f} s"
                status[name] = None
                say(f"stopped {name} at the time limit, {how} (it resumes from its last checkpoint)")
            for name, _, _ in pending:
                status[name] = None
            return status
        while pending and len(running) < parallel:
            name, cmd, log = pending.pop(0)
            say(f"start {name} (log {log})")
            running[name] = (_launch(cmd, log, env), time.monotonic(), log)
        time.sleep(0.2)
        for name, (proc, t0, log) in list(running.items()):
            rc = proc.poll()
            if rc is not None:
                status[name] = rc
                del running[name]
                why = "" if rc == 0 else f": {_last_line(log)}"
                say(f"{'done' if rc == 0 else f'FAILED (exit {rc})'} {name} in {time.monotonic() - t0:.0f} s{why}")
    return status


def _last_line(log: pathlib.Path) -> str:
    """The last non-empty line of a run's log (a failed run's one-line error), at most 300 characters."""
    try:
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"see {log}"
    return lines[-1][:300] if lines else f"see {log}"


def run_study(cfg: StudyConfig, *, say=print, train_seconds: float | None = None) -> dict:
    """Train every missing run, evaluate every missing checkpoint, then write the summary and figures.

    ``train_seconds``: stop training after that long (runs resume later from their last checkpoint) and
    evaluate what was reached; unfinished runs show ``complete: false`` and their ``steps``."""
    cfg.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cfg.root / "study.json", json.dumps(_config_dict(cfg), indent=1) + "\n")
    steps = {arm: max_steps(cfg, arm) for arm in cfg.arms}
    cells = [(arm, seed) for seed in cfg.seeds for arm in cfg.arms]  # seed-major: early results cover every arm
    jobs = []
    for arm, seed in cells:
        run = cfg.run_dir(arm, seed)
        if is_complete(run, steps[arm]):
            say(f"skip {arm}/seed{seed}: {steps[arm]} steps already logged")
            continue
        jobs.append((f"{arm}/seed{seed}", [sys.executable, "-m", "trainers.grpo", *train_args(cfg, arm, seed)],
                     cfg.root / "logs" / f"{arm}-seed{seed}.train.log"))
    stop_at = None if train_seconds is None else time.monotonic() + train_seconds
    # fewer runs at once on a smaller GPU; each run's trainer.cpu_threads stays cfg.parallel's share (train_args), so
    # its CPU-side numbers do not depend on the GPU it ran on
    parallel = run_parallel(cfg)
    if parallel < cfg.parallel:
        say(f"{parallel} runs at once, not {cfg.parallel}: {cfg.gpu_gb_per_run:g} GB each on this GPU")
    # a run that restarts from step 0 drops the evals of its earlier execution itself (trainers.heldout)
    train_status = _run_all(jobs, parallel, say, stop_at)
    ev_jobs = []
    for arm, seed in cells:
        run = cfg.run_dir(arm, seed)
        where = eval_dir(run)
        if train_status.get(f"{arm}/seed{seed}", 0) not in (0, None) or where is None or \
                (where / "results.json").is_file() or not _eval_due(cfg, steps[arm], where):
            continue
        args = eval_args(cfg, run)
        if args is not None:
            ev_jobs.append((f"eval {arm}/seed{seed}", [sys.executable, "-m", "eval", "run", *args],
                            cfg.root / "logs" / f"{arm}-seed{seed}.eval.log"))
    for arm in cfg.compared_arms:  # a borrowed arm's step 0 too: its runs are read against it
        for common in (False, True):  # under the arm's own precision, and under eval.precision
            base = step0_args(cfg, arm, common)
            name = None if base is None else f"eval step0 {base[0].name}"
            if base is None or (base[0] / "results.json").is_file() or any(j[0] == name for j in ev_jobs):
                continue
            ev_jobs.append((name, [sys.executable, "-m", "eval", "run", *base[1]],
                            cfg.root / "logs" / f"step0-{base[0].name}.eval.log"))
    eval_status = _run_all(ev_jobs, parallel, say)
    summary = summarize(cfg, steps)
    summary["failed"] = sorted(n for n, rc in {**train_status, **eval_status}.items() if rc not in (0, None))
    # a run the time limit reached after its last step (saving it, or in its last eval) is complete, not stopped
    complete = {f"{r['recipe']}/seed{r['seed']}" for r in summary["runs"] if r["complete"]}
    summary["stopped"] = sorted(n for n, rc in train_status.items() if rc is None and n not in complete)
    write_outputs(cfg, summary)
    return summary

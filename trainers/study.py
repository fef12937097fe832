"""``python -m trainers.study STUDY.yaml [--train-seconds N] [key=value ...]``: a grid of GRPO runs, then its
summary and figures.

A study is training recipes (arms) x seeds on one task. Each cell is an ordinary ``trainers.grpo`` run directory
``<output_dir>/<arm>/seed<k>``, then an ``eval run`` of its last checkpoint under the arm's own sampler precision
(the policy as it was trained and sampled) in ``<run>/eval/<checkpoint>``, unless the run evaluated that step itself
(``eval.every``: every run evaluates at the same steps, inside its process), and of the untrained model once per
distinct eval setting in ``<output_dir>/step0/`` (the baseline; ``eval.step0: false`` skips it). ``--train-seconds N`` stops training
after N seconds: each run gets SIGTERM, finishes and saves the step in progress (killed if it takes longer than
``STOP_GRACE_S``), resumes from there next time, and what was reached is evaluated. At the end the study writes

    summary.json   {"runs": [{recipe, seed, steps, final_reward, eval_accuracy, abs_gap_mean, ...}], "arms": {...}}
    table.md       per arm, mean +- sample std over seeds: reward at equal steps, held-out accuracy (of the last
                   checkpoints, and by checkpoint step), mean |delta|,
                   q05(delta), gated-token fraction, the gate's gradient shift, repair loss, step time
    reward.png     reward per arm: each seed raw (thin), the seed mean of each run's moving mean (thick), arm colours
                   fixed by role (``trainers.palette``)
    panels.png     the report's Figure-2 panels (reward, entropy, mean |gap|, negative tail) the same way
    heldout.png    held-out accuracy (``val/average``) per arm at the eval steps, when the runs evaluate themselves

Resuming: a run whose ``metrics.jsonl`` reaches ``trainer.max_steps`` is not started again, an interrupted one
continues from its checkpoint (``trainer.resume=auto``), and an eval with a ``results.json`` is reused, so the
same command finishes an interrupted grid.

Study file (``recipes/study_arithmetic.yaml``)::

    name: arithmetic
    output_dir: runs/study_arithmetic
    arms: [bf16, nvfp4, tis_nvfp4, triage_nvfp4]
    seeds: [0, 1, 2]
    parallel: 1                 # runs at once (processes); each gets cpu_count // parallel threads
    train: {trainer.max_steps: 200, rollout.max_new_tokens: 256}   # key=value for every run
    eval: {tasks: arithmetic, temperature: 0.0, max_new_tokens: 64}
    steps_at: [50, 100, 200]    # "reward at equal steps" columns (default: quarters of max_steps)
    window: 10                  # steps in each moving mean
    baseline: nvfp4             # optional: every other arm against it at equal steps (difference, Welch se,
                                # permutation p; trainers/compare.py), in summary.json and table.md
    defaults: [other_study]     # optional: start from other_study.yaml beside this file (keys here win)
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from minite_util.fileio import atomic_write_text

#: metrics averaged over every step of a run for the table (key in metrics.jsonl -> column)
STEP_MEANS = {
    "mismatch/abs_gap_mean": "abs_gap_mean",
    "mismatch/gap_q05": "gap_q05",
    "triage/gated_token_frac": "gated_token_frac",
    "triage/gate_grad_shift": "gate_grad_shift",
    "triage/repair_loss": "repair_loss",
    "response/length_mean": "response_length",
}


#: seconds a run stopped at the time limit gets to finish its step and save it before it is killed
STOP_GRACE_S = 90.0


class StudyError(ValueError):
    """A bad study file or override; the message names the key and the valid values."""


@dataclass(frozen=True)
class EvalSpec:
    tasks: str = "arithmetic"
    temperature: float = 0.0
    max_new_tokens: int = 64
    samples: int = 1
    limit: int | None = None
    seed: int = 0
    batch_size: int = 32  # sequences per generation batch
    # > 0: every run also evaluates itself every N steps and after its last (the trainer's eval.every, in
    # <run>/eval/step_<N>): every run at the same steps, by its own sampler, without loading a checkpoint
    every: int = 0
    # also evaluate the untrained model, once per distinct eval setting (sampler precision, dtype, ...): the
    # baseline every arm's checkpoints are read against, in <output_dir>/step0/
    step0: bool = True


@dataclass(frozen=True)
class StudyConfig:
    name: str
    output_dir: str
    arms: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    parallel: int = 1
    train: dict[str, Any] = field(default_factory=dict)
    eval: EvalSpec | None = field(default_factory=EvalSpec)
    steps_at: tuple[int, ...] = ()
    window: int = 10
    # the arm every other is compared against at equal steps (trainers/compare.py); None: no comparison
    baseline: str | None = None

    @property
    def root(self) -> pathlib.Path:
        return pathlib.Path(self.output_dir)

    def run_dir(self, arm: str, seed: int) -> pathlib.Path:
        return self.root / arm / f"seed{seed}"


def load_study(path: str | os.PathLike, overrides: list[str] = ()) -> StudyConfig:
    """Read the study YAML, apply ``key=value`` overrides (OmegaConf dotlist), validate everything up front."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = pathlib.Path(path)
    if not p.is_file():
        raise StudyError(f"study file {str(p)!r} does not exist")
    try:
        tree = OmegaConf.to_container(OmegaConf.merge(_with_defaults(p), OmegaConf.from_dotlist(list(overrides))))
    except (OmegaConfBaseException, ValueError) as e:
        raise StudyError(f"{p}: cannot parse the study or its overrides ({e})") from None
    if not isinstance(tree, dict):
        raise StudyError(f"{p}: expected a mapping at the top level")
    known = {f.name for f in dataclasses.fields(StudyConfig)}
    unknown = sorted(set(tree) - known)
    if unknown:
        raise StudyError(f"{p}: unknown key(s) {unknown}; valid: {sorted(known)}")
    for key in ("name", "output_dir", "arms"):
        if key not in tree:
            raise StudyError(f"{p}: {key!r} is required")
    return _build(tree, p)


def _with_defaults(p: pathlib.Path, seen: tuple[pathlib.Path, ...] = ()):
    """The study file merged over the studies its ``defaults: [name, ...]`` names (files ``<name>.yaml`` beside
    it, themselves resolved the same way; later ones and the file itself win; lists are replaced, not joined)."""
    from omegaconf import OmegaConf

    if p.resolve() in seen:
        raise StudyError(f"{p}: defaults form a cycle ({' -> '.join(str(s) for s in (*seen, p))})")
    own = OmegaConf.load(p)
    names = own.pop("defaults", None) or []
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise StudyError(f"{p}: defaults must be a list of study names (files beside it), got {names!r}")
    parts = []
    for name in names:
        base = p.parent / f"{name}.yaml"
        if not base.is_file():
            have = sorted(f.stem for f in p.parent.glob("*.yaml") if f != p)
            raise StudyError(f"{p}: defaults: no study {name!r} beside it; valid: {', '.join(have)}")
        parts.append(_with_defaults(base, (*seen, p.resolve())))
    return OmegaConf.merge(*parts, own)


def _build(tree: dict, p: pathlib.Path) -> StudyConfig:
    from trainers.config import flatten, list_recipes

    recipes = list_recipes()
    arms = tree["arms"]
    if isinstance(arms, str) or not isinstance(arms, list) or not arms:
        raise StudyError(f"{p}: arms must be a non-empty list of training recipes; valid: {', '.join(recipes)}")
    bad = [a for a in arms if a not in recipes]
    if bad:
        raise StudyError(f"{p}: arms {bad} are not training recipes; valid: {', '.join(recipes)}")
    if len(set(arms)) != len(arms):
        raise StudyError(f"{p}: an arm is listed twice in {arms}")
    seeds = tree.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                            for s in seeds) or len(set(seeds)) != len(seeds):
        raise StudyError(f"{p}: seeds must be a non-empty list of distinct integers, got {seeds!r}")
    parallel = tree.get("parallel", 1)
    if not isinstance(parallel, int) or parallel < 1:
        raise StudyError(f"{p}: parallel must be an integer >= 1, got {parallel!r}")
    train = flatten(tree.get("train") or {})
    reserved = sorted(k for k in train if k in ("recipe", "trainer.seed", "trainer.output_dir"))
    if reserved:
        raise StudyError(f"{p}: train.{reserved[0]} is set by the study for each run (arms, seeds, output_dir)")
    in_eval = sorted(k for k in train if k.startswith("eval."))
    if in_eval:
        raise StudyError(f"{p}: train.{in_eval[0]}: a study's held-out eval is its `eval` section (eval.every "
                         "evaluates inside the runs), so that every run and the untrained model use the same one")
    ev = tree.get("eval", {})
    if ev is None:
        eval_spec = None
    else:
        try:
            eval_spec = EvalSpec(**ev)
        except TypeError as e:
            raise StudyError(f"{p}: eval: {e}; valid keys: "
                             f"{[f.name for f in dataclasses.fields(EvalSpec)]}") from None
    steps_at = tree.get("steps_at") or []
    window = tree.get("window", 10)
    if not isinstance(window, int) or window < 1:
        raise StudyError(f"{p}: window must be an integer >= 1, got {window!r}")
    baseline = tree.get("baseline")
    if baseline is not None and baseline not in arms:
        from minite_util.choices import did_you_mean

        raise StudyError(f"{p}: baseline {baseline!r} is not one of the arms; valid: {', '.join(arms)}"
                         f"{did_you_mean(str(baseline), arms)}")
    cfg = StudyConfig(name=str(tree["name"]), output_dir=str(tree["output_dir"]), arms=tuple(arms),
                      seeds=tuple(seeds), parallel=parallel, train=train, eval=eval_spec,
                      steps_at=tuple(int(s) for s in steps_at), window=window, baseline=baseline)
    _check_train_overrides(cfg, p)
    return cfg


def _check_train_overrides(cfg: StudyConfig, p: pathlib.Path) -> None:
    """Build every run's trainer config now, so a bad key fails before the first run starts."""
    from trainers.config import ConfigError, load_config

    for arm in cfg.arms:
        try:
            load_config(train_args(cfg, arm, cfg.seeds[0]))
        except ConfigError as e:
            raise StudyError(f"{p}: arm {arm}: {e}") from None


def _value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else str(v)


def study_threads(parallel: int) -> int:
    """CPU threads per run: the cores shared evenly between the ``parallel`` runs that go at once."""
    return max(1, (os.cpu_count() or 1) // parallel)


def train_args(cfg: StudyConfig, arm: str, seed: int) -> list[str]:
    args = [f"recipe={arm}", f"trainer.seed={seed}", f"trainer.output_dir={cfg.run_dir(arm, seed)}"]
    if "trainer.cpu_threads" not in cfg.train:
        # fixed by the study, not left to the trainer's load check: a run started right after another sees that
        # run's load average and would drop to 1 thread, and CPU results depend on the thread count
        args.append(f"trainer.cpu_threads={study_threads(cfg.parallel)}")
    args += [f"{k}={_value(v)}" for k, v in cfg.train.items()]
    e = cfg.eval
    if e is not None and e.every:  # the same held-out eval as the checkpoints' `eval run`, inside the run
        args += [f"eval.every={e.every}", f"eval.tasks={_value(e.tasks.split(','))}", f"eval.samples={e.samples}",
                 f"eval.temperature={e.temperature}", f"eval.max_new_tokens={e.max_new_tokens}",
                 f"eval.seed={e.seed}", f"eval.batch_size={e.batch_size}", f"eval.limit={_value(e.limit)}"]
    return args


def max_steps(cfg: StudyConfig, arm: str) -> int:
    from trainers.config import load_config

    return load_config(train_args(cfg, arm, cfg.seeds[0])).trainer.max_steps


# --- running ----------------------------------------------------------------------------------------
def read_metrics(run: pathlib.Path) -> list[dict]:
    from trainers.plots import read_rows

    try:
        return read_rows(run)
    except FileNotFoundError:
        return []


def is_complete(run: pathlib.Path, steps: int) -> bool:
    rows = read_metrics(run)
    return bool(rows) and max(int(r.get("step", 0)) for r in rows) >= steps


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


def eval_dir(run: pathlib.Path) -> pathlib.Path | None:
    """``<run>/eval/<checkpoint>``: the eval of the run's latest checkpoint (None without one)."""
    from trainers.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run / "checkpoints")
    return None if ckpt is None else run / "eval" / ckpt.name


def _eval_settings(cfg: StudyConfig, arm: str) -> list[str]:
    """The ``eval run`` options of ``arm``'s evals: the study's eval spec, under the arm's own sampler precision."""
    from trainers.config import load_config

    tcfg = load_config(train_args(cfg, arm, cfg.seeds[0]))
    e = cfg.eval
    args = ["--tasks", e.tasks, "--samples", ",".join(f"{t}={e.samples}" for t in e.tasks.split(",")),
            "--temperature", str(e.temperature), "--max-new-tokens", str(e.max_new_tokens), "--seed", str(e.seed),
            "--batch-size", str(e.batch_size), "--quiet", "--dtype", tcfg.model.dtype]
    if tcfg.model.device != "auto":
        args += ["--device", tcfg.model.device]
    if tcfg.precision.sampler != "bf16":
        args += ["--precision", tcfg.precision.sampler]
        keep = [str(x) for x in tcfg.precision.exclude if x != "lm_head"]
        if keep:
            args += ["--exclude", ",".join(keep)]
    if tcfg.precision.alignment != "default":
        args += ["--alignment", tcfg.precision.alignment]
    if e.limit:
        args += ["--limit", str(e.limit)]
    return args


def eval_args(cfg: StudyConfig, run: pathlib.Path) -> list[str] | None:
    """``python -m eval run`` on the run's last checkpoint, under the run's own sampler precision."""
    from trainers.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run / "checkpoints")
    if ckpt is None or cfg.eval is None:
        return None
    return [str(ckpt), *_eval_settings(cfg, run.parent.name), "--output-dir", str(eval_dir(run))]


def step0_args(cfg: StudyConfig, arm: str) -> tuple[pathlib.Path, list[str]] | None:
    """(output dir, ``eval run`` args) of the untrained model under ``arm``'s eval settings; arms with the same
    settings (model, precision, dtype, ...) share one directory, ``<output_dir>/step0/<sampler>-<hash>``."""
    import hashlib

    from trainers.config import load_config

    if cfg.eval is None or not cfg.eval.step0:
        return None
    tcfg = load_config(train_args(cfg, arm, cfg.seeds[0]))
    args = [tcfg.model.path, *_eval_settings(cfg, arm)]
    tag = hashlib.sha1("\0".join(args).encode()).hexdigest()[:8]
    out = cfg.root / "step0" / f"{tcfg.precision.sampler}-{tag}"
    return out, [*args, "--output-dir", str(out)]


def _eval_due(cfg: StudyConfig, steps: int, where: pathlib.Path) -> bool:
    """Whether the study evaluates the checkpoint ``where`` names: every latest checkpoint, or with ``eval.every``
    (the runs evaluate themselves) only those of the steps the runs evaluate, whose eval an interruption
    prevented; the others wait for the run to get there."""
    every = cfg.eval.every if cfg.eval is not None else 0
    step = int(where.name[5:])
    return not every or step % every == 0 or step == steps


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
    # a run that restarts from step 0 drops the evals of its earlier execution itself (trainers.heldout)
    train_status = _run_all(jobs, cfg.parallel, say, stop_at)
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
    for arm in cfg.arms:
        base = step0_args(cfg, arm)
        name = None if base is None else f"eval step0 {base[0].name}"
        if base is None or (base[0] / "results.json").is_file() or any(j[0] == name for j in ev_jobs):
            continue
        ev_jobs.append((name, [sys.executable, "-m", "eval", "run", *base[1]],
                        cfg.root / "logs" / f"step0-{base[0].name}.eval.log"))
    eval_status = _run_all(ev_jobs, cfg.parallel, say)
    summary = summarize(cfg, steps)
    summary["failed"] = sorted(n for n, rc in {**train_status, **eval_status}.items() if rc not in (0, None))
    # a run the time limit reached after its last step (saving it, or in its last eval) is complete, not stopped
    complete = {f"{r['recipe']}/seed{r['seed']}" for r in summary["runs"] if r["complete"]}
    summary["stopped"] = sorted(n for n, rc in train_status.items() if rc is None and n not in complete)
    write_outputs(cfg, summary)
    return summary


def _config_dict(cfg: StudyConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["arms"], d["seeds"], d["steps_at"] = list(cfg.arms), list(cfg.seeds), list(cfg.steps_at)
    return d


# --- summarising ------------------------------------------------------------------------------------
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


def eval_accuracies(run: pathlib.Path) -> dict[int, float]:
    """Held-out accuracy of every evaluated checkpoint of ``run``: {step: accuracy}."""
    out = {}
    for d in sorted((run / "eval").glob("step_*")):
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
    for key, name in STEP_MEANS.items():
        vals = _finite(_num(r.get(key)) for r in rows if key in r)
        rec[name] = sum(vals) / len(vals) if vals else None
    times = _finite(_num(r.get("perf/step_s")) for r in rows)
    rec["step_s"] = statistics.median(times) if times else None
    return rec


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
    runs = [run_record(cfg, arm, seed, steps[arm]) for arm in cfg.arms for seed in cfg.seeds]
    cols = ["final_reward", "eval_accuracy", "step_s", *STEP_MEANS.values()]
    arms = {}
    for arm in cfg.arms:
        mine = [r for r in runs if r["recipe"] == arm]
        keys = ["steps"] + [f"reward@{k}" for k in steps_at(cfg, steps[arm])] + cols
        arms[arm] = {k: _agg([r.get(k) for r in mine]) for k in keys}
        arms[arm]["seeds"] = len(mine)
        by_step = sorted({k for r in mine for k in r["eval_by_step"]})
        arms[arm]["eval_by_step"] = {k: _agg([r["eval_by_step"].get(k) for r in mine]) for k in by_step}
        base = step0_args(cfg, arm)
        res = None if base is None else base[0] / "results.json"
        arms[arm]["eval_step0"] = _accuracy(res) if res is not None and res.is_file() else None
    out = {"study": cfg.name, "config": _config_dict(cfg), "runs": runs, "arms": arms,
           "date": time.strftime("%Y-%m-%d")}
    if cfg.baseline is not None:
        out["vs_baseline"] = {"baseline": cfg.baseline, "arms": comparisons(cfg, runs)}
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
    for arm in cfg.arms:
        if arm == cfg.baseline:
            continue
        mine = values(arm)
        out[arm] = {k: compare(mine[k], base[k]) for k in sorted(mine, key=_metric_order) if k in base}
    return out


def _metric_order(key: str) -> tuple[str, int]:
    name, step = key.split("@")
    return name, int(step)


def _cell(a: dict | None, fmt: str) -> str:
    if a is None:
        return "n/a"
    s = format(a["mean"], fmt)
    return s + (f" ± {format(a['std'], fmt)}" if a["n"] > 1 else "")


def table(summary: dict) -> str:
    arms = summary["arms"]
    first = next(iter(arms.values()))
    reward_cols = [k for k in first if k.startswith("reward@")]
    head = (["arm", "seeds", "steps"] + [f"reward {k.split('@')[1]}" for k in reward_cols] +
            ["held-out acc", "mean abs δ", "q05 δ", "gated tokens", "gate grad shift", "repair loss", "step s"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, a in arms.items():
        st = a.get("steps")
        steps = "n/a" if st is None else (f"{st['min']:.0f}" if st["min"] == st["max"] else
                                          f"{st['min']:.0f}-{st['max']:.0f}")
        cells = [arm, str(a["seeds"]), steps] + [_cell(a.get(k), ".3f") for k in reward_cols]
        cells += [_cell(a.get("eval_accuracy"), ".3f"), _cell(a.get("abs_gap_mean"), ".3g"),
                  _cell(a.get("gap_q05"), ".3g"), _cell(a.get("gated_token_frac"), ".3g"),
                  _cell(a.get("gate_grad_shift"), ".3g"), _cell(a.get("repair_loss"), ".3g"),
                  _cell(a.get("step_s"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    w = summary["config"]["window"]
    lines.append(f"\nMean ± sample std over seeds; steps: the steps the runs reached. Reward: mean of `reward/mean` over the {w} steps ending at the "
                 "step. Held-out accuracy: the eval of each run's highest evaluated step, by its own sampler precision "
                 "(in the run with eval.every, else an `eval run` of its checkpoint; the steps can differ between "
                 "runs: the table below compares them at equal steps). "
                 "δ, gated tokens, gate grad shift (share of gradient weight the gate moves between tokens) and "
                 "repair loss: means over all steps; step s: median step time.")
    steps = sorted({int(k) for a in arms.values() for k in a.get("eval_by_step", {})})
    step0 = any(a.get("eval_step0") is not None for a in arms.values())
    # with one checkpoint step and no baseline, the held-out column above already compares at equal steps
    if len(steps) + step0 > 1:
        lines += ["", ("Held-out accuracy by checkpoint step (mean ± std over the seeds evaluated there, n seeds; "
                       "step 0: the untrained model under the arm's precision):"), "",
                  "| arm | " + " | ".join(f"step {k}" for k in [0] * step0 + steps) + " |",
                  "|" + "---|" * (len(steps) + step0 + 1)]
        for arm, a in arms.items():
            got = {int(k): v for k, v in a.get("eval_by_step", {}).items()}
            cells = [f"{_cell(got[k], '.3f')} (n={got[k]['n']})" if got.get(k) else "-" for k in steps]
            if step0:
                acc = a.get("eval_step0")
                cells.insert(0, "-" if acc is None else f"{acc:.3f} (untrained)")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    if summary.get("vs_baseline"):
        lines += comparison_table(summary["vs_baseline"])
    return "\n".join(lines) + "\n"


def comparison_table(vs: dict) -> list[str]:
    """The "against the baseline" section of table.md: one row per arm, one column per compared metric."""
    keys = sorted({k for cmp in vs["arms"].values() for k in cmp}, key=_metric_order)
    if not keys:
        return []
    names = {"eval": "held-out", "reward": "reward"}
    head = ["arm"] + [f"{names.get(k.split('@')[0], k.split('@')[0])} {k.split('@')[1]}" for k in keys]
    from trainers.compare import min_p

    n_a, n_b = max((tuple(c["n"]) for cmp in vs["arms"].values() for c in cmp.values() if c), key=sum)
    note = (f"Against `{vs['baseline']}` at equal steps: difference of the seed means ± its Welch standard error, "
            f"and the exact two-sided permutation p-value over the seeds (`trainers/compare.py`; with {n_a} against "
            f"{n_b} seeds the smallest possible p is {min_p(n_a, n_b):.2f}):")
    lines = ["", note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, cmp in vs["arms"].items():
        cells = [arm]
        for k in keys:
            c = cmp.get(k)
            if c is None:
                cells.append("-")
                continue
            cell = f"{c['diff']:+.3f}" + (f" ± {c['se']:.3f}" if c["se"] is not None else "")
            cells.append(cell + (f" (p {c['p']:.2f})" if c["p"] is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_outputs(cfg: StudyConfig, summary: dict) -> None:
    from trainers.plots import HELDOUT, plot_groups

    atomic_write_text(cfg.root / "summary.json", json.dumps(_clean(summary), indent=1) + "\n")
    atomic_write_text(cfg.root / "table.md", f"# Study `{cfg.name}`\n\n" + table(summary))
    groups = {arm: [cfg.run_dir(arm, s) for s in cfg.seeds if read_metrics(cfg.run_dir(arm, s))] for arm in cfg.arms}
    groups = {k: v for k, v in groups.items() if v}
    if groups:
        plot_groups(groups, cfg.root / "reward.png", cfg.window, title=f"{cfg.name}: reward", panels=1)
        plot_groups(groups, cfg.root / "panels.png", cfg.window, title=cfg.name)
        if any("val/average" in r for runs in groups.values() for run in runs for r in read_metrics(run)):
            plot_groups(groups, cfg.root / "heldout.png", 1, title=f"{cfg.name}: held-out accuracy",
                        panels=HELDOUT)


def where(cfg: StudyConfig) -> str:
    """Each run's closing summary (``trainers.summary``: reward first to last, the gap, TRIAGE's gate, where its
    files are, the eval to run next), then where the study's own table and figures are."""
    from trainers.checkpoint import latest_checkpoint
    from trainers.config import load_config
    from trainers.losses import loss_mode
    from trainers.summary import run_summary

    out = []
    for arm in cfg.arms:
        for seed in cfg.seeds:
            run = cfg.run_dir(arm, seed)
            rows = read_metrics(run)
            if not rows:
                continue
            ckpt = latest_checkpoint(run / "checkpoints")
            curves = run / "curves.png"
            mode = loss_mode(load_config(train_args(cfg, arm, seed)).algorithm.loss_mode)
            out.append(f"[{arm}/seed{seed}] " + run_summary(
                run, rows, str(ckpt) if ckpt else "", curves if curves.is_file() else None, triage=mode.reports_gate))
    out.append(f"[study] table: {cfg.root / 'table.md'}   figures: {cfg.root / 'reward.png'}, "
               f"{cfg.root / 'panels.png'}   summary: {cfg.root / 'summary.json'}")
    return "\n".join(out)


def _clean(o: Any) -> Any:
    """NaN and inf become null, so that summary.json is strict JSON."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    train_seconds = None
    if "--train-seconds" in args:
        i = args.index("--train-seconds")
        try:
            train_seconds = float(args[i + 1])
        except (IndexError, ValueError):
            print("study error: --train-seconds needs a number of seconds", file=sys.stderr)
            return 2
        del args[i:i + 2]
    try:
        cfg = load_study(args[0], args[1:])
    except StudyError as e:
        print(f"study error: {e}", file=sys.stderr)
        return 2
    # a SIGTERM (timeout, a scheduler) unwinds like Ctrl-C, so the runs this study started are stopped with it
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    summary = run_study(cfg, say=lambda m: print(f"[study] {m}", flush=True), train_seconds=train_seconds)
    print(table(summary))
    print(where(cfg))
    print(json.dumps({"summary": str(cfg.root / "summary.json"), "failed": summary["failed"],
                      "stopped": summary["stopped"]}))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""The held-out evals a study starts itself: the ``eval run`` command lines of a run's last checkpoint
and of the untrained model (step 0), and which checkpoints are due one."""
from __future__ import annotations

import pathlib

from trainers.study.config import StudyConfig, train_args


def eval_dir(run: pathlib.Path) -> pathlib.Path | None:
    """``<run>/eval/<checkpoint>``: the eval of the run's latest checkpoint (None without one)."""
    from trainers.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run / "checkpoints")
    return None if ckpt is None else run / "eval" / ckpt.name


def _eval_settings(cfg: StudyConfig, arm: str, common: bool = False) -> list[str]:
    """The ``eval run`` options of ``arm``'s evals: the study's eval spec, under the arm's own sampler precision
    (``common``: under ``eval.precision``, as the trainer's second eval patches it: lm_head kept high, default
    alignment)."""
    from trainers.config import load_config

    tcfg = load_config(train_args(cfg, arm, cfg.seeds[0]))
    e = cfg.eval
    args = ["--tasks", e.tasks, "--samples", ",".join(f"{t}={e.samples}" for t in e.tasks.split(",")),
            "--temperature", str(e.temperature), "--max-new-tokens", str(e.max_new_tokens), "--seed", str(e.seed),
            "--batch-size", str(e.batch_size), "--quiet", "--dtype", tcfg.model.dtype]
    if tcfg.model.device != "auto":
        args += ["--device", tcfg.model.device]
    if common:
        return args + ([] if e.precision == "bf16" else ["--precision", e.precision]) + \
            (["--limit", str(e.limit)] if e.limit else [])
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


def step0_args(cfg: StudyConfig, arm: str, common: bool = False) -> tuple[pathlib.Path, list[str]] | None:
    """(output dir, ``eval run`` args) of the untrained model under ``arm``'s eval settings (``common``: under
    ``eval.precision``; None without it); arms with the same settings (model, precision, dtype, ...) share one
    directory, ``<output_dir>/step0/<precision>-<hash>``."""
    import hashlib

    from trainers.config import load_config

    if cfg.eval is None or not cfg.eval.step0 or (common and cfg.eval.precision is None):
        return None
    tcfg = load_config(train_args(cfg, arm, cfg.seeds[0]))
    args = [tcfg.model.path, *_eval_settings(cfg, arm, common)]
    tag = hashlib.sha1("\0".join(args).encode()).hexdigest()[:8]
    out = cfg.root / "step0" / f"{cfg.eval.precision if common else tcfg.precision.sampler}-{tag}"
    return out, [*args, "--output-dir", str(out)]


def _eval_due(cfg: StudyConfig, steps: int, where: pathlib.Path) -> bool:
    """Whether the study evaluates the checkpoint ``where`` names: every latest checkpoint, or with ``eval.every``
    (the runs evaluate themselves) only those of the steps the runs evaluate, whose eval an interruption
    prevented; the others wait for the run to get there."""
    every = cfg.eval.every if cfg.eval is not None else 0
    step = int(where.name[5:])
    return not every or step % every == 0 or step == steps

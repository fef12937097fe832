"""Run tracking: always ``metrics.jsonl`` in the output dir, wandb when enabled, a rich progress bar with ETA.

``logger.wandb.mode=auto`` means: ``$WANDB_MODE`` if set, else ``online`` with ``$WANDB_API_KEY``, else
``offline`` (sync later with ``wandb sync <output_dir>/wandb/offline-run-*``).
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

from minite_util.fileio import atomic_write_text
from trainers.config import Config, ConfigError, to_container

METRICS_FILE = "metrics.jsonl"


def resolve_wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf
    return v


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = pathlib.Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash
                continue
    return rows


class Tracker:
    def __init__(self, cfg: Config, run_dir: pathlib.Path, *, start_step: int, meta: dict) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.path = run_dir / METRICS_FILE
        # on resume keep only the rows of steps that the restored checkpoint contains
        rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= start_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self.mode = resolve_wandb_mode(cfg.logger.wandb.mode)
        self.wandb_run = None
        if self.mode != "disabled":
            import wandb

            w = cfg.logger.wandb
            try:
                self.wandb_run = wandb.init(project=w.project, entity=w.entity, name=w.name or run_dir.name,
                                            tags=list(w.tags) or None, dir=str(run_dir), mode=self.mode,
                                            config={**to_container(cfg), "run_meta": meta}, resume="allow",
                                            id=meta.get("run_id"), settings=wandb.Settings(init_timeout=30))
            except Exception as e:  # noqa: BLE001 - no key, no network, a refused login: one line, no traceback
                why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                raise ConfigError(f"wandb could not start in mode {self.mode!r} ({why}); set WANDB_API_KEY and check "
                                  "the network, or pass logger.wandb.mode=offline (or disabled)") from None
        self.progress = None
        self.task = None
        if cfg.logger.progress:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.fields[info]}"), transient=False)
            self.task = self.progress.add_task(cfg.recipe, total=cfg.trainer.max_steps, completed=start_step,
                                               info="")
            self.progress.start()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)
        if self.progress is not None:
            info = (f"reward {metrics.get('reward/mean', float('nan')):.3f}  "
                    f"|gap| {metrics.get('mismatch/abs_gap_mean', float('nan')):.2e}  "
                    f"{metrics.get('perf/step_s', float('nan')):.1f}s/step")
            self.progress.update(self.task, completed=step, info=info)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self.wandb_run is not None:
            self.wandb_run.finish()

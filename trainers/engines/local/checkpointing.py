"""Checkpoints of a run: saving one, resuming from the newest usable one, and the checks that the directory
being resumed holds the same run."""
from __future__ import annotations

import pathlib
import sys
from typing import Any

from trainers.checkpoint import CheckpointError, checkpoints_newest_first, load_checkpoint, save_checkpoint
from trainers.config import Config, ConfigError, flatten, to_container

#: keys that make a run what it is: resuming a directory whose run differs in one of them is refused
RUN_IDENTITY = ("model.path", "precision.learner", "precision.sampler", "data.task", "data.path",
                "algorithm.loss_mode")


def _saved_config(path: pathlib.Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        return flatten(OmegaConf.to_container(OmegaConf.load(path)))
    except Exception:  # noqa: BLE001 - an unreadable config.yaml only costs the comparison
        return None


def check_same_run(path: pathlib.Path, cfg: Config) -> None:
    """Refuse to resume a directory that holds another run (another model, data, recipe, task or loss); with
    ``trainer.resume=force`` say how it differs and continue it."""
    old = _saved_config(path)
    if old is None:
        return
    new = flatten(to_container(cfg))
    diff = [f"{k}={old.get(k)!r} (this command: {new.get(k)!r})" for k in RUN_IDENTITY if old.get(k) != new.get(k)]
    if diff and cfg.trainer.resume == "force":
        print(f"[trainers] trainer.resume=force: continuing the run in {path.parent}, which differs: "
              f"{'; '.join(diff)}", file=sys.stderr)
    elif diff:
        raise ConfigError(f"trainer.output_dir={path.parent} holds another run: {'; '.join(diff)}. Choose another "
                          "trainer.output_dir, pass trainer.resume=never to start a new run there, or "
                          "trainer.resume=force to continue it with this command's settings")


def _warn_config_changes(path: pathlib.Path, cfg: Config) -> None:
    """On resume, list keys whose value differs from the interrupted run's (exact resumption needs none)."""
    a = _saved_config(path)
    if a is None:
        return
    b = flatten(to_container(cfg))
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)
                     and not k.startswith(("trainer.max_steps", "trainer.resume", "logger.")))
    if changed:
        print(f"[trainers] resuming with a changed config ({', '.join(changed)}); the run will not match an "
              "uninterrupted one", file=sys.stderr)


class CheckpointMixin:
    """``LocalTrainer``'s checkpoint methods: resume at setup, save from the loop."""

    def _resume(self) -> pathlib.Path | None:
        """Load the checkpoint to resume from, if any, into the model and optimizer; return its path.

        ``trainer.resume=auto`` tries the newest checkpoint first and falls back to the previous one when it is
        damaged (each failure printed). A directory holding another run is refused before anything loads."""
        cfg = self.cfg
        if cfg.trainer.resume == "never":
            return None
        explicit = cfg.trainer.resume not in ("auto", "force")
        candidates = [pathlib.Path(cfg.trainer.resume)] if explicit else checkpoints_newest_first(self.ckpt_root)
        if not candidates:
            return None
        if not explicit:
            check_same_run(self.run_dir / "config.yaml", cfg)
        errors = []
        for c in candidates:
            try:
                self._resumed_state = load_checkpoint(c, model=self.model, optimizer=self.optimizer,
                                                      scheduler=self.scheduler)
                return c
            except CheckpointError as e:
                if explicit:
                    raise
                errors.append(str(e))
                print(f"[trainers] cannot resume from {c.name}: {e}", file=sys.stderr)
        raise CheckpointError(f"no checkpoint in {self.ckpt_root} can be resumed ({len(errors)} tried; the newest: "
                              f"{errors[0]}). Pass trainer.resume=never to start over in this directory, or "
                              "choose another trainer.output_dir")

    def save(self, step: int) -> pathlib.Path:
        return save_checkpoint(self.ckpt_root, step, model=self.model, tokenizer=self.tok, optimizer=self.optimizer,
                               scheduler=self.scheduler, trainer_state=dict(self.state),
                               keep=self.cfg.trainer.keep_checkpoints)

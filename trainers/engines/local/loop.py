"""The engine and its run loop: ``LocalTrainer`` (the concerns' mixins together), ``train`` under the run lock,
the step loop (held-out evals, metrics, checkpoints, the divergence and SIGTERM stops), the end-of-run report,
and ``run_local``."""
from __future__ import annotations

import sys
from typing import Any

import torch

from trainers import heldout
from trainers.checkpoint import latest_checkpoint
from trainers.config import Config, ConfigError
from trainers.engines.local.checkpointing import CheckpointMixin
from trainers.engines.local.rollout_phase import RolloutMixin
from trainers.engines.local.runtime import _write_meta
from trainers.engines.local.setup import SetupMixin
from trainers.engines.local.step import StepMixin
from trainers.engines.local.update import LearnerMixin
from trainers.engines.local.weight_sync import WeightSyncMixin
from trainers.runlock import RunLock
from trainers.stopping import GracefulStop
from trainers.tracking import Tracker


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite losses; the last good checkpoint is intact."""


class LocalTrainer(SetupMixin, CheckpointMixin, WeightSyncMixin, RolloutMixin, LearnerMixin, StepMixin):
    """``model_and_tokenizer`` injects an already-built (model, tokenizer) instead of loading ``model.path``
    (benchmarks and tests with random models); everything else follows ``cfg``."""

    def __init__(self, cfg: Config, *, model_and_tokenizer: tuple[Any, Any] | None = None) -> None:
        self.cfg = cfg
        self._injected = model_and_tokenizer
        self.run_dir = cfg.output_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        dev = cfg.model.device
        self.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"model.device={dev}, but this torch ({torch.__version__}) sees no CUDA device; use "
                              "model.device=auto or cpu")

    def train(self) -> dict[str, Any]:
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ConfigError(f"trainer.output_dir={self.run_dir} is a file, not a directory")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            probe = self.run_dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"trainer.output_dir={self.run_dir} cannot hold a run: {e.strerror or e}") from None
        with RunLock(self.run_dir):
            return self._train()

    def _train(self) -> dict[str, Any]:
        cfg = self.cfg
        self.setup()
        tracker = Tracker(cfg, self.run_dir, start_step=self.start_step, meta=self.meta)
        last: dict[str, float] = {}
        stopped = False
        with GracefulStop() as stop:
            try:
                for step in range(self.start_step, cfg.trainer.max_steps):
                    last = self.step(step)
                    done = step + 1
                    if heldout.due(cfg, done) and self.state["consecutive_nan"] == 0:
                        last.update(heldout.evaluate(cfg, done, sampler=self.sampler, tokenizer=self.tok,
                                                     precision=self.sampler_precision, device=self.device,
                                                     run_dir=self.run_dir))
                        if cfg.eval.precision is not None:
                            last.update(heldout.evaluate_common(cfg, done, common=self.common_eval,
                                                                learner=self.model, tokenizer=self.tok,
                                                                device=self.device, run_dir=self.run_dir))
                    tracker.log(done, last)
                    if self.state["consecutive_nan"] >= cfg.trainer.max_consecutive_nan:
                        raise TrainingDiverged(
                            f"{self.state['consecutive_nan']} consecutive steps had a non-finite loss or gradient "
                            f"(last at step {done}); stopping. The last good checkpoint is "
                            f"{latest_checkpoint(self.ckpt_root) or '(none yet)'}, untouched.")
                    healthy = self.state["consecutive_nan"] == 0
                    if healthy and (stop.requested or (cfg.trainer.save_every and done % cfg.trainer.save_every == 0)
                                    or (done == cfg.trainer.max_steps and cfg.trainer.save_final)):
                        self.save(done)
                    if stop.requested and done < cfg.trainer.max_steps:
                        stopped = True
                        saved = "its checkpoint saved" if healthy else \
                            "not saved (a non-finite step): the last good checkpoint stays"
                        print(f"[trainers] SIGTERM: stopped after step {done}, {saved}; trainer.resume=auto "
                              "continues there", file=sys.stderr)
                        break
            finally:
                tracker.close()
                _write_meta(self.run_dir, {"sampler": self.sampler.describe()})
        ckpt = str(latest_checkpoint(self.ckpt_root) or "")
        self._report(ckpt)
        return {"run_dir": str(self.run_dir), "last_step_metrics": last, "checkpoint": ckpt, "stopped": stopped}

    def _report(self, checkpoint: str) -> None:
        """Write ``curves.png`` (the Figure-2 panels) and print the end-of-run summary; a plotting failure
        is reported, never fatal (the run itself is complete)."""
        from trainers.plots import plot, read_rows
        from trainers.summary import run_summary

        rows = read_rows(self.run_dir) if (self.run_dir / "metrics.jsonl").is_file() else []
        curves = None
        try:
            curves = plot([self.run_dir], self.run_dir / "curves.png")
        except Exception as e:  # noqa: BLE001 - e.g. a headless machine without a matplotlib backend
            print(f"[trainers] curves.png not written: {type(e).__name__}: {e}", file=sys.stderr)
        print(run_summary(self.run_dir, rows, checkpoint, curves, triage=self.loss_mode.reports_gate),
              file=sys.stderr)


def run_local(cfg: Config) -> dict[str, Any]:
    return LocalTrainer(cfg).train()

"""One GRPO step, in order: rollout, rewards, GRPO advantages, the learner's old log-probs, the mismatch
diagnostics, the update, the weight sync, and the step's metrics. Where the update is one epoch of one mini-batch
(``algorithm.old_log_prob=auto``), its own forward gives the old log-probs, and the diagnostics follow it."""
from __future__ import annotations

import time

import numpy as np
import torch

from rollout import SamplingParams
from trainers.engines.local.rollout_phase import SAMPLER_COUNTS
from trainers.engines.local.runtime import gpu_memory, timed
from trainers.learner import actor as A
from trainers.learner.batch import collate


class AlignmentError(RuntimeError):
    """A strict-alignment run saw the sampler and the learner disagree."""


class StepMixin:
    """``LocalTrainer.step``: one GRPO step, from the prompts to the metrics."""

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step; under ``precision.alignment=strict`` every reduction is batch-invariant
        (``minite_kernels.strict``)."""
        if self.cfg.precision.alignment != "strict":
            return self._step(step)
        from minite_kernels.strict import StrictMode

        with StrictMode():
            return self._step(step)

    def _step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        t: dict[str, float] = {}
        t_step = time.perf_counter()
        examples = self.schedule.batch(step)
        prompts = [self._prompt_ids(ex) for ex in examples for _ in range(cfg.rollout.n)]
        params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                                max_new_tokens=cfg.rollout.max_new_tokens,
                                seed=cfg.trainer.seed * 1_000_003 + step)
        self.model.eval()
        before = dict(getattr(self.sampler, "stats", {}))
        with timed(t, "timing/rollout_s", self.device):
            completions = self.sampler.generate(prompts, params)
        # the engine's graph work this step: a capture costs a warm-up step plus the capture, a refill a copy
        sampler_counts = {f"rollout/{k}": float(v - before.get(k, 0))
                          for k, v in getattr(self.sampler, "stats", {}).items() if k in SAMPLER_COUNTS}
        self._report_eager_fallback(step + 1)  # the step number the metrics log
        with timed(t, "timing/reward_s", self.device):
            scores, reward_extra = self._score(step, examples, completions)
        batch = collate(completions, self.sampler.pad_id, self.device)
        mask = batch.response_mask
        group_ids = [i // cfg.rollout.n for i in range(len(completions))]
        adv = A.grpo_advantages(scores, mask.cpu(), group_ids, cfg.algorithm.norm_adv_by_std_in_grpo).to(self.device)
        from triage import mismatch_metrics

        # setup decided it: not under strict alignment (which checks the no-gradient forward the sampler reproduces,
        # before any update) nor for a model that drops activations in training
        fill = rc_metrics = None
        if self.old_from_update:  # the update's forward gives the old log-probs (AlgorithmConfig.old_log_prob)
            old = torch.zeros(mask.shape, device=self.device)
            fill = (torch.zeros_like(old), torch.zeros(mask.shape[0], dtype=torch.bool, device=self.device))
            ent, weights = fill[0], None
            t["timing/logprob_s"] = 0.0
        else:
            with timed(t, "timing/logprob_s", self.device):
                old, ent = self._recompute_old(batch)
            delta = (old - batch.sampler_logp) * mask
            if cfg.precision.alignment == "strict" and bool((delta != 0).any()):
                raise AlignmentError(
                    f"precision.alignment=strict, step {step + 1}: the learner's log-probs differ from the "
                    f"sampler's on {int((delta != 0).sum())} of {int(mask.sum())} tokens (max |delta| "
                    f"{float(delta.abs().max()):.3g}); strict mode promises equal bits, so the run stops here")
            weights, rc_metrics = A.rollout_is_weights(cfg.algorithm, old, batch.sampler_logp, mask)
        with timed(t, "timing/update_s", self.device):
            upd, nonfinite = self._update(step, batch, old, adv, weights, fill=fill)
        # the rows with old log-probs: every row, unless the update's forward made them and a non-finite loss
        # stopped it early
        seen = mask if fill is None else mask * fill[1][:, None]
        metrics: dict[str, float] = dict(mismatch_metrics((old - batch.sampler_logp) * seen, adv, seen,
                                                          self.diag_cfg))
        if rc_metrics is None:
            rc_metrics = A.rollout_is_weights(cfg.algorithm, old, batch.sampler_logp, seen)[1]
        metrics.update(rc_metrics)
        for k, v in upd.items():
            metrics.setdefault(k, v)
        with timed(t, "timing/sync_s", self.device):
            metrics.update(self._weight_sync())
        ntok = batch.num_tokens
        lengths = mask.sum(-1)
        correct = (scores >= 1.0).float()
        groups = scores.view(-1, cfg.rollout.n)
        step_s = time.perf_counter() - t_step
        metrics.update({
            "reward/mean": float(scores.mean()), "reward/std": float(scores.std(unbiased=False)),
            "reward/accuracy": float(correct.mean()),
            "reward/solved_groups_frac": float((groups.max(-1).values >= 1).float().mean()),
            "reward/zero_adv_groups_frac": float((groups.std(-1, unbiased=False) == 0).float().mean()),
            "actor/entropy": float((ent * seen).sum() / seen.sum().clamp(min=1)),
            "response/length_mean": float(lengths.float().mean()), "response/length_max": float(lengths.max()),
            "response/clip_frac": float(np.mean([c.finish_reason == "length" for c in completions])),
            "perf/response_tokens": float(ntok), "perf/step_s": step_s,
            "perf/tokens_per_s": ntok / max(step_s, 1e-9),
            "perf/rollout_tokens_per_s": ntok / max(t["timing/rollout_s"], 1e-9),
            "train/nan_skipped": float(nonfinite), **reward_extra, **t, **sampler_counts,
            **gpu_memory(self.device),  # since the last step's end: held-out evals between steps included
        })
        self._log_samples(step, examples, completions, scores)
        if nonfinite:
            self.state["nan_skipped_total"] += 1
            self.state["consecutive_nan"] += 1
        else:
            self.state["consecutive_nan"] = 0
        metrics["train/nan_skipped_total"] = float(self.state["nan_skipped_total"])
        return metrics

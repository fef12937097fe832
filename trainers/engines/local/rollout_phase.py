"""The rollout side of a step: prompt token ids, reward scoring, the sampler's per-step counters and its eager
fallback, and the ``samples.jsonl`` log."""
from __future__ import annotations

import json
import sys

import numpy as np
import torch

from trainers.data import render_prompt
from trainers.engines.local.runtime import _write_meta
from trainers.rewards.registry import score_one

#: GraphSampler.stats counters logged per step as ``rollout/<name>`` (what changed during that step's rollout;
#: ``capture_s``: the seconds of it spent on new graph keys)
SAMPLER_COUNTS = ("captures", "refills", "eager_steps", "compactions", "capture_s")


def _row_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, ValueError, TypeError):
        return 1 << 62


class RolloutMixin:
    """``LocalTrainer``'s rollout-phase methods: prompts, rewards, sampler reports, samples."""

    def _prompt_ids(self, ex) -> list[int]:
        if ex.index not in self._prompt_cache:
            self._prompt_cache[ex.index] = render_prompt(self.tok, ex, self.cfg.data)
        return self._prompt_cache[ex.index]

    def _score(self, step: int, examples, completions) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.cfg.rollout.n
        scores, extras = [], {}
        self._texts = []
        for i, c in enumerate(completions):
            ex = examples[i // n]
            text = self.tok.decode(c.token_ids, skip_special_tokens=True)
            self._texts.append(text)
            s, extra = score_one(self.reward_fn, self.reward_name, data_source=ex.data_source, response=text,
                                 ground_truth=ex.answer,
                                 extra_info={"question": ex.question, "index": ex.index, "step": step, **ex.extra},
                                 sample=f"step {step}, sample {i} (prompt index {ex.index})")
            scores.append(s)
            for k, v in extra.items():
                extras.setdefault(f"reward/{k}", []).append(v)
        return torch.tensor(scores, dtype=torch.float32), {k: float(np.mean(v)) for k, v in extras.items()}

    def _report_eager_fallback(self, step: int) -> None:
        """Say once, on stderr and in meta.json, that the CUDA-graph sampler gave up on graphs (a failed
        capture): every later rollout decodes step by step on the host, several times slower."""
        reason = getattr(self.sampler, "eager_reason", None)
        if reason is None or self._eager_reported:
            return
        self._eager_reported = True
        print(f"[trainers] warning: from step {step} the rollout decodes eagerly, several times slower: {reason}",
              file=sys.stderr)
        _write_meta(self.run_dir, {"sampler": self.sampler.describe()})

    def _log_samples(self, step: int, examples, completions, scores: torch.Tensor) -> None:
        k = min(self.cfg.trainer.log_samples, len(completions))
        if not k:
            return
        n = self.cfg.rollout.n
        with (self.run_dir / "samples.jsonl").open("a") as f:
            for i in range(k):
                ex = examples[i // n]
                f.write(json.dumps({"step": step + 1, "question": ex.question, "gold": ex.answer,
                                    "response": self._texts[i], "reward": float(scores[i]),
                                    "finish_reason": completions[i].finish_reason}) + "\n")

"""``engine=local``: one process, CPU or one GPU. One GRPO step (docs/ARCHITECTURE.md "One GRPO step"):

prompts -> sampler (KV-cache decode, precision P) -> tokens + sampler_logp -> rewards -> GRPO advantages ->
learner's old_logp (same P: a no-gradient forward, or, for one epoch of one mini-batch, the update's own forward)
-> delta = old_logp - sampler_logp -> policy loss
(verl registry: vanilla / triage), PPO epochs x mini-batches x micro-batches -> AdamW -> weight sync
(re-quantize) -> metrics (mismatch diagnostics every step) -> checkpoint.
"""
from __future__ import annotations

# one module per concern, each importing only those above it: runtime (process, timing, run_meta.json) ->
# checkpointing (save, resume, same-run checks) -> weight_sync (precision, learner-to-sampler sync) -> rollout_phase
# (prompts, rewards, samples log) -> update (log-probs, PPO update) -> setup (building the engine) -> step (one GRPO
# step) -> loop (LocalTrainer, the run loop, run_local)
from trainers.engines.local.checkpointing import RUN_IDENTITY, check_same_run
from trainers.engines.local.loop import LocalTrainer, TrainingDiverged, run_local
from trainers.engines.local.rollout_phase import SAMPLER_COUNTS
from trainers.engines.local.runtime import ENV_ECHO_PREFIXES, choose_cpu_threads, env_snapshot, timed
from trainers.engines.local.step import AlignmentError
from trainers.engines.local.weight_sync import apply_precision

__all__ = [
    "ENV_ECHO_PREFIXES",
    "RUN_IDENTITY",
    "SAMPLER_COUNTS",
    "AlignmentError",
    "LocalTrainer",
    "TrainingDiverged",
    "apply_precision",
    "check_same_run",
    "choose_cpu_threads",
    "env_snapshot",
    "run_local",
    "timed",
]

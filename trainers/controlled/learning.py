"""GRPO from scratch, S seeds at once, under one mismatch and one estimator; resumable.

Every step, for every seed: draw the batch's prompts and uniforms (``rng.generator(seed, "rollout", step)``: the
same for every arm of that seed), sample P x G responses from the sampler (the learner itself for ``on_policy``),
take the arm's loss (``gradient.arm_loss``: the project's ``triage_policy_loss``), clip the seed's gradient norm
and take an Adam step. The seeds are independent members of one ``EnsembleMLP``, so the whole step is one
batched computation. Seed s starts from the same parameters in every arm (``policy.EnsembleMLP.init``).

Recorded: the learner's exact expected reward (``task.expected_reward``: its own policy, no sampling) per seed
at step 0 and every ``eval_every`` steps; per step, the seed mean of the sampled training reward, of the gap
``delta = logp - sampler_logp`` (mean, mean |delta|) and, for the TRIAGE arm, of its gate and repair metrics.

Checkpoints (``work_dir``, every ``checkpoint_every`` steps) hold the parameters, Adam's state and the record,
written atomically (``minite_util.fileio.atomic_path``). Because every draw is a function of (seed, step), a
run resumed from step k continues exactly as the uninterrupted run (tested).
"""
from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Callable, Sequence

import torch

from minite_util.fileio import atomic_path
from trainers.controlled.config import ControlledConfig
from trainers.controlled.gradient import arm_loss, learner_logp, rollout
from trainers.controlled.mismatch import ON_POLICY, Mismatch, draw
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.task import ChainTask

#: TRIAGE-arm metrics averaged over seeds at every step
STEP_KEYS = ("triage/gated_token_frac", "triage/gate_grad_shift", "triage/repair_active_segment_frac",
             "tis/clip_frac")


def fingerprint(cfg: ControlledConfig, mismatch: Mismatch, arm: str, seeds: Sequence[int], purpose: str) -> str:
    """What a checkpoint must match to be resumed: everything that changes the run except its length."""
    key = {"task": cfg.task, "policy": cfg.policy, "optim": cfg.optim, "seed": cfg.seed, "mismatch": mismatch,
           "arm": arm, "seeds": list(seeds), "purpose": purpose, "eval_every": cfg.learning.eval_every}
    return hashlib.sha256(json.dumps(key, default=repr, sort_keys=True).encode()).hexdigest()[:16]


def clip_per_seed(policy: EnsembleMLP, max_norm: float) -> torch.Tensor:
    """Scale each member's gradient to norm <= max_norm (0: no clipping); returns the norms before."""
    norms = policy.flat_grads().norm(dim=1)
    if max_norm > 0:
        scale = (max_norm / norms.clamp(min=1e-12)).clamp(max=1.0)
        for p in policy.parameters():
            p.grad.mul_(scale.view(-1, *([1] * (p.dim() - 1))))
    return norms


def train(cfg: ControlledConfig, mismatch: Mismatch, arm: str, seeds: Sequence[int], *, steps: int,
          checkpoint: pathlib.Path | None = None, purpose: str = "rollout",
          on_step: Callable[[int, EnsembleMLP], None] | None = None) -> dict:
    """Train ``seeds`` for ``steps`` steps; returns the record (see the module docstring).

    ``arm`` is one of ``gradient.ARM_CONFIGS``; ``on_policy`` ignores ``mismatch``. ``on_step(step, policy)``
    is called after step 0 (before training) and after every step."""
    t, task = cfg.task, ChainTask(cfg.task.vocab, cfg.task.length)
    x = task.features()
    mm = ON_POLICY if arm == "on_policy" else mismatch
    fp = fingerprint(cfg, mm, arm, seeds, purpose)
    policy = EnsembleMLP.init(seeds, t.vocab, cfg.policy.hidden, cfg.seed)
    o = cfg.optim
    opt = torch.optim.Adam(policy.parameters(), lr=o.lr, betas=o.betas, eps=o.eps)
    record = {"fingerprint": fp, "arm": arm, "mismatch": mm.label(), "seeds": list(seeds), "eval_steps": [],
              "exact_reward": [], "train_reward": [], "gap_mean": [], "gap_abs_mean": [],
              **{k: [] for k in STEP_KEYS}}
    start = 0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        if state.get("fingerprint") == fp and state["step"] <= steps:
            policy = EnsembleMLP.from_state_dict(state["policy"])
            opt = torch.optim.Adam(policy.parameters(), lr=o.lr, betas=o.betas, eps=o.eps)
            opt.load_state_dict(state["optim"])
            record, start = state["record"], state["step"]
    if start == 0:
        _evaluate(task, policy, x, record, 0)
        if on_step is not None:
            on_step(0, policy)
    every = cfg.learning.checkpoint_every
    for step in range(start + 1, steps + 1):
        draws = draw(task, seeds, t.prompts, t.group, mm, cfg.seed, purpose, step)
        batch = rollout(task, policy, x, mm, draws, t.group)
        logp = learner_logp(task, policy, x, batch)
        opt.zero_grad(set_to_none=True)
        loss, metrics = arm_loss(logp, batch, arm)
        loss.backward()
        clip_per_seed(policy, o.grad_clip)
        opt.step()
        with torch.no_grad():
            gap = logp.detach() - batch.sampler_logp
        record["train_reward"].append(float(batch.rewards.mean()))
        record["gap_mean"].append(float(gap.mean()))
        record["gap_abs_mean"].append(float(gap.abs().mean()))
        for k in STEP_KEYS:
            vals = [m[k] for m in metrics if k in m]
            record[k].append(sum(vals) / len(vals) if vals else 0.0)
        if step % cfg.learning.eval_every == 0 or step == steps:
            _evaluate(task, policy, x, record, step)
        if on_step is not None:
            on_step(step, policy)
        if checkpoint is not None and every and (step % every == 0 or step == steps):
            save_checkpoint(checkpoint, {"fingerprint": fp, "step": step, "policy": policy.state_dict(),
                                         "optim": opt.state_dict(), "record": record})
    record["final_policy"] = policy.state_dict()
    return record


def _evaluate(task: ChainTask, policy: EnsembleMLP, x: torch.Tensor, record: dict, step: int) -> None:
    if record["eval_steps"] and record["eval_steps"][-1] == step:
        return
    with torch.no_grad():
        record["eval_steps"].append(step)
        record["exact_reward"].append(task.expected_reward(policy.logp_table(x)).tolist())


def save_checkpoint(path: pathlib.Path, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)

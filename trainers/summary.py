"""The few lines a run prints when it ends: what happened, where it is, what to run next.

Example (the embedded default)::

    [trainers] 8 steps -> runs/default
      reward/mean 0.250 (step 1) -> 0.438 (step 8)
      sampler/learner gap: mean |delta| 2.6e-06, negative tail depth -q0.05 6.6e-06 (last step)
      held-out (eval.every): arithmetic 0.72 (step 4) -> 0.9 (step 8)      [only when the run evaluated itself]
      curves: runs/default/curves.png   metrics: runs/default/metrics.jsonl   wandb: runs/default/wandb
      next: python -m eval run runs/default/checkpoints/step_000008 --tasks gsm8k --limit 5
"""
from __future__ import annotations

import pathlib


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else "n/a"


def run_summary(run_dir: pathlib.Path, rows: list[dict], checkpoint: str, curves: pathlib.Path | None,
                triage: bool = False) -> str:
    """The summary text; ``triage``: the run's loss is TRIAGE (its gate line is printed)."""
    if not rows:
        return f"[trainers] no steps logged in {run_dir}"
    first, last = rows[0], rows[-1]
    lines = [f"[trainers] {last.get('step', len(rows))} steps -> {run_dir}",
             f"  reward/mean {_fmt(first.get('reward/mean'))} (step {first.get('step')}) -> "
             f"{_fmt(last.get('reward/mean'))} (step {last.get('step')})",
             f"  sampler/learner gap: mean |delta| {_fmt(last.get('mismatch/abs_gap_mean'))}, negative tail depth "
             f"-q0.05 {_fmt(last.get('mismatch/neg_tail_depth'))} (last step)"]
    evals = [r for r in rows if "val/average" in r]
    if evals:
        a, b = evals[0], evals[-1]
        tasks = ", ".join(k[4:] for k in b if k.startswith("val/") and k != "val/average")
        span = f"{_fmt(a['val/average'])} (step {a.get('step')}) -> " if len(evals) > 1 else ""
        lines.append(f"  held-out (eval.every): {tasks} {span}{_fmt(b['val/average'])} (step {b.get('step')})")
    if triage and "triage/gated_token_frac" in last:
        lines.append(f"  TRIAGE: gated token fraction {_fmt(last['triage/gated_token_frac'])}, repair loss "
                     f"{_fmt(last.get('triage/repair_loss'))} (last step)")
    where = [f"curves: {curves}"] if curves else []
    where.append(f"metrics: {run_dir / 'metrics.jsonl'}")
    if (run_dir / "wandb").is_dir():
        where.append(f"wandb: {run_dir / 'wandb'}")
    lines.append("  " + "   ".join(where))
    if checkpoint:
        lines.append(f"  next: python -m eval run {checkpoint} --tasks gsm8k --limit 5")
    return "\n".join(lines)

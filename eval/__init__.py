"""Evaluate checkpoints and response files on AIME24, AIME25, MATH-500, AMC23, GSM8K and IFEval with the
report's protocol (§6.2.2): avg@k per task (AIME k=6; MATH-500, GSM8K, IFEval k=4), IFEval prompt-level
strict, and an equal-weighted average over tasks.

    python -m eval run CHECKPOINT --tasks aime24,aime25,math500,amc23,gsm8k,ifeval
    python -m eval score math500 predictions.jsonl --json
    python -m eval compare outputs/eval/bf16 outputs/eval/nvfp4

Layout: ``tasks/`` (one file per benchmark: loader, prompt, extraction, scorer), ``data/`` (bundled test
sets), ``engines/`` (local, vllm), ``runner`` (eval run), ``scoring`` (eval score), ``report``, ``metrics``.
"""
from __future__ import annotations

__all__ = ["RunConfig", "get_task", "run_eval", "score_predictions", "task_names"]


def __getattr__(name: str):
    if name in ("RunConfig", "run_eval"):
        from eval import runner

        return getattr(runner, name)
    if name == "score_predictions":
        from eval.scoring import score_predictions

        return score_predictions
    if name in ("get_task", "task_names"):
        from eval import task

        return getattr(task, name)
    raise AttributeError(f"module 'eval' has no attribute {name!r}")

"""Reward functions used by the trainer tests through `reward.fn=reward_helpers:NAME` (this dir is put on sys.path)."""
from __future__ import annotations

CRASH_AT_STEP: int | None = None


def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 for responses with an even number of characters: gives GRPO signal even on a random model."""
    return {"score": float(len(solution_str) % 2 == 0), "chars": float(len(solution_str))}


def crash_at_step(data_source, solution_str, ground_truth, extra_info=None):
    if CRASH_AT_STEP is not None and extra_info["step"] == CRASH_AT_STEP:
        raise RuntimeError("simulated crash")
    return length_reward(data_source, solution_str, ground_truth, extra_info)


def returns_text(data_source, solution_str, ground_truth, extra_info=None):
    return "good"


def always_raises(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("bad reward")

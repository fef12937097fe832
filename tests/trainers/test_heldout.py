"""trainers.heldout: when a run evaluates itself, and the checks that fail before training instead of at the first
eval step (the end-to-end behaviour is in test_grpo_e2e.py)."""
from __future__ import annotations

import pytest

from trainers import heldout
from trainers.config import ConfigError, load_config


def test_due_every_n_steps_and_after_the_last():
    cfg = load_config(["eval.every=4", "trainer.max_steps=10"])
    assert [s for s in range(1, 11) if heldout.due(cfg, s)] == [4, 8, 10]
    assert not any(heldout.due(load_config(["trainer.max_steps=10"]), s) for s in range(1, 11))


def test_missing_eval_data_fails_before_training(monkeypatch):
    def gone(task, *a, **k):
        raise FileNotFoundError(f"no such file: {task.name}/test.jsonl")

    monkeypatch.setattr("eval.data.load_rows", gone)
    heldout.check(load_config([]))  # eval off: nothing is loaded
    with pytest.raises(ConfigError, match=r"eval.tasks: arithmetic cannot be evaluated: no such file"):
        heldout.check(load_config(["eval.every=5"]))


def test_drop_after_keeps_the_evals_up_to_the_resumed_step(tmp_path):
    for step in (5, 10, 15):
        heldout.eval_dir(tmp_path, step).mkdir(parents=True)
    assert heldout.drop_after(tmp_path, 10) == ["step_000015"]
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["step_000005", "step_000010"]


def test_eval_precision_is_checked_up_front():
    with pytest.raises(ConfigError, match="eval.precision='nvfp5' is not a precision recipe.*valid choices: bf16"):
        load_config(["eval.every=2", "eval.precision=nvfp5"])
    with pytest.raises(ConfigError, match="eval.precision=bf16 adds an eval to the run's own .eval.every., which is 0"):
        load_config(["eval.precision=bf16"])


@pytest.mark.parametrize("args, same", [
    (["recipe=bf16", "eval.precision=bf16"], True),
    (["recipe=bf16", "precision.sampler=nvfp4_per_token_w1x16_bf16_bwd", "eval.precision=bf16"], False),
    (["recipe=nvfp4", "eval.precision=nvfp4_per_token_w1x16_bf16_bwd"], True),
    (["recipe=nvfp4", "eval.precision=nvfp4_per_token_w1x16_bf16_bwd", "precision.exclude=[lm_head,0]"], False),
    (["recipe=strict_nvfp4", "eval.precision=nvfp4_per_token_w1x16_bf16_bwd"], False),  # strict alignment
    (["recipe=nvfp4", "eval.precision=bf16"], False),
])
def test_own_is_common_only_where_the_sampler_is_that_precision(args, same):
    assert heldout.own_is_common(load_config(["eval.every=2", *args])) is same


def test_drop_after_also_drops_the_common_precision_evals(tmp_path):
    for step in (5, 10):
        heldout.eval_dir(tmp_path, step).mkdir(parents=True)
        heldout.eval_dir(tmp_path, step, "bf16").mkdir(parents=True)
    assert heldout.drop_after(tmp_path, 5) == ["step_000010", "eval@bf16/step_000010"]
    assert [p.name for p in (tmp_path / "eval@bf16").iterdir()] == ["step_000005"]

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

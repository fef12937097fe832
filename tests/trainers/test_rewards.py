"""Reward hook: loading, validation of results, clear errors; built-in scorer dispatch."""
from __future__ import annotations

import pathlib

import pytest

from trainers.rewards.registry import RewardError, compute_score, load_reward_fn, score_one

HERE = pathlib.Path(__file__).parent


@pytest.fixture(autouse=True)
def _helpers_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def _call(spec, response="x = 8"):
    fn, name = load_reward_fn(spec)
    return score_one(fn, name, data_source="arithmetic", response=response, ground_truth="8",
                     extra_info={"step": 0}, sample="step 0, sample 3 (prompt index 5)")


def test_builtin_scorer_arithmetic_and_gsm8k():
    assert compute_score("arithmetic", "3 + 5 = 8.", "8") == 1.0
    assert compute_score("arithmetic", "3 + 5 = 9", "8") == 0.0
    assert compute_score("openai/gsm8k", "so #### 1,234", "1234") == 1.0
    assert compute_score("math", r"the answer is \boxed{\frac{1}{2}}", r"\frac12") == 1.0


def test_default_spec_is_builtin():
    assert _call(None) == (1.0, {})


def test_dict_result_extra_fields_logged():
    score, extra = _call("reward_helpers:length_reward", "short!")
    assert score == 1.0 and extra == {"chars": 6.0}


def test_raising_reward_names_function_and_sample():
    with pytest.raises(RewardError, match=r"reward_helpers:always_raises raised ValueError: bad reward on "
                                          r"step 0, sample 3 \(prompt index 5\)"):
        _call("reward_helpers:always_raises")


def test_non_numeric_result_rejected():
    with pytest.raises(RewardError, match="returned 'good'"):
        _call("reward_helpers:returns_text")


@pytest.mark.parametrize("spec,match", [
    ("reward_helpers:nope", "has no function 'nope'.*length_reward"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("reward_helpers", "must look like 'package.module:function'"),
])
def test_bad_specs(spec, match):
    with pytest.raises(RewardError, match=match):
        load_reward_fn(spec)

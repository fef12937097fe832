"""trainers/paired.py: the held-out AUC, the paired comparison by seed and the seeds 80% power needs."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.paired import auc, paired_curves, seeds_for_power


def test_the_docstring_examples():
    assert auc({0: 0.2, 5: 0.4, 10: 0.8}, [0, 5, 10]) == pytest.approx(0.45)
    assert auc({5: 0.4, 10: 0.8}, [10]) == 0.8
    assert seeds_for_power(0.5) == 34
    assert seeds_for_power(-0.3) == 90  # the exact paired t-test needs 90 as well
    assert seeds_for_power(0.0) is None
    assert seeds_for_power(float("inf")) == 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8), st.lists(st.integers(1, 20), min_size=8, max_size=8))
def test_auc_lies_between_the_curves_extremes(values, gaps):
    steps = [sum(gaps[:i]) for i in range(len(values))]
    curve = dict(zip(steps, values))
    assert min(values) - 1e-12 <= auc(curve, steps) <= max(values) + 1e-12


def test_paired_by_seed_over_the_steps_every_run_has():
    arm = {0: {5: 0.5, 10: 0.7}, 1: {5: 0.4, 10: 0.6, 15: 0.9}, 2: {5: 0.6, 10: 0.8}}
    base = {0: {5: 0.4, 10: 0.5}, 1: {5: 0.3, 10: 0.5}, 3: {5: 0.0, 10: 0.0}}  # seed 3: no pair
    r = paired_curves(arm, base)
    assert r["seeds"] == [0, 1] and r["steps"] == [5, 10]
    assert r["auc"]["arm"] == pytest.approx((0.6 + 0.5) / 2) and r["auc"]["base"] == pytest.approx((0.45 + 0.4) / 2)
    assert r["auc"]["diff"] == pytest.approx(0.125) and r["last"]["diff"] == pytest.approx(0.15)
    assert r["auc"]["n"] == 2 and r["auc"]["p"] > 0.2  # two seeds: at best 2 of 4 sign patterns as extreme

    with_step0 = paired_curves(arm, base, step0=(0.1, 0.3))
    assert with_step0["steps"] == [0, 5, 10]
    # seed 0: arm (5 * 0.3 + 5 * 0.6) / 10 = 0.45, base (5 * 0.35 + 5 * 0.45) / 10 = 0.40
    assert with_step0["auc"]["arm"] - with_step0["auc"]["base"] == pytest.approx(with_step0["auc"]["diff"])
    assert paired_curves({0: {5: 1.0}}, {0: {5: 0.0}}) is None  # one seed: no spread, no test
    assert paired_curves({0: {5: 1.0}, 1: {5: 1.0}}, {0: {10: 0.0}, 1: {10: 0.0}}) is None  # no shared step


def test_a_consistent_effect_over_many_seeds_is_found():
    arm = {s: {5: 0.5 + 0.01 * (s % 3), 10: 0.7} for s in range(16)}
    base = {s: {5: 0.4 + 0.01 * (s % 5), 10: 0.6} for s in range(16)}
    r = paired_curves(arm, base)
    assert r["auc"]["diff"] > 0 and r["auc"]["ci"][0] > 0 and r["auc"]["p"] < 0.001
    assert r["auc"]["seeds_for_80"] <= 16

"""The statistics: the sign-flip p-value of the worked example, Holm, bootstrap CIs, the U-statistic."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from trainers import stats


def test_sign_flip_p_of_the_worked_example():
    d = [0.1, 0.2, 0.3]
    # exact: of the 8 sign patterns only all-plus and all-minus reach |mean| >= 0.2 -> 2 / 8
    exact = np.mean([abs(np.dot(s, d)) / 3 >= 0.2 - 1e-12 for s in itertools.product([-1, 1], repeat=3)])
    assert exact == 0.25
    assert stats.sign_flip_p(d, reps=20000, seed=0) == pytest.approx(0.25, abs=0.01)
    assert stats.sign_flip_p([0.0, 0.0], reps=100, seed=0) == 1.0
    out = stats.paired([1.1, 1.2, 1.3], [1.0, 1.0, 1.0], reps=2000, perms=2000, level=0.95, seed=0)
    assert out["diff"] == pytest.approx(0.2) and out["dz"] == pytest.approx(2.0)


def test_a_clear_effect_is_detected_and_a_null_is_not():
    rng = np.random.default_rng(0)
    a = rng.normal(size=200)
    shifted = stats.paired(a + 0.3 + rng.normal(scale=0.5, size=200), a, reps=2000, perms=5000, level=0.95, seed=1)
    assert shifted["p"] < 0.001 and shifted["ci"][0] > 0.1
    null = stats.paired(a + rng.normal(scale=0.5, size=200), a, reps=2000, perms=5000, level=0.95, seed=1)
    assert null["p"] > 0.05 and null["ci"][0] < 0 < null["ci"][1]


def test_mean_ci_and_holm():
    ci = stats.mean_ci([1.0, 2.0, 3.0, 4.0], reps=5000, level=0.95, seed=0)
    assert ci["mean"] == 2.5 and 1.0 <= ci["ci"][0] < 2.5 < ci["ci"][1] <= 4.0
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.normal_p(1.959963984540054) == pytest.approx(0.05)


def test_u_statistic_and_its_jackknife_against_brute_force():
    rng = np.random.default_rng(2)
    e = rng.normal(size=(7, 5))
    gram = e @ e.T
    out = stats.sq_bias(gram, offset=0.1)
    pairs = [e[i] @ e[j] for i in range(7) for j in range(7) if i != j]
    assert out["value"] == pytest.approx(np.mean(pairs) - 0.1)
    loo = [np.mean([e[i] @ e[j] for i in range(7) for j in range(7) if i != j and k not in (i, j)]) - 0.1
           for k in range(7)]
    assert out["jackknife"] == pytest.approx(loo)
    # |mean e|^2 = U + tr(Cov) / n exactly (the noise floor the U-statistic leaves out)
    mean_sq = e.mean(0) @ e.mean(0)
    assert out["value"] + 0.1 + e.var(0, ddof=1).sum() / 7 == pytest.approx(mean_sq)

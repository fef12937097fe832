"""trainers/compare.py: an arm against a baseline over seeds (difference, Welch standard error, exact permutation
p-value), on hand-computed examples and its invariants."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.compare import MAX_EXACT, compare, min_p, permutation_p


def test_the_docstring_example():
    c = compare([0.72, 0.425, 0.77], [0.585, 0.52, 0.57])
    assert c["diff"] == pytest.approx(0.08)
    assert c["se"] == pytest.approx(math.sqrt(0.0347583333 / 3 + 0.0011583333 / 3))
    assert c["p"] == pytest.approx(10 / 20)
    assert c["n"] == [3, 3]


def test_three_seeds_cannot_reach_five_percent():
    """Fully separated arms of 3 seeds each: only the observed split and its mirror are as extreme, 2 of 20."""
    assert permutation_p([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(0.1)
    assert permutation_p([10.0, 11.0, 12.0, 13.0], [0.0, 1.0, 2.0, 3.0]) == pytest.approx(2 / 70) == min_p(4, 4)
    assert min_p(3, 3) == pytest.approx(0.1)
    assert permutation_p([5.0, 6.0], [0.0, 1.0, 2.0]) == pytest.approx(1 / 10) == min_p(2, 3)  # no mirror split


def test_few_seeds_and_empty_sides():
    one = compare([1.0], [0.0])
    assert one["diff"] == 1.0 and one["se"] is None and one["p"] == 1.0  # 2 splits, both as extreme
    assert compare([], [1.0]) is None and compare([1.0], []) is None
    assert compare([0.5, 0.7], [0.2])["se"] is None  # no variance estimate from one seed


def test_no_exact_p_for_large_pools():
    a, b = [float(i) for i in range(MAX_EXACT // 2 + 1)], [float(i) for i in range(MAX_EXACT // 2)]
    c = compare(a, b)
    assert c["p"] is None and c["se"] is not None


values = st.lists(st.floats(-1, 1, allow_nan=False).map(lambda x: round(x, 3)), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(values, values, st.floats(-5, 5, allow_nan=False).map(lambda x: round(x, 2)))
def test_invariants(a, b, shift):
    """p is in (0, 1], symmetric in the arms and unchanged by a common shift; the difference is antisymmetric."""
    p = permutation_p(a, b)
    assert 0 < p <= 1
    assert permutation_p(b, a) == pytest.approx(p)
    assert permutation_p([x + shift for x in a], [x + shift for x in b]) == pytest.approx(p)
    assert compare(a, b)["diff"] == pytest.approx(-compare(b, a)["diff"])

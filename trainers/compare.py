"""One arm of a study against a baseline arm, over seeds: is a difference more than seed noise?

For per-seed values a (the arm, n_a seeds) and b (the baseline, n_b seeds)::

    diff = mean(a) - mean(b)
    se   = sqrt(var(a) / n_a + var(b) / n_b)          (Welch; var: sample variance, n - 1)
    p    = #{splits S of a ∪ b into groups of n_a and n_b : |mean(S_a) - mean(S_b)| >= |diff|} / #splits

p is the exact two-sided permutation test: if the arm did nothing, its seeds would be as likely to be any n_a
of the pooled values. It assumes nothing about the distribution, and it shows how little few seeds can say:
with 3 seeds against 3 there are C(6, 3) = 20 splits, so the smallest possible p is 2/20 = 0.10.

Worked example: a = [0.72, 0.425, 0.77], b = [0.585, 0.52, 0.57]: diff = 0.6383 - 0.5583 = 0.0800,
se = sqrt(0.03476/3 + 0.00116/3) = 0.1094, and 10 of the 20 splits differ by at least 0.0800: p = 0.50.
"""
from __future__ import annotations

import itertools
import math
import statistics

#: pooled seeds up to which the permutation p-value is computed exactly (C(20, 10) = 184,756 splits)
MAX_EXACT = 20


def compare(arm: list[float], base: list[float]) -> dict | None:
    """``{"diff", "se", "p", "n": [n_arm, n_base]}`` for per-seed values; None when either side is empty.
    ``se`` needs two seeds on each side and ``p`` at most :data:`MAX_EXACT` pooled seeds (else None)."""
    a, b = [float(x) for x in arm], [float(x) for x in base]
    if not a or not b:
        return None
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = (math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
          if len(a) > 1 and len(b) > 1 else None)
    return {"diff": diff, "se": se, "p": permutation_p(a, b), "n": [len(a), len(b)]}


def min_p(n_a: int, n_b: int) -> float:
    """The smallest permutation p-value that n_a against n_b seeds can give: only the observed split (and, when
    the groups are the same size, its mirror) is as extreme. 3 against 3: 2/20 = 0.10; 4 against 4: 2/70."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def permutation_p(a: list[float], b: list[float]) -> float | None:
    """The exact two-sided permutation p-value of mean(a) - mean(b) (None above :data:`MAX_EXACT` values)."""
    pooled = a + b
    n, k = len(pooled), len(a)
    if n > MAX_EXACT or not a or not b:
        return None
    total = sum(pooled)
    observed = abs(sum(a) / k - sum(b) / (n - k))
    tol = 1e-12 * max(1.0, abs(observed))  # a split equal to the observed one counts, whatever the rounding
    hits = count = 0
    for idx in itertools.combinations(range(n), k):
        s = sum(pooled[i] for i in idx)
        hits += abs(s / k - (total - s) / (n - k)) >= observed - tol
        count += 1
    return hits / count

"""Statistics over seeds: bootstrap confidence intervals, paired sign-flip p-values, Holm's adjustment.

For per-seed values ``x_1..x_n`` (one arm) or paired differences ``d_s = a_s - b_s`` (two arms on the same seeds):

    CI        percentile bootstrap: resample the n seeds with replacement ``B`` times, take the (1 - level) / 2 and
              (1 + level) / 2 quantiles of the resampled mean
    p         two-sided sign-flip permutation test of mean(d) = 0: under the null each d_s is as likely -d_s, so
              p = (1 + #{flips e in {-1, 1}^n : |mean(e * d)| >= |mean(d)|}) / (1 + N) over N random flips
    dz        the paired effect size mean(d) / sd(d) (Cohen's d_z)
    Holm      p_(i) adjusted = max_{j <= i} min(1, (m - j + 1) p_(j)) over the m p-values of a family, ascending

The squared bias of a mean gradient is not a mean over seeds: it is estimated without the noise floor by a
U-statistic over pairs of seeds (:func:`sq_bias`), with a jackknife standard error, a normal CI and, for two arms
on the same seeds, the jackknife of the difference and its normal p-value.

Worked example: d = [0.1, 0.2, 0.3] -> mean 0.2, dz = 0.2 / 0.1 = 2; of the 8 sign patterns only the all-plus
and all-minus reach |mean| >= 0.2, so the exact p is 2 / 8 = 0.25 (the random-flip p approaches it).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def resample_weights(n: int, reps: int, seed: int) -> np.ndarray:
    """``[reps, n]`` bootstrap counts (each row sums to n): row r weights seed i by how often it was drawn."""
    idx = _rng(seed).integers(0, n, size=(reps, n))
    w = np.zeros((reps, n))
    np.add.at(w, (np.arange(reps)[:, None], idx), 1.0)
    return w


def percentile_ci(samples: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def mean_ci(x: Sequence[float], *, reps: int, level: float, seed: int) -> dict:
    """``{"mean", "ci": [lo, hi], "sd", "n"}`` of per-seed values."""
    a = np.asarray(x, dtype=np.float64)
    boot = resample_weights(len(a), reps, seed) @ a / len(a)
    return {"mean": float(a.mean()), "ci": list(percentile_ci(boot, level)), "sd": float(a.std(ddof=1)),
            "n": len(a)}


def sign_flip_p(d: Sequence[float], *, reps: int, seed: int) -> float:
    """Two-sided sign-flip permutation p-value of mean(d) = 0 (see the module docstring)."""
    a = np.asarray(d, dtype=np.float64)
    observed = abs(a.mean())
    if not np.isfinite(observed) or np.all(a == 0):
        return 1.0
    signs = _rng(seed).choice(np.array([-1.0, 1.0]), size=(reps, len(a)))
    flipped = np.abs(signs @ a) / len(a)
    hits = int(np.count_nonzero(flipped >= observed * (1 - 1e-12)))
    return (1 + hits) / (1 + reps)


def paired(a: Sequence[float], b: Sequence[float], *, reps: int, perms: int, level: float, seed: int) -> dict:
    """``a - b`` seed by seed: ``{"diff", "ci", "p", "dz", "n"}``."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    ci = mean_ci(d, reps=reps, level=level, seed=seed)
    sd = float(d.std(ddof=1))
    return {"diff": ci["mean"], "ci": ci["ci"], "p": sign_flip_p(d, reps=perms, seed=seed + 1),
            "dz": ci["mean"] / sd if sd > 0 else 0.0, "n": len(d)}


def sq_bias(gram: np.ndarray, offset: float = 0.0) -> dict:
    """Unbiased estimate of ``|E e|^2`` from per-seed error vectors ``e_1..e_n`` given as their Gram matrix
    ``G_ij = <e_i, e_j>``: the U-statistic ``U = sum_{i != j} G_ij / (n (n - 1)) - offset``, with its
    leave-one-out jackknife values (``n`` of them; ``U_-i = (S - 2 (sum_j G_ij - G_ii)) / ((n-1)(n-2)) - offset``,
    ``S`` the off-diagonal sum). ``|mean e|^2`` itself is biased up by ``tr(Cov e) / n``; U is not, and it can
    come out negative when the true value is near 0. Returns ``{"value", "jackknife"}``."""
    n = gram.shape[0]
    off = gram.sum() - np.trace(gram)
    loo = (off - 2 * (gram.sum(1) - np.diag(gram))) / ((n - 1) * (n - 2))
    return {"value": float(off / (n * (n - 1)) - offset), "jackknife": loo - offset}


def jackknife_ci(value: float, loo: np.ndarray, level: float) -> tuple[float, float, float]:
    """``(se, lo, hi)``: the jackknife standard error ``sqrt((n-1)/n * sum (U_-i - mean U_-)^2)`` and a normal
    interval ``value -+ z se`` at ``level``."""
    n = len(loo)
    se = float(np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2)))
    z = normal_quantile((1 + level) / 2)
    return se, value - z * se, value + z * se


def normal_quantile(q: float) -> float:
    """The standard normal quantile (``statistics.NormalDist``)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def normal_p(z: float) -> float:
    """Two-sided p-value of a z statistic: ``erfc(|z| / sqrt 2)``."""
    import math

    return math.erfc(abs(z) / math.sqrt(2))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = len(p)
    order = np.argsort(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()

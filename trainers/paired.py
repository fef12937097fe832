"""One arm against a baseline, paired by seed: the area under each run's held-out accuracy curve, the paired
difference with its bootstrap CI and sign-flip p-value, and how many seeds 80% power would need.

Seed s of every arm shares its data order and its first rollout, so the arms' runs of one seed are a pair and the
seed-to-seed spread cancels from their difference. For a run evaluated at steps t_0 < ... < t_m (the steps every
compared run has, with the untrained model as step 0 where the study evaluated it)::

    AUC        = sum_i (t_i - t_{i-1}) (acc_{i-1} + acc_i) / 2  /  (t_m - t_0)     (the curve's mean height;
                                                                                     one step: its accuracy)
    d_s        = AUC(arm, seed s) - AUC(baseline, seed s)
    diff, CI   = mean(d), percentile bootstrap over seeds;  p: two-sided sign-flip test  (``trainers.stats``)
    dz         = mean(d) / sd(d)
    n for 80%  = ceil(((z_{1-a/2} + z_{0.8}) / |dz|)^2 + z_{1-a/2}^2 / 2)          (a = 0.05; the normal
                                                                                     approximation of the paired
                                                                                     t-test with Guenther's term)

Worked example: a curve 0.2, 0.4, 0.8 at steps 0, 5, 10 has AUC (5 * 0.3 + 5 * 0.6) / 10 = 0.45. A paired effect
of dz = 0.5 needs ceil((2.8016 / 0.5)^2 + 1.9207) = ceil(33.32) = 34 seeds for 80% power (the exact t-test: 34).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from trainers import stats

#: bootstrap resamples and sign flips of the paired analysis; its CI level and the power calculation's alpha
REPS, LEVEL, ALPHA, POWER = 10_000, 0.95, 0.05, 0.80


def auc(curve: Mapping[int, float], steps: list[int]) -> float:
    """The mean height of ``curve`` (step -> accuracy) over ``steps`` by the trapezoid rule (see the docstring)."""
    if len(steps) == 1:
        return float(curve[steps[0]])
    area = sum((b - a) * (curve[a] + curve[b]) / 2 for a, b in itertools.pairwise(steps))
    return area / (steps[-1] - steps[0])


def seeds_for_power(dz: float, *, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Seeds a paired test at two-sided ``alpha`` needs to detect a paired effect ``dz`` with ``power`` (None for
    dz = 0: no number of seeds detects no effect; an infinite dz, no spread at all, gives the formula's floor)."""
    if math.isnan(dz) or dz == 0:
        return None
    za, zb = stats.normal_quantile(1 - alpha / 2), stats.normal_quantile(power)
    return math.ceil(((za + zb) / abs(dz)) ** 2 + za * za / 2)


def paired_curves(arm: Mapping[int, Mapping[int, float]], base: Mapping[int, Mapping[int, float]], *,
                  step0: tuple[float | None, float | None] = (None, None), seed: int = 0) -> dict | None:
    """``arm`` and ``base``: seed -> {step: held-out accuracy}; ``step0``: the untrained model's accuracy under
    each side's eval (None: not evaluated). Over the seeds both sides have and the steps every one of those runs
    was evaluated at: ``{"seeds", "steps", "auc": paired stats, "last": paired stats at the last step}``, each
    paired stats ``{"arm", "base", "diff", "ci", "p", "dz", "n", "seeds_for_80"}``; None below two shared seeds
    or with no shared step."""
    seeds = sorted(set(arm) & set(base))
    if len(seeds) < 2:
        return None
    steps = set.intersection(*(set(c) for s in seeds for c in (arm[s], base[s])))
    curves = {"arm": {s: dict(arm[s]) for s in seeds}, "base": {s: dict(base[s]) for s in seeds}}
    if step0[0] is not None and step0[1] is not None and steps:
        steps.add(0)
        for side, v in zip(("arm", "base"), step0):
            for s in seeds:
                curves[side][s].setdefault(0, v)
    steps = sorted(steps)
    if not steps:
        return None
    out = {"seeds": seeds, "steps": steps}
    for name, value in (("auc", lambda c: auc(c, steps)), ("last", lambda c: float(c[steps[-1]]))):
        a = [value(curves["arm"][s]) for s in seeds]
        b = [value(curves["base"][s]) for s in seeds]
        r = stats.paired(a, b, reps=REPS, perms=REPS, level=LEVEL, seed=seed)
        if r["dz"] == 0 and r["diff"] != 0:  # every seed moved by the same amount: no spread, an unbounded d_z
            r["dz"] = math.copysign(math.inf, r["diff"])
        out[name] = {"arm": sum(a) / len(a), "base": sum(b) / len(b), **r,
                     "seeds_for_80": seeds_for_power(r["dz"])}
    return out

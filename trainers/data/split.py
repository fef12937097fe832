"""The graded arithmetic problem space, split into a training part and a held-out part by a hash.

A problem is its level and its operands; ``a + b`` and ``b + a`` (likewise ``a * b``) are the same *pair*, so they
always fall on the same side. Within each level the pairs are ranked by ``sha256("<level>:<op>:<min>:<max>")`` and
the lowest ``round(share * pairs)`` are held out:

    level  problems                 pairs   held out (share)   held-out problems (a + b and b + a both)
    1      a + b, a, b in 1..9          45   11 (25%)           19 of 81
    2      a + b, a 10..49, b 1..9     360   90 (25%)           90 of 360
    3      a + b, a, b in 10..99      4095   205 (5%: the space is large)   409 of 8,100
    4      a * b, a, b in 2..9          36    9 (25%)           15 of 64

``is_heldout`` is what the trainer's generator rejects with ``data.arithmetic.exclude_heldout=true``
(``trainers.data.arithmetic_examples``), and ``heldout_rows`` is every held-out problem once, in level order: the
bundled ``arithmetic_heldout`` eval set (``eval/data/arithmetic_heldout``). Training and held-out problems are
therefore disjoint by construction, whatever the training seed and size.

Worked example: level 1 has 45 pairs; 11 are held out. Whether "3 + 5" is one of them is
``is_heldout(1, 3, "+", 5)``, and then "5 + 3" is too.
"""
from __future__ import annotations

import functools
import hashlib

#: operand ranges and operator of each level (the generator's ``_ARITH``)
LEVELS = {1: ((1, 9), "+", (1, 9)), 2: ((10, 49), "+", (1, 9)), 3: ((10, 99), "+", (10, 99)), 4: ((2, 9), "*", (2, 9))}
#: the share of each level's pairs held out
SHARE = {1: 0.25, 2: 0.25, 3: 0.05, 4: 0.25}


def pair_key(level: int, a: int, op: str, b: int) -> str:
    return f"{level}:{op}:{min(a, b)}:{max(a, b)}"


def problems(level: int) -> list[tuple[int, str, int]]:
    """Every problem ``(a, op, b)`` the generator can draw at ``level``, in (a, b) order."""
    (alo, ahi), op, (blo, bhi) = LEVELS[level]
    return [(a, op, b) for a in range(alo, ahi + 1) for b in range(blo, bhi + 1)]


@functools.cache
def heldout_pairs(level: int) -> frozenset[str]:
    pairs = sorted({pair_key(level, a, op, b) for a, op, b in problems(level)},
                   key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    return frozenset(pairs[:round(SHARE[level] * len(pairs))])


def is_heldout(level: int, a: int, op: str, b: int) -> bool:
    return pair_key(level, a, op, b) in heldout_pairs(level)


def heldout_rows() -> list[dict]:
    """Every held-out problem once, levels 1-4 in order, operands ascending: ``{"question", "answer", "level"}``."""
    rows = []
    for level in sorted(LEVELS):
        for a, op, b in problems(level):
            if is_heldout(level, a, op, b):
                rows.append({"question": f"What is {a} {op} {b}?", "answer": str(a + b if op == "+" else a * b),
                             "level": level})
    return rows

"""The held-out arithmetic set is disjoint from training by construction: the generator with
``data.arithmetic.exclude_heldout`` never draws a held-out problem, the bundled eval rows are exactly the held-out
part with every problem once, and without the switch the draws of earlier studies are unchanged."""
from __future__ import annotations

import hashlib
import itertools

import pytest

from eval.data import load_rows
from eval.task import get_task
from trainers.config import ArithmeticConfig, DataConfig, load_config
from trainers.data import arithmetic_examples, load_examples
from trainers.data.split import SHARE, heldout_pairs, heldout_rows, is_heldout, pair_key, problems


def _problem(question: str) -> tuple[int, str, int]:
    a, op, b = question[len("What is "):-1].split()
    return int(a), op, int(b)


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_the_generator_never_draws_a_heldout_problem(level):
    drawn = {_problem(e.question) for seed in (0, 1234) for e in arithmetic_examples(6000, (level,), seed, True)}
    assert not any(is_heldout(level, *p) for p in drawn)
    space = set(problems(level))
    everything = {_problem(e.question) for e in arithmetic_examples(6000, (level,), 0)}
    assert everything <= space  # the split covers the generator's whole space
    if len(space) <= 400:  # small levels: the draws reach every problem, and with the switch every kept one
        assert everything == space
        assert drawn == {p for p in space if not is_heldout(level, *p)}


def test_pairs_stay_together_and_the_shares_are_exact():
    for level in (1, 2, 3, 4):
        pairs = {pair_key(level, *p) for p in problems(level)}
        assert len(heldout_pairs(level)) == round(SHARE[level] * len(pairs))
        for a, op, b in problems(level):
            assert is_heldout(level, a, op, b) == is_heldout(level, b, op, a)


def test_the_bundled_eval_set_is_every_heldout_problem_once():
    rows = heldout_rows()
    for name in ("arithmetic_heldout", "arithmetic_cot_heldout"):
        assert load_rows(get_task(name)) == rows
    questions = [r["question"] for r in rows]
    assert len(questions) == len(set(questions)) == 533
    expected = {(lv, p) for lv in (1, 2, 3, 4) for p in problems(lv) if is_heldout(lv, *p)}
    assert {(r["level"], _problem(r["question"])) for r in rows} == expected
    for r in rows:
        a, op, b = _problem(r["question"])
        assert int(r["answer"]) == (a + b if op == "+" else a * b)
    train = load_examples(DataConfig(arithmetic=ArithmeticConfig(size=4000, levels=(1, 2, 3, 4),
                                                                 exclude_heldout=True)))
    assert not set(questions) & {e.question for e in train}
    # the old eval set, by contrast, is mostly training problems at levels 1-2
    old = {r["question"] for r in load_rows(get_task("arithmetic")) if r["level"] in (1, 2)}
    assert len(old & {e.question for e in arithmetic_examples(2000, (1, 2), 1234)}) > 100


def test_off_by_default_and_the_earlier_draws_unchanged():
    assert load_config([]).data.arithmetic.exclude_heldout is False
    assert load_config(["data.arithmetic.exclude_heldout=true"]).data.arithmetic.exclude_heldout is True
    questions = "\n".join(e.question for e in arithmetic_examples(2000, (1, 2, 3, 4), 1234))
    # sha256 of the same draws before the switch existed (the generator at commit 3176de0)
    assert hashlib.sha256(questions.encode()).hexdigest() == (
        "d1d06a5c9cb019424fef94c1a3e9c5996e6dc9314e24b93a2226ea96d955a9ac")
    some_heldout = [e for e in itertools.islice(arithmetic_examples(400, (1,), 0), 400)
                    if is_heldout(1, *_problem(e.question))]
    assert some_heldout  # without the switch, held-out problems are drawn

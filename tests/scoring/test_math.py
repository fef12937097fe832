"""Answer extraction and math scoring shared by the rewards and the eval tasks."""
from __future__ import annotations

import concurrent.futures
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.math import (
    extract_boxed,
    extract_gsm8k,
    final_answer_segment,
    score_gsm8k,
    score_math,
    to_number,
)


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{5}", "5"),
    (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # the last box wins
    (r"\boxed{\left(3, \frac{\pi}{2}\right)}.", r"\left(3, \frac{\pi}{2}\right)"),  # nested braces kept
    (r"\fbox{42}", "42"),
    (r"\boxed 7$", "7"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not count
    ("no box here", None),
    (r"truncated \boxed{\frac{1}{", None),  # unclosed last box
    ("", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("She pays 3 + 4 = 7\n#### 1,234", "1234"),
    ("#### -5.5 dollars", "-5.5"),
    ("The total is $1,000,000 and 12 more", "12"),  # last number
    ("It costs 1,234 dollars.", "1234"),
    ("no digits", None),
    ("#### ", None),
    ("I think 5.\n#### eighteen", None),  # "####" decides; nothing numeric after it
])
def test_extract_gsm8k(text, expected):
    assert extract_gsm8k(text) == expected


@pytest.mark.parametrize("value, expected", [
    ("025", Fraction(25)), (27.0, Fraction(27)), ("1,234", Fraction(1234)), ("-3/4", Fraction(-3, 4)),
    (r"\$18.90", Fraction(189, 10)), (r"\frac{14}{3}", Fraction(14, 3)), ("x+1", None), (None, None),
    (float("nan"), None), (True, None),
])
def test_to_number(value, expected):
    assert to_number(value) == expected


def test_final_answer_segment_skips_thinking():
    assert final_answer_segment(r"<think>\boxed{1}</think> so \boxed{2}") == r" so \boxed{2}"
    assert extract_boxed(final_answer_segment(r"<think>\boxed{1}</think> no answer")) is None


@pytest.mark.parametrize("response, gold, expected", [
    (r"so \boxed{\frac{2}{4}}", r"\frac12", 1.0),  # math-verify: equivalent fraction
    (r"so \boxed{0.5}", r"\frac12", 1.0),
    ("so x = 1/2", r"\frac12", 1.0),  # no box: math-verify's own extraction
    (r"\boxed{1/3}", r"\frac12", 0.0),
    (r"\boxed{x^2+1}", "1+x^2", 1.0),
    (r"\boxed{25}", "025", 1.0),  # AIME gold string
    (r"\boxed{027}", 27.0, 1.0),  # AMC gold float
    (r"\boxed{26}", "025", 0.0),
    (r"<think>\boxed{25}</think>the answer is \boxed{24}", "025", 0.0),  # only the text after </think>
    ("", "5", 0.0),
    ("I do not know.", "5", 0.0),  # nothing extractable scores 0
])
def test_score_math(response, gold, expected):
    assert score_math(response, gold) == expected


def test_score_math_dressed_gold_numbers():
    # MATH-500 golds such as "\$18.90" and "32,\!348" are numbers math-verify cannot parse as written.
    assert score_math(r"\boxed{18.9}", r"\$18.90") == 1.0
    assert score_math(r"\boxed{32348}", r"32,\!348") == 1.0
    assert score_math(r"\boxed{\text{nope}}", r"\$18.90") == 0.0


def test_score_math_no_timeout_inline():
    assert score_math(r"\boxed{\sqrt{4}}", "2", timeout=None) == 1.0


def test_score_math_off_main_thread_matches_main_thread():
    cases = [(r"\boxed{\frac{2}{4}}", r"\frac12"), (r"\boxed{x^2+2}", "1+x^2"), (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),
             (r"\boxed{25}", "025")]
    main = [score_math(r, g) for r, g in cases]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(lambda c: score_math(*c), cases))
    assert main == [1.0, 0.0, 1.0, 1.0]
    assert threaded == main


@pytest.mark.parametrize("response, gold, expected", [
    ("3 + 4 = 7\n#### 7", "Janet ... #### 7", 1.0),
    ("The answer is \\boxed{1,234}.", "1234", 1.0),
    ("He makes $18 a day.", "18", 1.0),  # last number
    (r"\boxed{18 \text{ dollars}}", "18", 1.0),  # not a plain number: math-verify fallback
    ("\\boxed{17} but later 18", "18", 0.0),  # the box wins over the last number
    ("no number at all", "18", 0.0),
    ("", "18", 0.0),
])
def test_score_gsm8k(response, gold, expected):
    assert score_gsm8k(response, gold) == expected


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=999), st.integers(min_value=1, max_value=999))
def test_integer_answers_property(n, delta):
    # AIME-style gold strings are zero padded; any other integer is wrong.
    gold = f"{n:03d}"
    assert score_math(f"The answer is \\boxed{{{n}}}.", gold) == 1.0
    assert score_math(f"The answer is \\boxed{{{n + delta}}}.", gold) == 0.0
    assert score_gsm8k(f"#### {n:,}", str(n)) == 1.0


def test_a_huge_response_is_scored_on_its_end_and_logs_little(caplog):
    import logging

    from scoring.math import score_math

    huge = "x = y + z, " * 500_000 + r"so the answer is \boxed{x^2 + 1}"  # ~5.5 MB; a symbolic answer, so
    with caplog.at_level(logging.DEBUG):                                   # math-verify (not the number path) runs
        assert score_math(huge, "x^2+1") == 1.0
        assert score_math(huge, "x^2+2") == 0.0
    assert sum(len(r.getMessage()) for r in caplog.records) < 100_000

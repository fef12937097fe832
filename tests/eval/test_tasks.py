"""Every math task scores its own gold answers 100% and known wrong answers 0%, on all rows."""
from __future__ import annotations

import pytest

from eval.data import load_rows
from eval.task import get_task, parse_task_list, task_names
from scoring.math import to_number

MATH_TASKS = ["aime24", "aime25", "amc23", "math500", "gsm8k"]
ROWS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "gsm8k": 1319, "ifeval": 541,
        "arithmetic": 400, "arithmetic_cot": 400, "arithmetic_heldout": 533, "arithmetic_cot_heldout": 533}


def test_registry_lists_every_task():
    assert sorted(task_names()) == sorted(ROWS)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_bundled_data_row_counts(name):
    task = get_task(name)
    assert len(task.examples(load_rows(task))) == ROWS[name]


@pytest.mark.parametrize("name", MATH_TASKS)
def test_gold_answers_score_100_percent(name):
    task = get_task(name)
    exs = task.examples(load_rows(task))
    scores = [task.score(f"Let me think.\nThe final answer is $\\boxed{{{e.gold}}}$.", e) for e in exs]
    assert [e.index for e, s in zip(exs, scores) if s.correct != 1.0] == []
    assert task.aggregate(scores) == {"accuracy": 1.0}


@pytest.mark.parametrize("name", MATH_TASKS)
def test_wrong_answers_score_zero(name):
    task = get_task(name)
    exs = task.examples(load_rows(task))

    def wrong(gold: str) -> str:
        value = to_number(gold)
        if value is not None and value.denominator == 1:
            return str(value.numerator + 1)
        return r"\text{no answer}"

    scores = [task.score(f"The final answer is $\\boxed{{{wrong(e.gold)}}}$.", e) for e in exs]
    assert [e.index for e, s in zip(exs, scores) if s.correct != 0.0] == []
    assert task.aggregate(scores) == {"accuracy": 0.0}


def test_math500_cross_row_answers_are_wrong():
    # Real other answers, not placeholders: each row scored with the next row's gold. Pairs where one gold
    # contains the other ("5" and "x=5", which math-verify rightly equates) are skipped.
    task = get_task("math500")
    exs = task.examples(load_rows(task))[:41]
    pairs = [(exs[i], exs[i + 1].gold) for i in range(40)
             if exs[i].gold not in exs[i + 1].gold and exs[i + 1].gold not in exs[i].gold]
    assert len(pairs) >= 35
    assert [e.index for e, g in pairs if task.score(f"\\boxed{{{g}}}", e).correct != 0.0] == []


def test_integer_golds_are_normalised():
    aime24 = get_task("aime24").examples(load_rows(get_task("aime24")))
    amc23 = get_task("amc23").examples(load_rows(get_task("amc23")))
    assert load_rows(get_task("aime24"))[7]["answer"] == "025" and aime24[7].gold == "25"
    assert amc23[0].gold == "27"  # stored as 27.0
    assert get_task("aime24").extract(r"\boxed{025}") == "25"


def test_prompts_use_one_template():
    aime25 = get_task("aime25").examples(load_rows(get_task("aime25")))[0]
    assert aime25.prompt.count("Please reason step by step") == 1  # the suffix stored in the data is not doubled
    gsm = get_task("gsm8k").examples(load_rows(get_task("gsm8k")))[0]
    assert gsm.prompt.startswith(gsm.question) and gsm.prompt.endswith("within \\boxed{}.")
    assert gsm.gold == "18"


def test_gsm8k_extraction_falls_back_to_hashes_and_last_number():
    task = get_task("gsm8k")
    ex = task.examples(load_rows(task))[0]
    assert task.score("9 eggs * $2 = $18\n#### 18", ex).correct == 1.0
    assert task.score("So she makes 18 dollars.", ex).extracted == "18"


def test_no_extractable_answer_scores_zero_and_is_counted():
    task = get_task("math500")
    exs = task.examples(load_rows(task))[:2]
    scores = [task.score(f"\\boxed{{{exs[0].gold}}}", exs[0]), task.score("I give up.", exs[1])]
    assert scores[1].correct == 0.0 and scores[1].extracted is None
    assert task.aggregate(scores) == {"accuracy": 0.5}  # 1 of 2, not 1 of 1


def test_unknown_task_lists_valid_ones_and_closest():
    with pytest.raises(ValueError, match=r"unknown task 'aime2024'.*did you mean 'aime24'.*valid tasks: .*ifeval"):
        get_task("aime2024")
    with pytest.raises(ValueError, match="listed twice"):
        parse_task_list("gsm8k,gsm8k")
    assert [t.name for t in parse_task_list(" GSM8K , ifeval")] == ["gsm8k", "ifeval"]


def test_arithmetic_scores_per_level_and_shares_rows_with_the_cot_variant():
    from eval.task import SampleScore

    plain, cot = get_task("arithmetic"), get_task("arithmetic_cot")
    rows = load_rows(plain)
    assert rows == load_rows(cot)  # one data file, two prompts
    a, c = plain.examples(rows)[0], cot.examples(rows)[0]
    assert a.prompt == f"{a.question}\nGive the result as a number."
    assert c.prompt == f"{a.question}\nThink step by step, then give the result as a number."
    assert [sum(r["level"] == k for r in rows) for k in (1, 2, 3, 4)] == [100, 100, 100, 100]
    exs = plain.examples(rows)
    assert plain.score(f"so the answer is {exs[0].gold}", exs[0]).correct == 1.0
    assert plain.score(f"{int(exs[0].gold) + 1}", exs[0]).correct == 0.0
    # one right at level 1, one wrong at level 2: overall 1/2, per level 1 and 0, absent levels 0
    scores = [SampleScore(1.0, "x", {"level": 1}), SampleScore(0.0, "y", {"level": 2})]
    assert plain.aggregate(scores) == {"accuracy": 0.5, "accuracy_L1": 1.0, "accuracy_L2": 0.0,
                                       "accuracy_L3": 0.0, "accuracy_L4": 0.0}

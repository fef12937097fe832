"""Training data: seeded arithmetic, the packaged GSM8K train split, deterministic prompt schedule."""
from __future__ import annotations

import pytest

from trainers.config import DataConfig
from trainers.data import (
    GSM8K_TRAIN,
    DatasetError,
    PromptSchedule,
    arithmetic_examples,
    gsm8k_gold,
    load_examples,
    render_prompt,
)


def test_arithmetic_is_seeded_and_graded():
    a = arithmetic_examples(8, (1, 3, 4), seed=5)
    assert a == arithmetic_examples(8, (1, 3, 4), seed=5)
    assert [e.extra["level"] for e in a[:3]] == [1, 3, 4]
    for e in a:
        x, op, y = e.question[len("What is "):-1].split()
        assert int(e.answer) == (int(x) + int(y) if op == "+" else int(x) * int(y))


def test_packaged_gsm8k():
    assert (GSM8K_TRAIN.parent / "LICENSE").is_file() and (GSM8K_TRAIN.parent / "SOURCE.md").is_file()
    ex = load_examples(DataConfig(task="gsm8k"))
    assert len(ex) == 7473 and ex[0].answer == "72" and ex[0].data_source == "openai/gsm8k"
    assert gsm8k_gold("so ... #### 1,000") == "1000"
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_gold("no marker")


def test_jsonl_needs_path():
    with pytest.raises(DatasetError, match="needs data.path"):
        load_examples(DataConfig(task="jsonl"))


def test_schedule_depends_only_on_seed_and_step():
    ex = arithmetic_examples(10, (1,), seed=0)
    s1, s2 = PromptSchedule(ex, 4, seed=3), PromptSchedule(ex, 4, seed=3)
    assert [e.index for e in s1.batch(7)] == [e.index for e in s2.batch(7)]
    # one epoch = 10 examples: steps 0..1 plus half of step 2 cover each example exactly once
    first_epoch = [e.index for st in range(2) for e in s1.batch(st)] + [e.index for e in s1.batch(2)][:2]
    assert sorted(first_epoch) == list(range(10))


def test_render_prompt_uses_chat_template(tiny_model):
    _, tok = tiny_model
    ex = arithmetic_examples(1, (1,), seed=0)[0]
    ids = render_prompt(tok, ex, DataConfig(instruction="Answer with a number."))
    text = tok.decode(ids)
    assert ex.question in text and "Answer with a number." in text and text.rstrip().endswith("assistant")


@pytest.mark.parametrize("answer", ["null", '""', "true", "[1]", '{"a": 1}'])
def test_an_answer_that_is_not_text_or_a_number_is_refused(tmp_path, answer):
    from trainers.data import DatasetError, read_jsonl

    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": ' + answer + "}\n")
    with pytest.raises(DatasetError, match=rf"{p}:2: field 'answer' must be a non-empty string or a number"):
        read_jsonl(p, "question", "answer")
    p.write_text('{"question": "2+2?", "answer": 4}\n')
    assert read_jsonl(p, "question", "answer")[0].answer == "4"


def test_unreadable_files_and_lines_name_the_file_and_line(tmp_path):
    from trainers.data import DatasetError, read_jsonl

    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"question": "1+1?", "answer": "2"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DatasetError, match=rf"{bad}:2: not UTF-8 text \(byte 0xe9 at column 18\)"):
        read_jsonl(bad, "question", "answer")
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DatasetError, match=rf"{deep}:1: (JSON nested too deeply|not valid JSON)"):
        read_jsonl(deep, "question", "answer")

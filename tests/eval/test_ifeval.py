"""IFEval with the official checkers, offline: strict vs loose, aggregation, NLTK and langdetect setup."""
from __future__ import annotations

import sys
import types

import pytest

import eval.ifeval_checkers as checkers
from eval.data import load_rows
from eval.task import get_task
from eval.tasks.ifeval import check_instructions, loose_variants

END = "Is there anything else I can help with?"


@pytest.mark.parametrize("response, iid, kwargs, strict, loose", [
    ("Hello world", "punctuation:no_comma", {}, True, True),
    ("Hello, world", "punctuation:no_comma", {}, False, False),
    # a chatty first line breaks strict; loose drops the first line
    ("Sure, here it is:\nTHIS ANSWER IS WRITTEN ENTIRELY IN CAPITAL LETTERS FOR THE TEST.",
     "change_case:english_capital", {}, False, True),
    ("THIS ANSWER IS WRITTEN ENTIRELY IN CAPITAL LETTERS FOR THE TEST.", "change_case:english_capital", {}, True, True),
    # markdown bold around the end phrase breaks strict; loose removes the asterisks
    (f"Done. **{END}**", "startend:end_checker", {"end_phrase": END}, False, True),
    ('```json\n{"a": 1}\n```', "detectable_format:json_format", {}, True, True),
    ("One. Two.", "length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3}, True, True),
    ("Bonjour, je suis très content de vous voir aujourd'hui mes amis.", "language:response_language",
     {"language": "fr"}, True, True),
])
def test_official_checkers_strict_and_loose(response, iid, kwargs, strict, loose):
    assert check_instructions(response, [iid], [kwargs], "prompt") == ([strict], [loose])


def test_loose_variants_are_the_official_eight():
    v = loose_variants("a\n*b*\nc")
    assert len(v) == 8
    assert v[:4] == ["a\n*b*\nc", "*b*\nc", "a\n*b*", "*b*"] and v[7] == "b"


def test_thinking_is_stripped_and_unclosed_thinking_fails():
    ids, kw = ["punctuation:no_comma", "change_case:english_lowercase"], [{}, {}]
    assert check_instructions("<think>Hmm, Let me think</think>all lowercase without commas", ids, kw, "p") == \
        ([True, True], [True, True])
    assert check_instructions("<think>never closed", ids, kw, "p") == ([False, False], [False, False])


def test_untrained_punkt_deviation_is_recorded():
    status = checkers.punkt_status()
    if status["nltk_punkt"] == "trained":
        pytest.skip("real punkt_tab data installed here; the offline deviation does not apply")
    assert "untrained" in status["nltk_punkt"] and "number_sentences" in status["deviation"]
    # Without the abbreviation list "Dr." ends a sentence: 3 sentences instead of 2 (the documented effect).
    assert check_instructions("Dr. Smith went home. He slept.", ["length_constraints:number_sentences"],
                              [{"relation": "less than", "num_sentences": 3}], "p") == ([False], [False])


def test_aggregate_prompt_and_instruction_level():
    task = get_task("ifeval")
    rows = [
        {"key": 1, "prompt": "p1", "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
         "kwargs": [{}, {}]},
        {"key": 2, "prompt": "p2", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
        {"key": 3, "prompt": "p3", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    ]
    exs = task.examples(rows)
    scores = [task.score("this is a simple answer, written in plain lowercase english words", exs[0]),  # , fails
              task.score("No commas here", exs[1]),  # passes
              task.score("", exs[2])]  # empty: its instruction still counts, as failed
    m = task.aggregate(scores)
    # prompt level: 1 of 3 prompts; instruction level: 2 of 4 instructions
    assert m["prompt_level_strict"] == pytest.approx(1 / 3)
    assert m["instruction_level_strict"] == pytest.approx(2 / 4)
    assert m["prompt_level_loose"] == pytest.approx(1 / 3)


def test_every_bundled_instruction_builds():
    task = get_task("ifeval")
    exs = task.examples(load_rows(task))
    assert sum(len(e.gold["instruction_id_list"]) for e in exs) == 834
    registry, backend = checkers.instruction_registry()
    assert backend == ("if-verifiable" if sys.version_info >= (3, 11) else "lm-eval")
    assert {i for e in exs for i in e.gold["instruction_id_list"]} <= set(registry)
    for e in exs[:60]:  # building and checking a response for a slice keeps this fast
        strict, loose = check_instructions("A short reply.", e.gold["instruction_id_list"], e.gold["kwargs"], e.question)
        assert len(strict) == len(loose) == len(e.gold["instruction_id_list"])


def test_lm_eval_fallback_registry(monkeypatch):
    """Python 3.10 path: the same checker registry imported from lm-eval (simulated module layout)."""
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    monkeypatch.setattr(checkers, "_STATE", {})
    monkeypatch.setitem(sys.modules, "if_verifiable.ifeval.instructions_registry", None)  # import fails
    for name in ("lm_eval", "lm_eval.tasks", "lm_eval.tasks.ifeval"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    fake = types.ModuleType("lm_eval.tasks.ifeval.instructions_registry")
    fake.INSTRUCTION_DICT = INSTRUCTION_DICT
    monkeypatch.setitem(sys.modules, "lm_eval.tasks.ifeval.instructions_registry", fake)
    registry, backend = checkers.instruction_registry()
    assert backend == "lm-eval" and registry["punctuation:no_comma"] is INSTRUCTION_DICT["punctuation:no_comma"]


def test_missing_checkers_message(monkeypatch):
    monkeypatch.setattr(checkers, "_STATE", {})
    monkeypatch.setitem(sys.modules, "if_verifiable.ifeval.instructions_registry", None)
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=r"IFEval needs the official checkers: pip install"):
        checkers.instruction_registry()


def test_empty_punkt_files_written(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITE_CACHE", str(tmp_path))
    checkers._write_empty_punkt(checkers._cache_dir())
    english = tmp_path / "nltk_data_untrained_punkt" / "tokenizers" / "punkt_tab" / "english"
    assert sorted(p.name for p in english.iterdir()) == sorted(checkers.PUNKT_FILES)
    assert all(p.stat().st_size == 0 for p in english.iterdir())


def test_matches_if_verifiable_reference_loop():
    """Our strict/loose loop agrees with if-verifiable's own evaluate_output_for_sample on non-empty responses."""
    if_verifiable = pytest.importorskip("if_verifiable")
    task = get_task("ifeval")
    # key 1122's letter_frequency has letter "#": the official checker then picks a random letter (see the
    # module docstring), so the two loops legitimately differ there; it is checked separately below.
    rows = [r for r in load_rows(task)[:40] if r["key"] != 1122]
    responses = ["Hello world. This is a short reply", "*HELLO*\nTHIS IS ALL CAPS\nP.S. bye", '```json\n{"a": 1}\n```']
    for row in rows:
        for response in responses:
            ours = check_instructions(response, row["instruction_id_list"], row["kwargs"], row["prompt"])
            results, _ = if_verifiable.evaluate_output_for_sample("ifeval", if_verifiable.IFEvalSample(**row), response)
            assert ours == ([r.strict_pass for r in results], [r.loose_pass for r in results]), (row["key"], response)


def test_random_checker_arguments_are_deterministic():
    import random

    random.seed(123)
    before = random.random()
    random.seed(123)
    row = next(r for r in load_rows(get_task("ifeval")) if r["key"] == 1122)
    first = [check_instructions(f"{c * 5} #a #b #c #d", row["instruction_id_list"], row["kwargs"], row["prompt"])
             for c in "abcdefghijklmnopqrstuvwxyz"]
    assert random.random() == before  # the caller's random state is untouched
    for _ in range(3):
        again = [check_instructions(f"{c * 5} #a #b #c #d", row["instruction_id_list"], row["kwargs"], row["prompt"])
                 for c in "abcdefghijklmnopqrstuvwxyz"]
        assert again == first

"""Data sources: bundled default, --data-dir, jsonl files and Hugging Face ids (mocked: no downloads)."""
from __future__ import annotations

import json
import sys
import types

import pytest

from eval.data import bundled_path, load_rows, read_jsonl, resolve_source
from eval.task import get_task


def test_bundled_copies_carry_source_and_license():
    for name in ("aime24", "aime25", "amc23", "math500", "gsm8k", "ifeval"):
        folder = bundled_path(get_task(name)).parent
        assert (folder / "SOURCE.md").stat().st_size > 0 and (folder / "LICENSE").stat().st_size > 0


def test_data_dir_layouts(tmp_path):
    task = get_task("gsm8k")
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    assert load_rows(task, data_dir=str(tmp_path)) == [{"question": "1+1?", "answer": "#### 2"}]
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "gsm8k.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    assert task.examples(load_rows(task, data_dir=str(flat)))[0].gold == "4"
    assert resolve_source(task, str(flat)).endswith("gsm8k.jsonl")


def test_missing_data_file_names_the_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no data file for task 'aime24'.*aime24/test.jsonl.*aime24.jsonl"):
        load_rows(get_task("aime24"), data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither a file nor a Hugging Face id"):
        load_rows(get_task("aime24"), dataset="missing.jsonl")


def test_bad_jsonl_reports_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ValueError, match=r"x.jsonl:3: not valid JSON"):
        read_jsonl(p)
    p.write_text('{"problem": "1+1"}\n')
    with pytest.raises(ValueError, match=r"math500: row 0 of the data is malformed"):
        get_task("math500").examples(read_jsonl(p))


def test_hub_ids_go_through_datasets_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, config=None, split=None):
        calls.append((path, config, split))
        return [{"question": "What is 3+4?", "answer": "Add them.\n#### 7"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    rows = load_rows(get_task("gsm8k"), dataset="hf:openai/gsm8k")
    assert calls == [("openai/gsm8k", "main", "test")]  # the task's config and split
    assert get_task("gsm8k").examples(rows)[0].gold == "7"
    load_rows(get_task("math500"), dataset="someone/math:validation")
    assert calls[-1] == ("someone/math", None, "validation")

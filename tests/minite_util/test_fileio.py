"""Atomic writes: the target is either the old file or the whole new one, never a part; no temp file stays."""
from __future__ import annotations

import json
import os

import pytest

from minite_util.fileio import atomic_path, atomic_write_json, atomic_write_text, current_umask


def test_text_and_json_replace_the_target_whole(tmp_path):
    p = tmp_path / "sub" / "a.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two" and os.listdir(p.parent) == ["a.txt"]
    j = tmp_path / "r.json"
    atomic_write_json(j, {"b": 1, "a": "é"}, sort_keys=True)
    assert j.read_text(encoding="utf-8") == '{\n  "a": "é",\n  "b": 1\n}\n'
    assert json.loads(j.read_text(encoding="utf-8")) == {"a": "é", "b": 1}


def test_an_error_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError, match="writer died"), atomic_path(p) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_permissions_follow_the_umask_or_the_given_mode(tmp_path):
    p = tmp_path / "a.txt"
    atomic_write_text(p, "x")
    assert p.stat().st_mode & 0o777 == 0o666 & ~current_umask()
    atomic_write_text(p, "y", mode=0o640)
    assert p.stat().st_mode & 0o777 == 0o640

"""``trainers/provenance.py``: the digest of the sources a run ran, kept per execution in ``code.json``, and the
study table's account of which code its runs came from."""
from __future__ import annotations

import hashlib
import json

from trainers.provenance import code_digest, read_code, record_code, source_files
from trainers.study.results import code_versions
from trainers.study.tables import code_line


def _tree(root, body: str = "x = 1\n"):
    (root / "trainers").mkdir(parents=True, exist_ok=True)
    (root / "trainers" / "a.py").write_text(body)
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "t.py").write_text("ignored = True\n")  # not a source: tests do not enter the digest
    (root / "trainers" / "__pycache__").mkdir(exist_ok=True)
    (root / "trainers" / "__pycache__" / "a.py").write_text("cached\n")
    return root


def test_the_digest_is_the_docstrings_worked_example(tmp_path):
    root = _tree(tmp_path)
    assert [p.relative_to(root).as_posix() for p in source_files(root)] == ["trainers/a.py"]
    assert code_digest(root) == hashlib.sha256(b"trainers/a.py\0x = 1\n\0").hexdigest()[:16]
    (root / "trainers" / "a.py").write_text("x = 2\n")
    assert code_digest(root) != hashlib.sha256(b"trainers/a.py\0x = 1\n\0").hexdigest()[:16]


def test_a_run_records_a_new_entry_only_when_its_code_changes(tmp_path):
    root, run = _tree(tmp_path / "repo"), tmp_path / "run"
    run.mkdir()
    first = record_code(run, 0, root)
    assert [e["from_step"] for e in first] == [0] and "commit" not in first[0]  # no git checkout here
    assert record_code(run, 5, root) == first  # resumed on the same code: nothing new
    (root / "trainers" / "a.py").write_text("x = 2\n")
    entries = record_code(run, 10, root)
    assert [e["from_step"] for e in entries] == [0, 10] and entries[0]["digest"] != entries[1]["digest"]
    assert read_code(run) == entries
    # a resume from step 5 drops the execution that started at 10 (its steps are gone), then records this one
    (root / "trainers" / "a.py").write_text("x = 1\n")
    assert [e["from_step"] for e in record_code(run, 5, root)] == [0]
    assert read_code(tmp_path / "nothing") == []


def test_the_project_digest_covers_its_packages_and_a_checkout_adds_its_commit():
    from trainers.provenance import ROOT, git_state

    names = {p.relative_to(ROOT).parts[0] for p in source_files()}
    assert {"trainers", "minite_kernels", "triage", "rollout", "recipes"} <= names and "tests" not in names
    state = git_state()
    assert state is None or (len(state["commit"]) == 40 and isinstance(state["dirty"], bool))


def test_the_table_says_which_code_the_runs_ran():
    run = {"steps": 30}
    runs = [{**run, "recipe": "bf16", "seed": 0, "code": ["aaaa"]}, {**run, "recipe": "bf16", "seed": 1, "code": []},
            {**run, "recipe": "nv", "seed": 0, "code": ["aaaa", "bbbb"]},
            {**run, "recipe": "nv", "seed": 1, "code": ["cccc", "cccc"]},
            {"steps": 0, "recipe": "nv", "seed": 2, "code": []}]  # not run yet: left out
    code = code_versions(runs)
    assert code == {"versions": {"aaaa": ["bf16/seed0"], "cccc": ["nv/seed1"]}, "mixed": ["nv/seed0"],
                    "unrecorded": ["bf16/seed1"]}
    line = code_line(code)
    assert "the runs ran more than one version of the code; compare them knowing it." in line
    assert "`aaaa`: bf16/seed0" in line and "several versions within the run: nv/seed0" in line
    assert "not recorded (run before the trainer recorded it): bf16/seed1" in line
    one = code_line(code_versions([{**run, "recipe": "bf16", "seed": s, "code": ["aaaa"]} for s in (0, 1)]))
    assert one == "\nCode (`trainers/provenance.py`): every run ran `aaaa`."
    old = code_line(code_versions([{**run, "recipe": "bf16", "seed": 0, "code": []}]))
    assert old == ("\nCode (`trainers/provenance.py`): not every run recorded its code, so one version is not "
                   "known. not recorded (run before the trainer recorded it): bf16/seed0.")
    json.dumps(code)  # it goes into summary.json

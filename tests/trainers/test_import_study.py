"""scripts/import_study.py records a study archive: the kept files only, never a shorter run over a longer one."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
import tarfile

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "import_study.py"


def _load():
    spec = importlib.util.spec_from_file_location("import_study_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["import_study_script"] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(root: pathlib.Path, arm: str, steps: int, reward: float) -> pathlib.Path:
    run = root / arm / "seed0"
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "model.safetensors").write_bytes(b"weights")
    (run / "run_meta.json").write_text("{}")
    (run / "config.yaml").write_text(f"arm: {arm}\n")
    rows = [{"step": s, "critic/rewards/mean": reward} for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for top in ("eval", "eval@bf16"):  # the run's own eval and its eval.precision one
        ev = run / top / f"step_{steps:06d}"
        ev.mkdir(parents=True)
        (ev / "results.json").write_text(json.dumps({"accuracy": reward}))
        (ev / "results.md").write_text("table\n")
        (ev / "samples.jsonl").write_text("{}\n")
    return run


def test_import_keeps_longer_records_and_drops_checkpoints(tmp_path, capsys):
    mod = _load()
    src = tmp_path / "study_smoke"
    _run(src, "bf16", 3, 0.5)
    _run(src, "triage_bf16", 1, 0.1)
    (src / "study.json").write_text('{"name": "smoke"}')
    with tarfile.open(tmp_path / "study.tgz", "w:gz") as tar:
        tar.add(src, arcname="study_smoke")
    dest = tmp_path / "recorded"
    _run(dest, "triage_bf16", 3, 0.9)  # the record is longer than the archive's rerun

    assert mod.main([str(tmp_path / "study.tgz"), "smoke", "--dest", str(dest)]) == 0
    said = capsys.readouterr().out
    assert "bf16/seed0: 3 steps (new)" in said
    assert "triage_bf16/seed0: kept the record (3 steps; the archive has 1)" in said
    new = dest / "bf16" / "seed0"
    assert sorted(p.name for p in new.iterdir()) == ["config.yaml", "eval", "eval@bf16", "metrics.jsonl"]
    for top in ("eval", "eval@bf16"):
        assert sorted(p.name for p in (new / top / "step_000003").iterdir()) == ["results.json", "results.md"]
    kept = [json.loads(x) for x in (dest / "triage_bf16" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert len(kept) == 3 and kept[-1]["critic/rewards/mean"] == 0.9
    summary = json.loads((dest / "summary.json").read_text())
    assert {(r["recipe"], r["steps"]) for r in summary["runs"]} == {("bf16", 3), ("triage_bf16", 3)}
    assert (dest / "table.md").read_text().startswith("# Study `smoke`")
    assert json.loads((dest / "study.json").read_text()) == {"name": "smoke"}


def test_unknown_study_names_the_choices(tmp_path, capsys):
    mod = _load()
    with pytest.raises(SystemExit) as e:
        mod.main([str(tmp_path / "none.tgz"), "nosuch"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no study 'nosuch'; choose one of" in err and "arithmetic" in err

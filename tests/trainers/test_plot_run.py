"""scripts/plot_run.py draws the Figure-2 panels from metrics.jsonl and overlays runs."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "plot_run.py"


def _load():
    spec = importlib.util.spec_from_file_location("plot_run_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(d: pathlib.Path, recipe: str, slope: float) -> pathlib.Path:
    d.mkdir()
    (d / "config.yaml").write_text(f"recipe: {recipe}\nengine: local\n")
    rows = [{"step": s, "reward/mean": slope * s, "actor/entropy": 1 - 0.01 * s,
             "mismatch/abs_gap_mean": 0.01 * s, "mismatch/neg_tail_depth": "nan" if s == 3 else 0.1 * s}
            for s in range(1, 11)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 11, "rew')
    return d


def test_overlay_two_runs(tmp_path):
    mod = _load()
    a, b = _run(tmp_path / "a", "triage_nvfp4", 0.05), _run(tmp_path / "b", "tis_nvfp4", 0.02)
    out = tmp_path / "fig" / "x.png"
    assert mod.main([str(a), str(b), "--out", str(out), "--smooth", "3"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert mod.label_of(a) == "triage_nvfp4 (a)"
    # centred moving mean ignores non-finite points: window 3 around index 1 of [0, 1, nan, 3] -> (0 + 1) / 2
    assert mod.smooth([0.0, 1.0, float("nan"), 3.0], 3)[1] == 0.5


def test_missing_run_dir(tmp_path):
    with pytest.raises(SystemExit, match="metrics.jsonl not found"):
        _load().main([str(tmp_path / "nope")])

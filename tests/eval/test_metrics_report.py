"""avg@k, std over samples, equal-weighted average, and the Table 6-8 style comparison."""
from __future__ import annotations

import json
import math

import pytest

from eval.metrics import equal_weighted_average, mean_std, summarize_task
from eval.report import atomic_write_json, compare_table, load_run
from eval.task import SampleScore, get_task


def test_mean_std_hand_computed():
    # runs 0.5 and 0.7: mean 0.6; sample std sqrt(((-.1)^2 + .1^2) / 1) = 0.141421...
    mean, std = mean_std([0.5, 0.7])
    assert mean == pytest.approx(0.6) and std == pytest.approx(math.sqrt(0.02))
    assert mean_std([0.25]) == (0.25, 0.0)


def test_summarize_task_avg_at_k():
    task = get_task("gsm8k")
    runs = [[SampleScore(1.0, "1"), SampleScore(0.0, None)], [SampleScore(1.0, "1"), SampleScore(1.0, "2")]]
    s = summarize_task(task, runs)  # run accuracies 0.5 and 1.0 -> mean 0.75, std sqrt(0.125)
    assert (s["k"], s["n"]) == (2, 2)
    assert s["mean"] == pytest.approx(0.75) and s["std"] == pytest.approx(math.sqrt(0.125))
    assert s["metrics"]["accuracy"]["per_sample"] == [0.5, 1.0]


def test_equal_weighted_average_ignores_task_sizes():
    avg = equal_weighted_average({"a": {"mean": 0.6}, "b": {"mean": 0.2}})
    assert avg["mean"] == pytest.approx(0.4) and avg["weighting"] == "equal"


def _run(tasks: dict[str, float]) -> dict:
    return {"tasks": {t: {"mean": m, "title": t.upper()} for t, m in tasks.items()}}


def test_compare_table_percentage_points(tmp_path):
    a, b = _run({"aime24": 0.30, "gsm8k": 0.90}), _run({"aime24": 0.25, "gsm8k": 0.92, "ifeval": 0.5})
    table, data = compare_table([a, b], ["bf16", "nvfp4"])
    # common tasks only in the average: bf16 (30+90)/2 = 60, nvfp4 (25+92)/2 = 58.5 -> -1.50 pp
    assert data["differences_pp"]["nvfp4 - bf16"]["aime24"] == pytest.approx(-5.0)
    assert data["differences_pp"]["nvfp4 - bf16"]["average"] == pytest.approx(-1.5)
    assert "| Δ pp (nvfp4 - bf16) | -5.00 | +2.00 | – | -1.50 |" in table
    assert "Average over the tasks all runs have: AIME24, GSM8K" in table


def test_load_run_errors_and_atomic_write(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass an `eval run` output directory"):
        load_run(tmp_path / "nope")
    atomic_write_json(tmp_path / "r" / "results.json", {"x": 1})
    assert list((tmp_path / "r").iterdir()) == [tmp_path / "r" / "results.json"]  # no temp file left
    with pytest.raises(ValueError, match="not an `eval run` results file"):
        load_run(tmp_path / "r")
    atomic_write_json(tmp_path / "r" / "results.json", _run({"gsm8k": 0.5}))
    assert load_run(tmp_path / "r")["name"] == "r"
    assert json.loads((tmp_path / "r" / "results.json").read_text())["tasks"]["gsm8k"]["mean"] == 0.5

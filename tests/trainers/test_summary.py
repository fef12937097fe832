"""The end-of-run summary: first and last reward, the gap, TRIAGE's gate, where things are, the next command."""
from __future__ import annotations

import pathlib

from trainers.summary import run_summary


def test_summary_lines(tmp_path):
    rows = [{"step": 1, "reward/mean": 0.25, "mismatch/abs_gap_mean": 1e-5},
            {"step": 8, "reward/mean": 0.4375, "mismatch/abs_gap_mean": 2.6e-6, "mismatch/neg_tail_depth": 6.6e-6,
             "triage/gated_token_frac": 0.125, "triage/repair_loss": 0.01}]
    text = run_summary(tmp_path, rows, "ck/step_000008", tmp_path / "curves.png", triage=True)
    assert text.splitlines() == [
        f"[trainers] 8 steps -> {tmp_path}",
        "  reward/mean 0.25 (step 1) -> 0.438 (step 8)",
        "  sampler/learner gap: mean |delta| 2.6e-06, negative tail depth -q0.05 6.6e-06 (last step)",
        "  TRIAGE: gated token fraction 0.125, repair loss 0.01 (last step)",
        f"  curves: {tmp_path / 'curves.png'}   metrics: {tmp_path / 'metrics.jsonl'}",
        "  next: python -m eval run ck/step_000008 --tasks gsm8k --limit 5",
    ]
    assert "TRIAGE" not in run_summary(tmp_path, rows, "", None)  # diagnostics are logged for every loss


def test_summary_without_steps_or_plot():
    assert run_summary(pathlib.Path("r"), [], "", None) == "[trainers] no steps logged in r"
    text = run_summary(pathlib.Path("r"), [{"step": 1}], "", None)
    assert "reward/mean n/a (step 1) -> n/a (step 1)" in text and "next:" not in text and "curves:" not in text


def test_summary_shows_the_runs_own_held_out_evals():
    rows = [{"step": 1, "reward/mean": 0.1}, {"step": 4, "reward/mean": 0.2, "val/arithmetic": 0.72, "val/average": 0.72},
            {"step": 8, "reward/mean": 0.3, "val/arithmetic": 0.9, "val/average": 0.9}]
    text = run_summary(pathlib.Path("r"), rows, "", None)
    assert "  held-out (eval.every): arithmetic 0.72 (step 4) -> 0.9 (step 8)" in text.splitlines()
    one = run_summary(pathlib.Path("r"), rows[:2], "", None)
    assert "  held-out (eval.every): arithmetic 0.72 (step 4)" in one.splitlines()
    assert "held-out" not in run_summary(pathlib.Path("r"), rows[:1], "", None)

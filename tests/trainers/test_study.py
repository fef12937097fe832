"""The study runner: validation up front, the summary arithmetic on hand-written metrics, and a CPU smoke grid
(two recipes, one seed, two steps of a tiny random Qwen3: it checks the runner, the table and the plots; it is
not evidence about any recipe)."""
from __future__ import annotations

import json
import math
import pathlib

import pytest

from trainers import study
from trainers.study import StudyError, load_study, reward_at, run_study, summarize, table, where

REPO = pathlib.Path(__file__).resolve().parents[2]


def _write(tmp_path, text: str) -> pathlib.Path:
    p = tmp_path / "study.yaml"
    p.write_text(text)
    return p


def test_bundled_studies_validate():
    for name in ("arithmetic", "smoke", "default", "rollout_nvfp4", "headroom", "headroom_cpu", "tis_vs_triage"):
        cfg = load_study(REPO / "recipes" / "studies" / f"{name}.yaml")
        assert cfg.arms and cfg.seeds


@pytest.mark.parametrize("body, needle", [
    ("name: a\noutput_dir: o\narms: [bf16, nvfp5]\n", "not training recipes"),
    ("name: a\noutput_dir: o\narms: [bf16, bf16]\n", "listed twice"),
    ("name: a\noutput_dir: o\narms: [bf16]\nseeds: [0, 0]\n", "distinct integers"),
    ("name: a\noutput_dir: o\narms: [bf16]\nparallel: 0\n", "parallel"),
    ("name: a\noutput_dir: o\narms: [bf16]\ncolour: red\n", "unknown key"),
    ("name: a\narms: [bf16]\n", "'output_dir' is required"),
    ("name: a\noutput_dir: o\narms: [bf16]\ntrain: {trainer.seed: 3}\n", "set by the study"),
    ("name: a\noutput_dir: o\narms: [bf16]\ntrain: {optim.lr: abc}\n", "optim.lr"),
    ("name: a\noutput_dir: o\narms: [bf16]\neval: {tasks: arithmetic, colour: 1}\n", "eval"),
    ("name: a\noutput_dir: o\narms: [bf16, nvfp4]\nbaseline: nvfp5\n", "baseline 'nvfp5' is not one of the arms"),
    ("name: a\noutput_dir: o\narms: [bf16]\neval: {precision: bf16}\n", "eval.precision=bf16 is evaluated inside"),
    ("name: a\noutput_dir: o\narms: [bf16]\neval: {every: 2, precision: nvfp5}\n", "eval.precision='nvfp5'"),
    ("name: a\noutput_dir: o\narms: [bf16, nvfp4]\npairs: [[nvfp4, strict_nvfp4]]\n", "pairs name .'strict_nvfp4'."),
    ("name: a\noutput_dir: o\narms: [bf16, nvfp4]\npairs: [nvfp4, bf16]\n", "pairs must be a list of"),
])
def test_bad_study_is_one_clear_error(tmp_path, body, needle):
    with pytest.raises(StudyError, match=needle):
        load_study(_write(tmp_path, body))


def test_runs_get_a_fixed_thread_count(tmp_path, monkeypatch):
    """Each run's CPU threads come from the study (cores / parallel), not from the load its start happens to
    see, so the same study gives the same numbers; an explicit train.trainer.cpu_threads wins."""
    from trainers.config import load_config
    from trainers.study import train_args

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    cfg = load_study(_write(tmp_path, "name: a\noutput_dir: o\narms: [bf16]\nparallel: 3\n"))
    assert load_config(train_args(cfg, "bf16", 0)).trainer.cpu_threads == 5
    cfg = load_study(_write(tmp_path, "name: a\noutput_dir: o\narms: [bf16]\ntrain: {trainer.cpu_threads: 2}\n"))
    assert [a for a in train_args(cfg, "bf16", 0) if "cpu_threads" in a] == ["trainer.cpu_threads=2"]


def test_reward_at_is_a_trailing_window_mean():
    rows = [{"step": s, "reward/mean": float(s)} for s in range(1, 11)]
    assert reward_at(rows, 10, 3) == pytest.approx((8 + 9 + 10) / 3)
    assert reward_at(rows, 2, 5) == pytest.approx(1.5)  # only steps 1 and 2 exist
    assert math.isnan(reward_at(rows, 11, 3))  # the run never got there


def test_summary_and_table_over_seeds(tmp_path):
    cfg = load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16, triage_bf16]\n"
                                      "seeds: [0, 1]\ntrain: {trainer.max_steps: 4}\nwindow: 2\n"))
    for arm, base in (("bf16", 0.0), ("triage_bf16", 0.5)):
        for seed in (0, 1):
            run = cfg.run_dir(arm, seed)
            run.mkdir(parents=True)
            rows = [{"step": s, "reward/mean": base + 0.1 * seed, "mismatch/abs_gap_mean": 0.01,
                     "perf/step_s": 2.0} for s in (1, 2, 3, 4)]
            if arm == "triage_bf16":
                for r in rows:
                    r["triage/gate_grad_shift"] = 0.25
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(cfg, {"bf16": 4, "triage_bf16": 4})
    assert [(r["recipe"], r["seed"], r["steps"]) for r in s["runs"]] == [
        ("bf16", 0, 4), ("bf16", 1, 4), ("triage_bf16", 0, 4), ("triage_bf16", 1, 4)]
    assert all(r["complete"] and r["eval_accuracy"] is None for r in s["runs"])
    tri = s["arms"]["triage_bf16"]
    assert tri["final_reward"]["mean"] == pytest.approx(0.55)
    assert tri["final_reward"]["std"] == pytest.approx(math.sqrt(0.005))  # sample std of 0.5, 0.6
    assert tri["gate_grad_shift"]["mean"] == pytest.approx(0.25)
    assert s["arms"]["bf16"]["gate_grad_shift"] is None  # the vanilla loss logs no gate
    md = table(s)
    assert "| triage_bf16 | 2 |" in md and "0.550 ± 0.071" in md
    assert "by checkpoint step" not in md  # no eval yet


def test_seeds_not_run_yet_stay_out_of_the_statistics(tmp_path):
    """A grid run in blocks: seed 1 has no metrics yet, so the arm counts 1 seed of 2, its steps are the run's
    4 (not 0-4) and its reward is seed 0's alone."""
    cfg = load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16]\n"
                                      "seeds: [0, 1]\ntrain: {trainer.max_steps: 4}\nwindow: 2\n"))
    run = cfg.run_dir("bf16", 0)
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.25,
                                                           "perf/gpu_reserved_gb": [3.0, 7.5, 5.0, 4.0][s - 1]})
                                               + "\n" for s in (1, 2, 3, 4)))
    a = summarize(cfg, {"bf16": 4})["arms"]["bf16"]
    assert (a["seeds"], a["seeds_planned"]) == (1, 2)
    assert a["gpu_reserved_gb"]["max"] == 7.5  # a run's most held memory: what gpu_gb_per_run must cover
    assert (a["steps"]["min"], a["steps"]["max"], a["final_reward"]["n"]) == (4, 4, 1)
    assert "| bf16 | 1 of 2 | 4 |" in table(summarize(cfg, {"bf16": 4}))


def test_held_out_accuracy_is_also_compared_at_equal_checkpoints(tmp_path, monkeypatch):
    """Runs stopped at different checkpoints: the last-checkpoint column mixes steps, the by-step table does not."""
    cfg = load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16, triage_bf16]\n"
                                      "seeds: [0, 1]\ntrain: {trainer.max_steps: 20}\n"))
    evals = {("bf16", 0): {10: 0.2, 20: 0.4}, ("bf16", 1): {10: 0.3}, ("triage_bf16", 0): {10: 0.5},
             ("triage_bf16", 1): {}}
    for (arm, seed), accs in evals.items():
        run = cfg.run_dir(arm, seed)
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.0}) + "\n")
        for step, acc in accs.items():
            d = run / "eval" / f"step_{step:06d}"
            d.mkdir(parents=True)
            (d / "results.json").write_text(json.dumps({"tasks": {"a": {"mean": acc}, "b": {"mean": acc}}}))
    base = cfg.root / "step0" / "only-bf16-arm"
    base.mkdir(parents=True)
    (base / "results.json").write_text(json.dumps({"tasks": {"a": {"mean": 0.1}}}))
    monkeypatch.setattr(study.results, "step0_args",
                        lambda c, arm, common=False: (base, []) if arm == "bf16" and not common else None)
    s = summarize(cfg, {"bf16": 20, "triage_bf16": 20})
    bf = s["arms"]["bf16"]
    assert bf["eval_step0"] == pytest.approx(0.1) and s["arms"]["triage_bf16"]["eval_step0"] is None
    assert bf["eval_accuracy"]["mean"] == pytest.approx(0.35)  # last checkpoints: step 20 (0.4) and 10 (0.3)
    assert bf["eval_by_step"][10]["mean"] == pytest.approx(0.25) and bf["eval_by_step"][10]["n"] == 2
    assert bf["eval_by_step"][20]["n"] == 1
    assert s["arms"]["triage_bf16"]["eval_by_step"] == {10: {"mean": 0.5, "std": 0.0, "n": 1, "min": 0.5,
                                                             "max": 0.5}}
    md = table(s)
    assert "| arm | step 0 | step 10 | step 20 |" in md
    assert "| bf16 | 0.100 (untrained) | 0.250 ± 0.071 (n=2) | 0.400 (n=1) |" in md
    assert "| triage_bf16 | - | 0.500 (n=1) | - |" in md


def test_smoke_grid_runs_resumes_and_plots(tmp_path, tiny_model_dir):
    out = tmp_path / "study"
    cfg = load_study(REPO / "recipes" / "studies" / "smoke.yaml",
                     [f"output_dir={out}", f"train.model.path={tiny_model_dir}", "train.trainer.max_steps=2",
                      "train.trainer.save_every=2", "train.data.arithmetic.size=16",
                      "train.algorithm.micro_batch_size=2", "eval.every=1", "eval.precision=bf16"])
    said: list[str] = []
    s = run_study(cfg, say=said.append)
    assert s["failed"] == [], (said, [p.read_text()[-2000:] for p in (out / "logs").glob("*.log")])
    runs = s["runs"]
    # every run evaluated itself after steps 1 and 2, so only the untrained model got an `eval run`
    assert [m.split(" (log")[0] for m in said if m.startswith("start eval")] == [
        f"start eval step0 {p.name}" for p in (out / "step0").iterdir()]
    assert [sorted(r["eval_by_step"]) for r in runs] == [[1, 2], [1, 2]]
    # both arms sample in BF16: their eval at the common precision is their own, and one step-0 eval serves both
    assert [r["eval_common_by_step"] for r in runs] == [r["eval_by_step"] for r in runs]
    assert (out / "heldout.png").stat().st_size > 1000 and len(list((out / "step0").iterdir())) == 1
    assert [(r["recipe"], r["seed"]) for r in runs] == [("bf16", 0), ("triage_bf16", 0)]
    for r in runs:
        assert r["steps"] == 2 and r["complete"]
        assert 0.0 <= r["eval_accuracy"] <= 1.0
        assert r["abs_gap_mean"] is not None and math.isfinite(r["final_reward"])
    on_disk = json.loads((out / "summary.json").read_text())
    assert {"recipe", "seed", "steps", "final_reward", "eval_accuracy", "abs_gap_mean"} <= set(on_disk["runs"][0])
    for png in ("reward.png", "panels.png"):
        assert (out / png).stat().st_size > 1000
    assert "| bf16 | 1 |" in (out / "table.md").read_text()
    # what the command prints at the end: every run's own summary (TRIAGE's gate line only for the TRIAGE
    # arm), the eval to run next on its last checkpoint, and where the study's table and figures are
    text = where(cfg)
    assert "[bf16/seed0] [trainers] 2 steps" in text and "[triage_bf16/seed0] [trainers] 2 steps" in text
    assert text.count("TRIAGE: gated token fraction") == 1
    assert f"next: python -m eval run {out / 'triage_bf16' / 'seed0' / 'checkpoints' / 'step_000002'}" in text
    assert f"[study] table: {out / 'table.md'}" in text
    # the untrained model, evaluated once: both arms sample in BF16, so they share one baseline
    base = list((out / "step0").iterdir())
    assert len(base) == 1 and base[0].name.startswith("bf16-") and (base[0] / "results.json").is_file()
    assert [s["arms"][a]["eval_step0"] for a in ("bf16", "triage_bf16")] == [s["arms"]["bf16"]["eval_step0"]] * 2
    assert 0.0 <= s["arms"]["bf16"]["eval_step0"] <= 1.0 and "(untrained)" in (out / "table.md").read_text()
    # the same command again: every run and eval is found complete, nothing is started
    said.clear()
    again = run_study(cfg, say=said.append)
    assert not any(m.startswith("start") for m in said), said
    assert [r["final_reward"] for r in again["runs"]] == [r["final_reward"] for r in runs]


def test_time_limit_stops_training_without_failing(tmp_path):
    cfg = load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16]\nseeds: [0, 1]\n"
                                      "eval: null\n"))
    said: list[str] = []
    s = run_study(cfg, say=said.append, train_seconds=0)
    assert s["failed"] == [] and s["stopped"] == ["bf16/seed0", "bf16/seed1"]
    assert [r["complete"] for r in s["runs"]] == [False, False] and not any(m.startswith("start") for m in said)


def test_a_run_the_time_limit_reaches_after_its_last_step_is_not_reported_stopped(tmp_path, monkeypatch):
    cfg = load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16]\nseeds: [0, 1]\n"
                                      "eval: null\ntrain: {trainer.max_steps: 2}\n"))

    def fake_run_all(jobs, parallel, say, stop_at=None):  # both runs stopped; seed 0 had logged its last step
        if not jobs or not jobs[0][0].startswith("bf16/"):
            return {}
        for step_count, seed in ((2, 0), (1, 1)):
            run = cfg.run_dir("bf16", seed)
            run.mkdir(parents=True)
            rows = [{"step": k, "reward/mean": 0.5} for k in range(1, step_count + 1)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {name: None for name, _, _ in jobs}

    monkeypatch.setattr(study.runner, "_run_all", fake_run_all)
    s = study.run_study(cfg, say=lambda m: None, train_seconds=1)
    assert [(r["seed"], r["complete"]) for r in s["runs"]] == [(0, True), (1, False)]
    assert s["stopped"] == ["bf16/seed1"] and s["failed"] == []


def test_eval_every_makes_every_run_evaluate_itself_with_the_studys_eval(tmp_path):
    """eval.every: each run gets the study's held-out eval as its trainer's eval.* keys (the same settings as the
    untrained model's `eval run`), and train.eval.* is refused so that no run evaluates differently."""
    from trainers.config import load_config
    from trainers.study import step0_args, train_args

    body = ("name: a\noutput_dir: o\narms: [bf16]\neval: {tasks: arithmetic_cot, max_new_tokens: 16, limit: 5, "
            "every: 10, batch_size: 8}\n")
    cfg = load_study(_write(tmp_path, body))
    e = load_config(train_args(cfg, "bf16", 0)).eval
    assert (e.every, e.tasks, e.max_new_tokens, e.limit, e.batch_size, e.temperature) == \
        (10, ("arithmetic_cot",), 16, 5, 8, 0.0)
    base = step0_args(cfg, "bf16")[1]
    assert base[base.index("--batch-size") + 1] == "8" and base[base.index("--max-new-tokens") + 1] == "16"
    with pytest.raises(StudyError, match="train.eval.every: a study's held-out eval is its `eval` section"):
        load_study(_write(tmp_path, "name: a\noutput_dir: o\narms: [bf16]\ntrain: {eval.every: 3}\n"))


def test_with_eval_every_only_the_runs_eval_steps_get_an_eval_run(tmp_path):
    """A run stopped by the time limit at a checkpoint between its eval steps is not evaluated by a separate
    process (it evaluates itself when it gets to the next eval step); one of its eval steps whose in-run eval
    was interrupted is; without eval.every every latest checkpoint is."""
    from trainers.study import _eval_due

    cfg = load_study(_write(tmp_path, "name: a\noutput_dir: o\narms: [bf16]\neval: {every: 10}\n"))
    assert [_eval_due(cfg, 30, tmp_path / f"step_{s:06d}") for s in (5, 10, 15, 30)] == [False, True, False, True]
    assert _eval_due(cfg, 25, tmp_path / "step_000025")  # the last step, not a multiple of 10
    cfg = load_study(_write(tmp_path, "name: a\noutput_dir: o\narms: [bf16]\n"))
    assert all(_eval_due(cfg, 30, tmp_path / f"step_{s:06d}") for s in (5, 15))


def test_a_strict_arm_gets_its_own_untrained_baseline(tmp_path):
    """The untrained model is evaluated as each arm samples: a strict arm under --alignment strict, apart from
    the default-alignment arm of the same precision."""
    from trainers.study import step0_args

    cfg = load_study(_write(tmp_path, "name: a\noutput_dir: o\narms: [nvfp4, strict_nvfp4]\n"))
    plain, strict = step0_args(cfg, "nvfp4"), step0_args(cfg, "strict_nvfp4")
    assert "--alignment" not in plain[1] and strict[1][strict[1].index("--alignment") + 1] == "strict"
    assert plain[0] != strict[0]


def test_time_limit_lets_runs_save_their_step_then_kills_the_stragglers(tmp_path, monkeypatch):
    """At the time limit every run gets SIGTERM at once; one that exits within the grace period (a trainer
    saving its step) is waited for, one that does not is killed."""
    import sys
    import time

    from trainers import study

    monkeypatch.setattr(study.runner, "STOP_GRACE_S", 3.0)
    graceful = ("import signal, sys, time, pathlib\n"
                "def bye(*_):\n    time.sleep(0.5); pathlib.Path(sys.argv[1]).write_text('saved'); sys.exit(143)\n"
                "signal.signal(signal.SIGTERM, bye)\ntime.sleep(60)\n")
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    jobs = [("a", [sys.executable, "-c", graceful, str(tmp_path / "a.saved")], tmp_path / "a.log"),
            ("b", [sys.executable, "-c", stubborn], tmp_path / "b.log")]
    said: list[str] = []
    t0 = time.monotonic()
    status = study._run_all(jobs, 2, said.append, stop_at=t0 + 2.0)
    assert status == {"a": None, "b": None}
    assert (tmp_path / "a.saved").read_text() == "saved"
    assert any("stopped a at the time limit, after saving its step" in m for m in said), said
    assert any("stopped b at the time limit, killed after 3 s" in m for m in said), said
    assert time.monotonic() - t0 < 20


def test_arms_are_compared_with_the_baseline_at_equal_steps(tmp_path):
    """baseline: every other arm's held-out accuracy per evaluated step and reward at steps_at, against the
    baseline's seeds (trainers/compare.py), in summary.json and as a table section."""
    cfg = load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16, triage_bf16]\n"
                                      "seeds: [0, 1, 2]\ntrain: {trainer.max_steps: 10}\nsteps_at: [10]\n"
                                      "window: 1\nbaseline: bf16\n"))
    accs = {"bf16": [0.585, 0.52, 0.57], "triage_bf16": [0.72, 0.425, 0.77]}
    for arm, values in accs.items():
        for seed, acc in enumerate(values):
            run = cfg.run_dir(arm, seed)
            (run / "eval" / "step_000010").mkdir(parents=True)
            (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "reward/mean": acc}) + "\n")
            (run / "eval" / "step_000010" / "results.json").write_text(json.dumps({"tasks": {"a": {"mean": acc}}}))
    s = summarize(cfg, {"bf16": 10, "triage_bf16": 10})
    vs = s["vs_baseline"]
    assert vs["baseline"] == "bf16" and list(vs["arms"]) == ["triage_bf16"]
    ev, rw = vs["arms"]["triage_bf16"]["eval@10"], vs["arms"]["triage_bf16"]["reward@10"]
    assert ev["diff"] == pytest.approx(0.08) and ev["p"] == pytest.approx(0.5) and ev["n"] == [3, 3]
    assert rw == ev  # the reward here is the same number per seed
    md = table(s)
    assert "Against `bf16` at equal steps" in md and "with 3 against 3 seeds the smallest possible p is 0.10" in md
    assert "| arm | held-out 10 | reward 10 |" in md
    assert "| triage_bf16 | +0.080 ± 0.109 (p 0.50) | +0.080 ± 0.109 (p 0.50) |" in md
    assert "vs_baseline" not in summarize(load_study(_write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\n"
                                                                     "arms: [bf16, triage_bf16]\n")), {"bf16": 10,
                                                                                                      "triage_bf16": 10})


def test_a_study_can_start_from_another(tmp_path):
    """defaults: [name] merges name.yaml beside the file under it; keys of the file win, lists are replaced."""
    (tmp_path / "base.yaml").write_text("name: base\noutput_dir: o\narms: [bf16, nvfp4]\nseeds: [0, 1, 2]\n"
                                        "train: {rollout.n: 8}\nwindow: 3\n")
    (tmp_path / "child.yaml").write_text("defaults: [base]\nname: child\narms: [triage_bf16]\nwindow: 5\n")
    c = load_study(tmp_path / "child.yaml", ["seeds=[4]"])
    assert (c.name, c.output_dir, c.arms, c.seeds, c.window) == ("child", "o", ("triage_bf16",), (4,), 5)
    assert c.train["rollout.n"] == 8
    (tmp_path / "loop.yaml").write_text("defaults: [loop]\nname: l\n")
    with pytest.raises(StudyError, match="defaults form a cycle"):
        load_study(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("defaults: [nowhere]\nname: x\n")
    with pytest.raises(StudyError, match="no study 'nowhere' beside it; valid: base, child, loop"):
        load_study(tmp_path / "orphan.yaml")


def test_a_failed_run_is_reported_with_its_error_line(tmp_path):
    import sys

    said = []
    cmd = [sys.executable, "-c", ("import sys; print('warming up'); print('error: model.device=cuda, no GPU'); "
                                  "sys.exit(3)")]
    status = study._run_all([("arm/seed0", cmd, tmp_path / "logs" / "a.log")], 1, said.append)
    assert status == {"arm/seed0": 3}
    assert any(m.startswith("FAILED (exit 3) arm/seed0 in ") and m.endswith(": error: model.device=cuda, no GPU")
               for m in said), said


def test_one_eval_precision_for_every_arm_and_the_paired_comparison(tmp_path):
    """eval.precision: the runs get it, the untrained model is evaluated under it once, and the summary pairs every
    arm with the baseline seed by seed, under each run's own precision and under the common one."""
    path = _write(tmp_path, f"name: t\noutput_dir: {tmp_path / 'o'}\n"
                             "arms: [rollout_nvfp4, bf16]\nseeds: [0, 1, 2]\nbaseline: bf16\n"
                             "train: {trainer.max_steps: 10}\n"
                             "eval: {every: 5, precision: bf16, limit: 4}\n")
    cfg = load_study(path)
    assert "eval.precision=bf16" in study.train_args(cfg, "rollout_nvfp4", 0)
    own0, common0 = study.step0_args(cfg, "rollout_nvfp4"), study.step0_args(cfg, "rollout_nvfp4", common=True)
    assert "--precision" in own0[1] and "--precision" not in common0[1] and common0[0].name.startswith("bf16-")
    assert common0 == study.step0_args(cfg, "bf16", common=True)  # one untrained eval for every arm
    # own precision: the NVFP4 sampler reads lower; at bf16 the rollout arm trails the baseline by 0.1 everywhere
    accs = {"rollout_nvfp4": ({5: 0.1, 10: 0.2}, {5: 0.4, 10: 0.6}), "bf16": ({5: 0.5, 10: 0.7}, {5: 0.5, 10: 0.7})}
    for arm, (own, common) in accs.items():
        for seed in cfg.seeds:
            run = cfg.run_dir(arm, seed)
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "reward/mean": 0.0}) + "\n")
            for top, curve in (("eval", own), ("eval@bf16", common)):
                for step, acc in curve.items():
                    d = run / top / f"step_{step:06d}"
                    d.mkdir(parents=True)
                    (d / "results.json").write_text(json.dumps({"tasks": {"a": {"mean": acc + 0.01 * seed}}}))
    s = summarize(cfg, {"rollout_nvfp4": 10, "bf16": 10})
    assert s["arms"]["rollout_nvfp4"]["eval_common_by_step"][10]["mean"] == pytest.approx(0.61)
    assert [(c["arm"], c["against"]) for c in s["paired"]] == [("rollout_nvfp4", "bf16")]
    p = s["paired"][0]
    assert p["own"]["auc"]["diff"] == pytest.approx(-0.45) and p["own"]["steps"] == [5, 10]
    assert p["common"]["auc"]["diff"] == pytest.approx(-0.1) and p["common"]["last"]["diff"] == pytest.approx(-0.1)
    assert p["common"]["seeds"] == [0, 1, 2] and p["common"]["auc"]["p"] == pytest.approx(0.25, abs=0.02)
    md = table(s)
    assert "every arm under one precision, `bf16`" in md and "| rollout_nvfp4 | 0.410 ± 0.010 (n=3) | 0.610" in md
    assert "| rollout_nvfp4 | bf16 | common | 3 | 5,10 | 0.510 | 0.610 | -0.100 [-0.100, -0.100]" in md
    # an extra contrast: the baseline against the rollout arm, the same pairs with the sign turned
    cfg = load_study(path, ["pairs=[[bf16,rollout_nvfp4]]"])
    s = summarize(cfg, {"rollout_nvfp4": 10, "bf16": 10})
    assert [(c["arm"], c["against"]) for c in s["paired"]] == [("rollout_nvfp4", "bf16"), ("bf16", "rollout_nvfp4")]
    assert s["paired"][1]["common"]["auc"]["diff"] == pytest.approx(0.1)
    assert "| bf16 | rollout_nvfp4 | common | 3 |" in table(s)


def test_parallel_is_capped_at_what_the_gpu_holds(tmp_path):
    from trainers.study.runner import run_parallel

    body = f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [bf16]\nparallel: 16\ngpu_gb_per_run: 19\n"
    cfg = load_study(_write(tmp_path, body + "train: {model.device: cuda}\n"))
    assert cfg.gpu_gb_per_run == 19.0
    assert run_parallel(cfg, total_gb=85.5) == 4  # an H100: 6 runs of this size ran out of memory there
    assert run_parallel(cfg, total_gb=150.8) == 7  # an H200
    assert run_parallel(cfg, total_gb=10.0) == 1  # never fewer than one
    cpu = load_study(_write(tmp_path, body + "train: {model.device: cpu}\n"))
    assert run_parallel(cpu, total_gb=10.0) == 16  # CPU runs: no GPU cap
    no_cap = body.replace("gpu_gb_per_run: 19\n", "")
    assert run_parallel(load_study(_write(tmp_path, no_cap + "train: {model.device: cuda}\n")), total_gb=10.0) == 16
    with pytest.raises(StudyError, match="gpu_gb_per_run must be a number >= 0"):
        load_study(_write(tmp_path, body.replace("19", "-1")))


def _recorded_run(cfg, arm: str, seed: int, common: dict[int, float]) -> None:
    """A finished run of ``arm`` as the study records it: its config, one metrics row, evals at BF16."""
    from trainers.config import load_config, to_yaml

    run = cfg.run_dir(arm, seed)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(load_config(study.train_args(cfg, arm, seed))))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "reward/mean": 0.0}) + "\n")
    for step, acc in common.items():
        d = run / "eval@bf16" / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"tasks": {"a": {"mean": acc + 0.01 * seed}}}))


def test_an_arm_borrowed_from_another_study_is_read_not_run(tmp_path, monkeypatch):
    """``borrow``: the arm's recorded runs in another study's directory enter the table and the contrasts, the
    runner trains only the study's own arms, and runs trained with other settings are refused up front."""
    other = _write(tmp_path, f"name: h\noutput_dir: {tmp_path / 'h'}\narms: [rollout_nvfp4]\nseeds: [0, 1]\n"
                             "train: {trainer.max_steps: 10}\neval: {every: 5, precision: bf16, limit: 4}\n")
    hcfg = load_study(other)
    for seed in hcfg.seeds:
        _recorded_run(hcfg, "rollout_nvfp4", seed, {5: 0.3, 10: 0.5})
    (tmp_path / "t").mkdir()
    body = (f"name: t\noutput_dir: {tmp_path / 'o'}\narms: [tis_rollout_nvfp4]\nseeds: [0, 1]\n"
            f"borrow: {{rollout_nvfp4: {tmp_path / 'h'}}}\nbaseline: rollout_nvfp4\n"
            "train: {trainer.max_steps: 10}\neval: {every: 5, precision: bf16, limit: 4}\n")
    cfg = load_study(_write(tmp_path / "t", body))
    assert cfg.compared_arms == ("tis_rollout_nvfp4", "rollout_nvfp4")
    assert cfg.run_dir("rollout_nvfp4", 1) == tmp_path / "h" / "rollout_nvfp4" / "seed1"
    for seed in cfg.seeds:
        _recorded_run(cfg, "tis_rollout_nvfp4", seed, {5: 0.4, 10: 0.6})
    s = summarize(cfg, {"tis_rollout_nvfp4": 10})  # the borrowed arm's steps come from the study itself
    assert s["arms"]["rollout_nvfp4"]["seeds"] == 2
    p = s["paired"][0]
    assert (p["arm"], p["against"]) == ("tis_rollout_nvfp4", "rollout_nvfp4")
    assert p["common"]["auc"]["diff"] == pytest.approx(0.1) and p["common"]["seeds"] == [0, 1]
    assert f"`rollout_nvfp4` is the recorded runs of `{tmp_path / 'h'}`" in table(s)
    # the runner trains the study's own arm only (every run is complete here, so it trains nothing)
    started = []
    monkeypatch.setattr(study.runner, "_run_all", lambda jobs, *a, **k: started.extend(j[0] for j in jobs) or {})
    run_study(cfg, say=lambda *_: None)
    assert not [j for j in started if not j.startswith("eval step0")]
    # a borrowed run trained with another setting is refused, naming it
    with pytest.raises(StudyError, match=r"seed0 ran with rollout.n=4, this study gives rollout.n=8"):
        load_study(_write(tmp_path / "t", body.replace("trainer.max_steps: 10", "trainer.max_steps: 10, rollout.n: 8")))
    with pytest.raises(StudyError, match="must be a training recipe that is not one of the arms"):
        load_study(_write(tmp_path / "t", body.replace("arms: [tis_rollout_nvfp4]", "arms: [rollout_nvfp4]")
                          .replace("baseline: rollout_nvfp4\n", "")))
    with pytest.raises(StudyError, match="has no runs under"):
        load_study(_write(tmp_path / "t", body.replace(str(tmp_path / "h"), str(tmp_path / "nowhere"))))


def test_a_p_value_below_what_the_flips_resolve_is_not_printed_as_zero():
    """10,000 random sign flips give p >= 1/10,001: the paired table says "<0.001" there, not 0.000."""
    from trainers.study.tables import paired_table

    stats = {"arm": 0.5, "base": 0.7, "diff": -0.2, "ci": [-0.25, -0.15], "p": 1 / 10_001, "dz": -1.5, "n": 20,
             "seeds_for_80": 6}
    row = paired_table([{"arm": "a", "against": "b", "common": {"seeds": list(range(20)), "steps": [0, 5],
                                                                 "auc": stats, "last": dict(stats, p=0.0242)}}])[-1]
    assert "| -0.200 [-0.250, -0.150] | <0.001 | -1.50 | 6 |" in row and row.endswith("| 0.024 |")

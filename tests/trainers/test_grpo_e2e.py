"""End-to-end GRPO on a tiny random Qwen3 (CPU): smoke, kill-and-resume, NaN handling, bad inputs."""
from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch

from trainers.config import load_config
from trainers.engines.local import LocalTrainer, TrainingDiverged, run_local
from trainers.tracking import read_metrics

HERE = pathlib.Path(__file__).parent
NONDETERMINISTIC = ("timing/", "perf/")


def _args(model_dir, out, *extra):
    return [f"model.path={model_dir}", f"trainer.output_dir={out}", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=8", "logger.progress=false", "logger.wandb.mode=disabled",
            "algorithm.micro_batch_size=2", "data.arithmetic.size=16", "optim.lr=1e-3", *extra]


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)} for r in rows]


@pytest.fixture(autouse=True, scope="module")
def _restore_torch_threads():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _helpers_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    import reward_helpers

    monkeypatch.setattr(reward_helpers, "CRASH_AT_STEP", None)
    return reward_helpers


def test_smoke_triage_run(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINITE_RECIPE", "nvfp4_per_token")
    out = tmp_path / "run"
    cfg = load_config(["recipe=triage_bf16", *_args(tiny_model_dir, out, "trainer.max_steps=2",
                                                     "reward.fn=reward_helpers:length_reward")])
    result = run_local(cfg)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"  # the Figure-2 panels, written by the run
    err = capsys.readouterr().err
    assert f"[trainers] 2 steps -> {out}" in err and "TRIAGE: gated token fraction" in err
    assert f"next: python -m eval run {result['checkpoint']}" in err
    for key in ("reward/mean", "reward/std", "reward/accuracy", "actor/entropy", "response/length_mean",
                "mismatch/abs_gap_mean", "mismatch/neg_tail_depth", "mismatch/share/neg_adv_neg_gap",
                "triage/gated_token_frac", "triage/repair_loss", "tis/clip_frac", "timing/rollout_s",
                "timing/logprob_s", "timing/update_s", "timing/sync_s", "perf/tokens_per_s", "reward/chars"):
        assert key in rows[0], key
    # bf16 recipe in fp32: the sampler/learner gap at synchronized weights is fp32 rounding only
    assert rows[0]["mismatch/abs_gap_mean"] < 1e-5
    assert rows[0]["actor/grad_norm"] > 0  # the length reward gives the group a non-zero advantage
    meta = json.loads((out / "run_meta.json").read_text())
    assert meta["env"]["MINITE_RECIPE"] == "nvfp4_per_token" and meta["recipe"] == "triage_bf16"
    from trainers.provenance import code_digest, read_code

    assert read_code(out) == [meta["code"]] and meta["code"]["digest"] == code_digest()  # which code ran it
    assert "loss_mode: triage" in (out / "config.yaml").read_text()
    from transformers import AutoModelForCausalLM

    ckpt = pathlib.Path(result["checkpoint"])
    assert ckpt.name == "step_000002" and (ckpt / "optimizer.pt").is_file() and (ckpt / "rng.pt").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt)
    trainer = LocalTrainer(cfg)  # the saved weights are the trained ones, not the initial ones
    init = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(reloaded.state_dict()[name], init.state_dict()[name])
    assert trainer.run_dir == out


# one torch thread in every run: the trainer drops to 1 thread on a loaded CPU, and runs with different thread
# counts differ in the last bits of their float reductions, which the exact comparisons below would see
RESUME_COMMON = ["recipe=bf16", "trainer.max_steps=3", "trainer.save_every=1", "trainer.cpu_threads=1",
                 "reward.fn=reward_helpers:crash_at_step"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    import sys

    sys.path.insert(0, str(HERE))
    full = tmp_path_factory.mktemp("full")
    run_local(load_config([*RESUME_COMMON, *_args(tiny_model_dir, full)]))
    return _stable(read_metrics(full))


def test_kill_and_resume_matches_uninterrupted(tiny_model_dir, tmp_path, _helpers_on_path, uninterrupted):
    common = RESUME_COMMON

    part = tmp_path / "part"
    _helpers_on_path.CRASH_AT_STEP = 2  # dies in the middle of the third step (after its rollout)
    from trainers.rewards.registry import RewardError

    with pytest.raises(RewardError, match="crash_at_step raised RuntimeError: simulated crash on step 2"):
        run_local(load_config([*common, *_args(tiny_model_dir, part)]))
    assert (part / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert [r["step"] for r in read_metrics(part)] == [1, 2]

    _helpers_on_path.CRASH_AT_STEP = None
    run_local(load_config([*common, *_args(tiny_model_dir, part)]))  # trainer.resume=auto
    b = _stable(read_metrics(part))
    assert [r["step"] for r in b] == [1, 2, 3]
    assert uninterrupted == b


def test_graph_sampler_in_the_trainer_resumes_exactly(tiny_model_dir, tmp_path, _helpers_on_path, uninterrupted):
    """rollout.sampler=graph (the CUDA-graph engine, eager on CPU): a killed and resumed run logs what an
    uninterrupted one does, and it samples the loop's tokens (same rewards and lengths as the loop's run)."""
    from trainers.rewards.registry import RewardError

    common = [*RESUME_COMMON, "rollout.sampler=graph"]
    full, part = tmp_path / "full", tmp_path / "part"
    run_local(load_config([*common, *_args(tiny_model_dir, full)]))
    _helpers_on_path.CRASH_AT_STEP = 2
    with pytest.raises(RewardError):
        run_local(load_config([*common, *_args(tiny_model_dir, part)]))
    _helpers_on_path.CRASH_AT_STEP = None
    run_local(load_config([*common, *_args(tiny_model_dir, part)]))
    a, b = _stable(read_metrics(full)), _stable(read_metrics(part))
    assert a == b and [r["step"] for r in b] == [1, 2, 3]
    for key in ("reward/mean", "response/length_mean"):
        assert [r[key] for r in a] == [r[key] for r in uninterrupted], key
    meta = json.loads((full / "run_meta.json").read_text())
    assert meta["sampler"]["sampler"] == "graph" and meta["sampler"]["decode"] == "eager"


def test_held_out_evals_inside_the_run_leave_training_unchanged_and_resume(tiny_model_dir, tmp_path,
                                                                           _helpers_on_path, uninterrupted):
    """eval.every: the run's own sampler answers the eval task after steps 2 and 3 (the last) into
    eval/step_<N> and val/* metrics; the training metrics are those of a run without evals, a killed run
    resumes with the same evals, and the evals of steps after the resumed checkpoint are dropped."""
    from trainers.rewards.registry import RewardError

    common = [*RESUME_COMMON, "eval.every=2", "eval.tasks=[arithmetic]", "eval.limit=3", "eval.max_new_tokens=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    run_local(load_config([*common, *_args(tiny_model_dir, full)]))
    rows = read_metrics(full)
    assert [sorted(k for k in r if k.startswith("val/") or k == "timing/eval_s") for r in rows] == [
        [], *[["timing/eval_s", "val/arithmetic", "val/average"]] * 2]
    assert [{k: v for k, v in r.items() if not k.startswith("val/")} for r in _stable(rows)] == uninterrupted
    assert sorted(d.name for d in (full / "eval").iterdir()) == ["step_000002", "step_000003"]
    res = json.loads((full / "eval" / "step_000003" / "results.json").read_text())
    assert res["tasks"]["arithmetic"]["n"] == 3 and res["protocol"]["precision"] == "none"
    assert rows[2]["val/arithmetic"] == res["tasks"]["arithmetic"]["mean"]
    assert len((full / "eval" / "step_000003" / "samples.jsonl").read_text().splitlines()) == 3

    _helpers_on_path.CRASH_AT_STEP = 2  # dies during step 3, after step 2's checkpoint and eval
    with pytest.raises(RewardError):
        run_local(load_config([*common, *_args(tiny_model_dir, part)]))
    stale = part / "eval" / "step_000003"  # as if an earlier execution had got further
    stale.mkdir()
    (stale / "results.json").write_text(json.dumps({"tasks": {"arithmetic": {"mean": 0.5}}}))
    _helpers_on_path.CRASH_AT_STEP = None
    run_local(load_config([*common, *_args(tiny_model_dir, part)]))
    assert _stable(read_metrics(part)) == _stable(rows)
    again = json.loads((part / "eval" / "step_000003" / "results.json").read_text())
    assert again["tasks"] == res["tasks"]


def test_resume_keeps_the_interrupted_runs_cpu_threads(tiny_model_dir, tmp_path):
    out = tmp_path / "threads"
    before = torch.get_num_threads()
    run_local(load_config(["recipe=bf16", "trainer.max_steps=1", "trainer.cpu_threads=1",
                           "reward.fn=reward_helpers:length_reward", *_args(tiny_model_dir, out)]))
    torch.set_num_threads(2)  # e.g. the machine is idle now, so the default would pick more threads
    trainer = LocalTrainer(load_config(["recipe=bf16", "trainer.max_steps=2",
                                        "reward.fn=reward_helpers:length_reward", *_args(tiny_model_dir, out)]))
    trainer.setup()
    assert trainer.start_step == 1 and trainer.cpu_threads == 1 == torch.get_num_threads()
    assert json.loads((out / "run_meta.json").read_text())["cpu_threads"] == 1
    torch.set_num_threads(before)


def test_minite_optimizer_resumes_a_torch_adamw_checkpoint(tiny_model_dir, tmp_path):
    """optim.impl=minite (minite_kernels.optim.AdamW; its PyTorch reference path on CPU) continues a run whose
    checkpoint torch.optim.AdamW wrote: same state layout. The run metadata names the optimizer."""
    out = tmp_path / "optim"
    common = ["recipe=bf16", "reward.fn=reward_helpers:length_reward", *_args(tiny_model_dir, out)]
    run_local(load_config(["trainer.max_steps=1", "optim.impl=torch", *common]))
    assert json.loads((out / "run_meta.json").read_text())["optimizer"] == "torch"
    trainer = LocalTrainer(load_config(["trainer.max_steps=2", "optim.impl=minite", *common]))
    trainer.setup()
    from minite_kernels.optim import AdamW

    assert trainer.start_step == 1 and isinstance(trainer.optimizer, AdamW)
    assert all(s["step"].item() == 1 for s in trainer.optimizer.state.values())
    trainer.step(1)
    assert all(s["step"].item() == 2 for s in trainer.optimizer.state.values())
    assert trainer.optimizer.reference_params > 0 and trainer.optimizer.kernel_launches == 0
    assert json.loads((out / "run_meta.json").read_text())["optimizer"] == "minite"


@pytest.mark.slow
def test_sigkill_and_resume_matches_uninterrupted(tiny_model_dir, tmp_path, uninterrupted):
    """A real `kill -9` of `python -m trainers.grpo` mid-run, then trainer.resume=auto."""
    import os
    import signal
    import subprocess
    import sys
    import time

    part = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]), "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "trainers.grpo", *RESUME_COMMON, *_args(tiny_model_dir, part)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = part / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() == "step_000001":
            break
        time.sleep(0.05)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert killed, "the run finished before it could be killed"
    done = [r["step"] for r in read_metrics(part)]
    assert done and done[0] == 1 and len(done) < 3
    run_local(load_config([*RESUME_COMMON, *_args(tiny_model_dir, part)]))
    assert _stable(read_metrics(part)) == uninterrupted


def test_sigterm_finishes_the_step_saves_it_and_resumes_exactly(tiny_model_dir, tmp_path, uninterrupted):
    """`kill -TERM` (a pre-emption notice, a study's time limit) of `python -m trainers.grpo`: the run finishes
    the step in progress, saves it although save_every would not, exits with 143, and resumes exactly."""
    import signal
    import subprocess
    import sys
    import time

    part = tmp_path / "stopped"
    args = [*RESUME_COMMON, "trainer.save_every=0", "trainer.max_steps=3", *_args(tiny_model_dir, part)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]), "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "trainers.grpo", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not read_metrics(part):
        time.sleep(0.05)
    stopped_early = proc.poll() is None
    if stopped_early:
        os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert stopped_early, "the run finished before SIGTERM"
    steps = [r["step"] for r in read_metrics(part)]
    assert proc.returncode == 143, err[-2000:]
    assert steps and steps[-1] < 3 and json.loads(out.splitlines()[-1])["stopped"] is True
    assert (part / "checkpoints" / "latest").read_text().strip() == f"step_{steps[-1]:06d}"
    assert f"SIGTERM: stopped after step {steps[-1]}, its checkpoint saved" in err
    run_local(load_config(args))
    assert _stable(read_metrics(part)) == uninterrupted


def test_nan_steps_are_skipped_then_stop(tiny_model_dir, tmp_path):
    from verl.trainer.ppo.core_algos import register_policy_loss

    calls = {"n": 0}

    @register_policy_loss("nan_after_first_step_for_test")
    def _nan_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                  rollout_is_weights=None):
        calls["n"] += 1
        loss = (log_prob * response_mask).sum() * 0.0 + 1.0
        return (loss * float("nan") if calls["n"] > 1 else loss), {}

    out = tmp_path / "nan"
    cfg = load_config(["recipe=bf16", *_args(tiny_model_dir, out, "trainer.max_steps=5", "trainer.save_every=1",
                                             "trainer.max_consecutive_nan=2", "algorithm.micro_batch_size=4",
                                             "algorithm.loss_mode=nan_after_first_step_for_test")])
    with pytest.raises(TrainingDiverged, match="2 consecutive steps.*step_000001"):
        run_local(cfg)
    rows = read_metrics(out)
    assert [r["train/nan_skipped"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[-1]["train/nan_skipped_total"] == 2.0
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert not (out / "checkpoints" / "step_000002").exists()


@pytest.mark.parametrize("override,exc,match", [
    ("model.path=/no/such/model", "ModelLoadError", "does not exist"),
    ("model.path=BROKEN", "ModelLoadError", "is not a loadable Hugging Face model dir"),
    ("data.path=/no/such.jsonl", "DatasetError", "does not exist"),
])
def test_missing_inputs(tiny_model_dir, tmp_path, override, exc, match):
    if "BROKEN" in override:  # a model dir whose config.json is not JSON
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "config.json").write_text("{broken")
        override = override.replace("BROKEN", str(tmp_path / "broken"))
    extra = [override] + (["data.task=jsonl"] if "data.path" in override else [])
    args = [a for a in _args(tiny_model_dir, tmp_path / "x") if not a.startswith(override.split("=")[0] + "=")]
    cfg = load_config(["recipe=bf16", *args, *extra])
    with pytest.raises(Exception) as info:
        run_local(cfg)
    assert type(info.value).__name__ == exc and match in str(info.value)


def test_malformed_dataset_row_names_file_and_line(tiny_model_dir, tmp_path):
    from trainers.data import DatasetError

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n\n{"question": "2+2?"\n')
    cfg = load_config(["recipe=bf16", *_args(tiny_model_dir, tmp_path / "x"), "data.task=jsonl", f"data.path={data}"])
    with pytest.raises(DatasetError, match=rf"{data}:3: not valid JSON"):
        run_local(cfg)
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n')
    with pytest.raises(DatasetError, match=rf"{data}:2: missing field\(s\) \['question'\]"):
        run_local(cfg)


def test_cli_reports_config_errors(capsys):
    from trainers.grpo import main

    assert main(["trainer.max_step=3"]) == 2
    assert "did you mean 'trainer.max_steps'" in capsys.readouterr().err


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tiny_model_dir, tmp_path, _helpers_on_path,
                                                                     uninterrupted, capsys):
    """The newest checkpoint is corrupt (a bit flipped in its weights): resume=auto says so, resumes from the
    one before, and the finished run still logs what an uninterrupted one does."""
    part = tmp_path / "part"
    _helpers_on_path.CRASH_AT_STEP = 2
    from trainers.rewards.registry import RewardError

    with pytest.raises(RewardError):
        run_local(load_config([*RESUME_COMMON, *_args(tiny_model_dir, part)]))
    _helpers_on_path.CRASH_AT_STEP = None
    weights = part / "checkpoints" / "step_000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    run_local(load_config([*RESUME_COMMON, *_args(tiny_model_dir, part)]))
    err = capsys.readouterr().err
    assert "cannot resume from step_000002" in err and "sha256" in err and "resumed from" in err
    assert _stable(read_metrics(part)) == uninterrupted


def test_a_directory_holding_another_run_is_refused(tiny_model_dir, tmp_path):
    from trainers.config import ConfigError

    out = tmp_path / "run"
    common = ["trainer.max_steps=1", "reward.fn=reward_helpers:length_reward", *_args(tiny_model_dir, out)]
    run_local(load_config(["recipe=bf16", *common]))
    with pytest.raises(ConfigError, match=r"holds another run: precision.learner='bf16' \(this command: "
                                          r"'nvfp4_per_token_w1x16_bf16_bwd'\).*trainer.resume=force"):
        run_local(load_config(["recipe=nvfp4", *common]))
    # force: continues the other run's checkpoint under this command's settings, saying how they differ
    run_local(load_config(["recipe=nvfp4", "trainer.resume=force", *common[1:], "trainer.max_steps=2"]))
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    assert "NVFP4" in json.dumps(json.loads((out / "run_meta.json").read_text())["precision"]).upper()


def test_one_run_per_directory(tiny_model_dir, tmp_path):
    from trainers.runlock import RunLock, RunLockedError

    out = tmp_path / "run"
    with RunLock(out), pytest.raises(RunLockedError, match=rf"another run \(pid {os.getpid()}\) is writing to"):
        run_local(load_config(["recipe=bf16", "trainer.max_steps=1", *_args(tiny_model_dir, out)]))
    with RunLock(out):  # released: the next run (or lock) gets it
        pass


def test_unusable_devices_and_output_dirs_are_one_line_errors(tiny_model_dir, tmp_path):
    from trainers.config import ConfigError

    with pytest.raises(ConfigError, match="model.device='banana' is not a device; valid: auto, cpu, cuda"):
        load_config(["model.device=banana"])
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for out, match in ((a_file, "is a file, not a directory"), (a_file / "sub", "cannot hold a run")):
        with pytest.raises(ConfigError, match=match):
            run_local(load_config(["recipe=bf16", "trainer.max_steps=1", *_args(tiny_model_dir, out)]))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            LocalTrainer(load_config(["recipe=bf16", "model.device=cuda", *_args(tiny_model_dir, tmp_path / "c")]))


SEPARATE = ["recipe=bf16", "precision.learner=bf16", "precision.sampler=nvfp4_per_token_w1x16_bf16_bwd",
            "trainer.save_every=1", "trainer.cpu_threads=1", "reward.fn=reward_helpers:length_reward"]


def test_a_sampler_with_its_own_precision_gets_the_learners_weights(tiny_model_dir, tmp_path):
    """precision.learner=bf16 with an NVFP4 sampler (verl's BF16 learner + quantized rollout): the sampler runs
    its own quantized copy of the model, the learner stays unquantized, and after every update the sampler
    holds the learner's new weights; the gap is the precision mismatch."""
    from minite_kernels.modules.linear import Linear as QLinear

    out = tmp_path / "run"
    trainer = LocalTrainer(load_config(["trainer.max_steps=2", *SEPARATE, *_args(tiny_model_dir, out),
                                        "rollout.n=8"]))  # 8 samples a prompt: rewards that differ in a group
    trainer.setup()
    assert trainer.sampler_model is not trainer.model and trainer.sampler.model is trainer.sampler_model
    assert not any(isinstance(m, QLinear) for m in trainer.model.modules())
    assert any(isinstance(m, QLinear) for m in trainer.sampler_model.modules())
    assert not any(p.requires_grad for p in trainer.sampler_model.parameters())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.step(0)
    assert metrics["reward/zero_adv_groups_frac"] < 1
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())  # it trained
    assert all(torch.equal(dst, src) for dst, src in trainer._param_pairs)  # and the sampler has it
    assert metrics["mismatch/abs_gap_mean"] > 1e-3  # NVFP4 sampler against the unquantized learner
    meta = json.loads((out / "run_meta.json").read_text())
    assert meta["precision"]["patched"] is False and meta["sampler_precision"]["patched"] is True


def _resumes_exactly(model_dir, tmp_path, recipe, *extra, rerun: bool = False):
    """1 step, then a resumed 2nd, log what 2 uninterrupted steps log, with 8 samples a prompt (after _args' 2):
    groups whose rewards differ, so both steps train. ``rerun``: first check that a second uninterrupted run
    logs the same, so that a failure says whether the device or the resume differs."""
    def args(steps, out):
        return [f"trainer.max_steps={steps}", *SEPARATE, f"recipe={recipe}", *_args(model_dir, out), "rollout.n=8",
                *extra]

    full, part = tmp_path / "full", tmp_path / "part"
    run_local(load_config(args(2, full)))
    a = _stable(read_metrics(full))
    if rerun:
        run_local(load_config(args(2, tmp_path / "again")))
        assert _stable(read_metrics(tmp_path / "again")) == a, "two uninterrupted runs differ: not deterministic"
    run_local(load_config(args(1, part)))
    run_local(load_config(args(2, part)))
    b = _stable(read_metrics(part))
    assert [r["step"] for r in b] == [1, 2] and a == b, "the resumed run differs from the uninterrupted one"
    assert all(r["actor/grad_norm"] > 0 and r["mismatch/abs_gap_mean"] > 1e-3 for r in a)  # trained, mismatched


# no correction, token TIS and TRIAGE: the arms of recipes/studies/tis_vs_triage.yaml, whose runs resume from a
# checkpoint when a device call ends before they do
STUDY_ARMS = ["rollout_nvfp4", "tis_rollout_nvfp4", "triage_rollout_nvfp4"]


@pytest.mark.parametrize("recipe", STUDY_ARMS)
def test_a_sampler_with_its_own_precision_resumes_exactly(tiny_model_dir, tmp_path, recipe):
    """The sampler's copy is rebuilt from the checkpoint's learner weights, and a resumed run logs what an
    uninterrupted one does."""
    _resumes_exactly(tiny_model_dir, tmp_path, recipe, "algorithm.old_log_prob=recompute")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", STUDY_ARMS)
def test_gpu_a_sampler_with_its_own_precision_resumes_exactly(tiny_model_dir, tmp_path, recipe):
    """The same on CUDA as the studies run (fp32 learner, the graph sampler with its NVFP4 kernels): equal logs,
    bit for bit, only if the GPU step is deterministic and the checkpoint holds all of it."""
    _resumes_exactly(tiny_model_dir, tmp_path, recipe, "model.device=cuda", "model.dtype=float32",
                     "rollout.sampler=graph", "algorithm.old_log_prob=recompute", rerun=True)


def test_a_failed_graph_capture_is_reported_once(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A graph sampler that gave up on graphs (a failed capture sets ``eager_reason``) decodes eagerly from then
    on: the run says so once on stderr instead of just getting slower."""
    from rollout.graph_sampler import GraphSampler

    generate = GraphSampler.generate

    def failing(self, prompts, params):
        self.eager_reason = "CUDA graph capture failed: RuntimeError: simulated"
        return generate(self, prompts, params)

    monkeypatch.setattr(GraphSampler, "generate", failing)
    run_local(load_config([*_args(tiny_model_dir, tmp_path / "run"), "recipe=bf16", "trainer.max_steps=2",
                           "rollout.sampler=graph"]))
    err = capsys.readouterr().err
    assert err.count("the rollout decodes eagerly") == 1, err
    assert "from step 1 " in err  # the first logged step
    assert "simulated" in err


def test_norm_quant_where_it_cannot_run_is_a_config_error(tiny_model_dir, tmp_path):
    """``rollout.norm_quant=true`` is a graph-engine option for NVFP4 samplers: on the CPU's reference loop, or on
    a BF16 model's graph engine, the run stops at set-up with the reason."""
    from trainers.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.norm_quant=on: .*CUDA-graph engine option"):
        LocalTrainer(load_config([*_args(tiny_model_dir, tmp_path / "a"), "recipe=bf16",
                                  "rollout.norm_quant=true"])).setup()
    with pytest.raises(ConfigError, match=r"rollout.norm_quant=on: .*packed NVFP4 groups"):
        LocalTrainer(load_config([*_args(tiny_model_dir, tmp_path / "b"), "recipe=bf16", "rollout.norm_quant=true",
                                  "rollout.sampler=graph"])).setup()


def test_eval_precision_reads_the_policy_at_one_precision_next_to_its_own(tiny_model_dir, tmp_path):
    """eval.precision=bf16: a BF16 learner with an NVFP4 sampler is also evaluated with plain linears, on its own
    copy of the policy refreshed from the learner, into eval@bf16/ and val@bf16/*, leaving training and the run's
    own eval as they are; a run whose sampler already is BF16 copies its own eval."""
    split = ["recipe=bf16", "precision.sampler=nvfp4_per_token_w1x16_bf16_bwd", "trainer.max_steps=3",
             "trainer.cpu_threads=1", "reward.fn=reward_helpers:length_reward", "eval.every=2",
             "eval.tasks=[arithmetic]", "eval.limit=3", "eval.max_new_tokens=4"]
    with_common, without = tmp_path / "common", tmp_path / "own"
    run_local(load_config([*split, "eval.precision=bf16", *_args(tiny_model_dir, with_common)]))
    run_local(load_config([*split, *_args(tiny_model_dir, without)]))
    rows, plain = read_metrics(with_common), read_metrics(without)
    assert [sorted(k for k in r if k.startswith("val@bf16/")) for r in rows] == [
        [], *[["val@bf16/arithmetic", "val@bf16/average"]] * 2]
    drop = ("val@", "timing/eval@")
    assert _stable([{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]) == _stable(plain)
    own = json.loads((with_common / "eval" / "step_000003" / "results.json").read_text())
    common = json.loads((with_common / "eval@bf16" / "step_000003" / "results.json").read_text())
    assert own["protocol"]["precision"] == "nvfp4_per_token_w1x16_bf16_bwd"
    assert common["protocol"]["precision"] == "none" and common["tasks"]["arithmetic"]["n"] == 3
    assert rows[2]["val@bf16/arithmetic"] == common["tasks"]["arithmetic"]["mean"]

    same = tmp_path / "bf16"  # the sampler is BF16 already: no second model, the own eval copied
    run_local(load_config(["recipe=bf16", *split[2:], "eval.precision=bf16", *_args(tiny_model_dir, same)]))
    rows = read_metrics(same)
    assert rows[2]["val@bf16/arithmetic"] == rows[2]["val/arithmetic"]
    assert (same / "eval@bf16" / "step_000002" / "samples.jsonl").read_bytes() == \
        (same / "eval" / "step_000002" / "samples.jsonl").read_bytes()


def test_the_common_eval_copy_follows_the_learner(tiny_model_dir, tmp_path):
    """CommonEval.refresh copies the learner's updated parameters into the eval copy; before it, they differ."""
    cfg = load_config(["recipe=bf16", "precision.sampler=nvfp4_per_token_w1x16_bf16_bwd", "trainer.max_steps=1",
                       "trainer.cpu_threads=1", "reward.fn=reward_helpers:length_reward", "eval.every=1",
                       "eval.precision=bf16", *_args(tiny_model_dir, tmp_path / "run")])
    trainer = LocalTrainer(cfg)
    trainer.setup()
    assert trainer.common_eval is not None and not trainer.common_eval.precision["patched"]
    learner = dict(trainer.model.named_parameters())
    with torch.no_grad():  # as an optimizer step would
        learner["model.layers.0.mlp.down_proj.weight"].add_(0.5)
    copy_ = dict(trainer.common_eval.model.named_parameters())
    assert any(not torch.equal(copy_[k], p) for k, p in learner.items())
    trainer.common_eval.refresh(trainer.model)
    assert all(torch.equal(copy_[k], p) for k, p in learner.items())
    assert type(trainer.common_eval.model.model.layers[0].mlp.down_proj) is torch.nn.Linear  # plain linears

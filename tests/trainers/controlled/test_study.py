"""The controlled study end to end at a small size: validation up front, the outputs, exact resumption of a
learning run from its checkpoint, parts reused (and a broken part recomputed) on a second run."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from trainers.controlled.__main__ import main
from trainers.controlled.config import ControlledConfigError, load_controlled
from trainers.controlled.learning import train
from trainers.controlled.mismatch import Mismatch
from trainers.controlled.study import run

REPO = pathlib.Path(__file__).resolve().parents[3]
STUDY = REPO / "recipes" / "studies" / "controlled.yaml"
SMALL = ["task.length=64", "task.prompts=2", "task.group=4", "policy.hidden=16", "gradient.seeds=6",
         "gradient.reference_batches=12", "gradient.snapshots=[0,2]", "gradient.chunk=4",
         "gradient.sweep={noise: [2.0], temperature: [], burst: []}", "learning.seeds=3", "learning.steps=4", "learning.eval_every=2",
         "learning.checkpoint_every=2", "stats.bootstrap=200", "stats.permutations=200"]


def test_the_bundled_study_validates_and_equals_the_code_defaults():
    cfg = load_controlled(STUDY)
    assert cfg == load_controlled(None, ["output_dir=benchmarks/controlled"])
    assert cfg.learning.seeds >= 100 and cfg.gradient.seeds >= 100
    assert 256 <= cfg.task.length <= 1024


@pytest.mark.parametrize("override, needle", [
    ("task.lenght=3", "unknown config key 'task.lenght'; did you mean 'task.length'?"),
    ("kinds=[noise,tempreature]", "valid choices: noise, temperature, burst, nvfp4"),
    ("arms=[none,none]", "without repeats"),
    ("task.vocab=12", "multiple of 16"),
    ("policy.hidden=40", "multiple of 16"),
    ("mismatch.nvfp4_recipe=nvfp5", "mismatch.nvfp4_recipe"),
    ("gradient.sweep={nvfp4: [1.0]}", "valid: noise, temperature, burst"),
    ("learning.seeds=abc", "learning.seeds='abc' must be an integer"),
    ("mismatch.burst_prob=2", "must be in [0, 1]"),
])
def test_bad_settings_are_one_line_errors(override, needle, capsys):
    with pytest.raises(ControlledConfigError) as e:
        load_controlled(STUDY, [override])
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert main([str(STUDY), override]) == 2
    assert needle in capsys.readouterr().err


def test_a_resumed_learning_run_equals_the_uninterrupted_one(tmp_path):
    cfg = load_controlled(None, SMALL)
    m = Mismatch.of("burst", cfg.mismatch)
    whole = train(cfg, m, "triage", [0, 1], steps=4)
    ckpt = tmp_path / "run.pt"
    train(cfg, m, "triage", [0, 1], steps=2, checkpoint=ckpt)  # "interrupted" after step 2
    assert torch.load(ckpt, weights_only=False)["step"] == 2
    resumed = train(cfg, m, "triage", [0, 1], steps=4, checkpoint=ckpt)
    assert resumed["exact_reward"] == whole["exact_reward"] and resumed["train_reward"] == whole["train_reward"]
    assert all(torch.equal(resumed["final_policy"]["params"][k], whole["final_policy"]["params"][k])
               for k in whole["final_policy"]["params"])
    # another arm's checkpoint is not resumed: its fingerprint differs
    other = train(cfg, m, "tis", [0, 1], steps=4, checkpoint=ckpt)
    assert other["fingerprint"] != whole["fingerprint"] and other["eval_steps"] == [0, 2, 4]


def test_end_to_end_outputs_and_resume(tmp_path):
    args = SMALL + [f"work_dir={tmp_path / 'work'}", f"output_dir={tmp_path / 'out'}"]
    cfg = load_controlled(STUDY, args)
    said = []
    results = run(cfg, say=said.append)
    out = tmp_path / "out"
    for name in ("results.json", "table.md", "gradient.png", "sweep.png", "learning.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "gradient.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((out / "results.json").read_text())
    corrected = ("none", "tis", "triage", "gate_only", "repair_only")
    assert on_disk["learning_runs"] == ["on_policy"] + [f"{k}_{a}" for k in cfg.kinds for a in corrected]
    grad = results["gradient"]
    assert [g["step"] for g in grad] == [0, 2]
    labels = [c["label"] for c in grad[0]["conditions"]]
    assert labels == ["noise σ=1", "noise σ=2", "temperature τ=1.5", "burst p=0.1 b=8",
                      "nvfp4 (nvfp4_per_token_w1x16_bf16_bwd)"]
    cond = grad[1]["conditions"][0]
    assert len(cond["arms"]["triage"]["per_seed_cosine"]) == 6 and set(cond["paired"]) == {
        "triage-tis", "triage-none", "tis-none", "none-on_policy", "gate_only-tis", "repair_only-tis"}
    table = (out / "table.md").read_text()
    for heading in ("## The injected mismatch", "## Gradient cosine", "## Paired differences", "## Magnitude sweep",
                    "## Learning curves", "## Verdicts"):
        assert heading in table
    assert not list((tmp_path / "work" / "learning").glob("*.pt"))  # checkpoints go once a run is recorded
    # a second run recomputes nothing; a broken part is recomputed
    said.clear()
    run(cfg, say=said.append)
    assert not [s for s in said if s.startswith(("step ", "learning ", "snapshots"))]
    part = tmp_path / "work" / "learning" / "noise_tis.json"
    part.write_text(part.read_text()[:50])
    said.clear()
    run(cfg, say=said.append)
    assert [s.split(":")[0] for s in said if s.startswith("learning ")] == ["learning noise_tis"]

"""``algorithm.old_log_prob``: where the update is one epoch of one mini-batch, its own forward gives the old
policy's log-probs (``auto``), one forward of the batch fewer than the no-gradient recompute, with the same step."""
from __future__ import annotations

import pathlib

import pytest
import torch

from trainers.config import ConfigError, load_config
from trainers.engines.local import LocalTrainer

HERE = pathlib.Path(__file__).parent
# one micro-batch holds the step's 8 sequences in both passes, so the recompute and the update see the same rows
# (in another order) and the tiny fp32 model gives both the same bits: the two modes must agree exactly
COMMON = ["rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=8", "logger.progress=false",
          "logger.wandb.mode=disabled", "algorithm.micro_batch_size=8", "data.arithmetic.size=16", "optim.lr=1e-3",
          "trainer.cpu_threads=1", "reward.fn=reward_helpers:length_reward"]


@pytest.fixture(autouse=True)
def _helpers_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _one_step(model_dir, out, *extra):
    trainer = LocalTrainer(load_config([f"model.path={model_dir}", f"trainer.output_dir={out}", *COMMON, *extra]))
    trainer.setup()
    forwards = []  # the decoder's forwards (the sampler's and the learner's), with or without gradients
    decoder = getattr(trainer.model, trainer.model.base_model_prefix)
    decoder.register_forward_pre_hook(lambda mod, args: forwards.append(torch.is_grad_enabled()))
    metrics = trainer.step(0)
    return metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, forwards


@pytest.mark.parametrize("recipe", [
    ["recipe=triage_bf16"],  # the TRIAGE loss: old and sampler log-probs per micro-batch
    ["recipe=bf16", "algorithm.rollout_correction.rollout_is=token"],  # TIS weights made per micro-batch
])
def test_the_updates_forward_gives_the_step_the_recompute_gives(tiny_model_dir, tmp_path, recipe):
    rec, rec_params, rec_fwd = _one_step(tiny_model_dir, tmp_path / "r", *recipe, "algorithm.old_log_prob=recompute")
    auto, auto_params, auto_fwd = _one_step(tiny_model_dir, tmp_path / "a", *recipe)
    # the recompute's no-gradient forward is gone; the update's forward (with gradients) is the only one
    assert rec_fwd.count(False) >= 1 and auto_fwd.count(False) == rec_fwd.count(False) - 1
    assert auto_fwd.count(True) == rec_fwd.count(True) == 1
    assert auto["timing/logprob_s"] == 0.0 < rec["timing/logprob_s"]
    stable = [k for k in rec if not k.startswith(("timing/", "perf/"))]
    assert sorted(stable) == sorted(k for k in auto if not k.startswith(("timing/", "perf/")))
    assert {k: auto[k] for k in stable} == {k: rec[k] for k in stable}
    assert rec["mismatch/abs_gap_mean"] > 0 and rec["actor/grad_norm"] > 0  # a step that measured and moved
    for name, p in rec_params.items():
        assert torch.equal(auto_params[name], p), name


@pytest.mark.parametrize("extra", [
    ["algorithm.micro_batch_size=2"],  # four micro-batches: each row's old log-probs land in its own place
    ["algorithm.micro_batch_size=3", "algorithm.entropy_coeff=0.01"],  # the entropy bonus from the same forward
])
def test_several_micro_batches_give_the_recomputes_step_to_rounding(tiny_model_dir, tmp_path, extra):
    """With several micro-batches the recompute (rows in order) and the update (rows permuted) pad differently,
    so the two agree to fp32 rounding, not bit for bit."""
    args = ["recipe=triage_bf16", *extra]
    rec, rec_params, _ = _one_step(tiny_model_dir, tmp_path / "r", *args, "algorithm.old_log_prob=recompute")
    auto, auto_params, _ = _one_step(tiny_model_dir, tmp_path / "a", *args)
    for key in ("mismatch/abs_gap_mean", "mismatch/neg_tail_depth", "actor/grad_norm", "actor/entropy",
                "actor/pg_loss", "triage/gated_token_frac"):
        assert auto[key] == pytest.approx(rec[key], rel=1e-4, abs=1e-7), key
    for name, p in rec_params.items():  # one AdamW step of lr 1e-3 from the same gradients, up to their rounding
        torch.testing.assert_close(auto_params[name], p, rtol=0, atol=1e-5)


def test_more_than_one_optimizer_step_or_strict_alignment_keeps_the_recompute(tiny_model_dir, tmp_path):
    assert load_config([]).algorithm.old_from_update()
    assert not load_config(["algorithm.old_log_prob=recompute"]).algorithm.old_from_update()
    for extra in (["algorithm.mini_batches=2"], ["algorithm.ppo_epochs=2"]):
        assert not load_config(extra).algorithm.old_from_update()
        metrics, _, forwards = _one_step(tiny_model_dir, tmp_path / extra[0], "recipe=bf16", *extra)
        assert forwards.count(False) >= 1 and metrics["timing/logprob_s"] > 0
    with pytest.raises(ConfigError, match="old_log_prob"):
        load_config(["algorithm.old_log_prob=never"])


@pytest.mark.gpu
def test_gpu_the_updates_forward_gives_the_step_the_recompute_gives(tiny_model_dir, tmp_path):
    """On CUDA (the graph sampler, the NVFP4 learner's Triton lane, the fused log-prob kernel, TRIAGE): the same
    rollout, and the same gap and gradient as with the recompute up to the GEMMs' rounding of rows in another
    order."""
    extra = ["recipe=triage_nvfp4", "model.device=cuda", "model.dtype=bfloat16"]
    rec, _, _ = _one_step(tiny_model_dir, tmp_path / "r", *extra, "algorithm.old_log_prob=recompute")
    auto, _, _ = _one_step(tiny_model_dir, tmp_path / "a", *extra)
    assert auto["timing/logprob_s"] == 0.0 < rec["timing/logprob_s"]
    assert auto["reward/mean"] == rec["reward/mean"] and auto["perf/response_tokens"] == rec["perf/response_tokens"]
    for key in ("mismatch/abs_gap_mean", "actor/grad_norm", "actor/entropy"):
        assert auto[key] == pytest.approx(rec[key], rel=1e-2), key
    assert rec["mismatch/abs_gap_mean"] > 0


def test_a_model_that_drops_activations_in_training_keeps_the_recompute(tiny_model_dir, tmp_path, capsys):
    """Dropout makes the update's forward another function than the old policy's: ``auto`` recomputes there."""
    import json
    import shutil

    from trainers.engines.local.update import dropout_sources

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1), torch.nn.Dropout(0.0))
    assert dropout_sources(net) == ["1"]
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    conf = json.loads((model_dir / "config.json").read_text())
    assert conf["attention_dropout"] == 0.0  # Qwen3's: the default path above takes the update's forward
    (model_dir / "config.json").write_text(json.dumps({**conf, "attention_dropout": 0.1}))
    metrics, _, forwards = _one_step(model_dir, tmp_path / "run", "recipe=bf16")
    assert "the model drops activations in training (config.attention_dropout=0.1): the old log-probs are " \
           "recomputed" in capsys.readouterr().err
    assert metrics["timing/logprob_s"] > 0 and forwards.count(True) == 1

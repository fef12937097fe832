"""CPU tests of engine=verl: overrides vs verl's Hydra config, worker patch, parquet data, launch refusal."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch

pytest.importorskip("verl")

from minite_kernels.recipes import PrecisionRecipe, get_qlinear_params
from trainers.config import ConfigError, load_config
from trainers.engines import verl as engine
from trainers.engines import verl_patch
from trainers.engines.verl_data import example_to_row, write_verl_data

VERL_CONFIG_DIR = pathlib.Path(__import__("verl").__file__).parent / "trainer" / "config"


def _cfg(tmp_path: pathlib.Path, recipe: str, *extra: str):
    return load_config(
        [
            f"recipe={recipe}",
            "engine=verl",
            f"trainer.output_dir={tmp_path / 'run'}",
            "data.arithmetic.size=40",
            *extra,
        ]
    )


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _flat_keys(node, prefix=""):
    from omegaconf import DictConfig

    out = set()
    for k in node:
        key = f"{prefix}{k}"
        out.add(key)
        v = node._get_node(k)
        if isinstance(v, DictConfig):
            out |= _flat_keys(v, key + ".")
    return out


# ---------------------------------------------------------------------------------------------- overrides


@pytest.mark.parametrize("recipe", ["triage_nvfp4", "tis_nvfp4", "nvfp4", "bf16", "triage_bf16",
                                    "triage_rollout_nvfp4"])
def test_every_override_key_exists_in_verls_generated_config(tmp_path, recipe):
    """Each non-'+' override names a key of verl 0.9.1's _generated_ppo_trainer.yaml; '+' ones do not."""
    from omegaconf import OmegaConf

    generated = _flat_keys(OmegaConf.load(VERL_CONFIG_DIR / "_generated_ppo_trainer.yaml"))
    ov = engine.build_verl_overrides(_cfg(tmp_path, recipe))
    assert len(ov) > 50
    for item in ov:
        key = item.split("=", 1)[0]
        if key.startswith("+"):
            assert key[1:] not in generated, f"{item}: '+' used on an existing key"
        else:
            assert key in generated, f"{item}: not a key of verl's config"
    assert len({i.split("=", 1)[0].lstrip("+") for i in ov}) == len(ov)  # no key emitted twice


def test_triage_overrides_compose_and_pass_verl_validation(tmp_path):
    """Compose with verl's own Hydra config, run main_ppo's validate_config and build the actor dataclass
    (the vLLM rollout: NVFP4 served as W4A16 through verl's QAT weight path)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from triage.verl import RAW_RATIO_THRESHOLD, TriagePolicyLossConfig

    cfg = _cfg(
        tmp_path,
        "triage_nvfp4",
        "+algorithm.triage.repair_coef=0.05",
        "rollout.n=8",
        "rollout.prompts_per_step=16",
        "algorithm.mini_batches=2",
        "verl.n_gpus_per_node=8",
        "verl.rollout=vllm",
        "logger.wandb.mode=offline",
    )
    c = _compose(engine.build_verl_overrides(cfg))
    validate_config(c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
    assert not need_critic(c) and not need_reference_policy(c)

    a = c.actor_rollout_ref
    assert c.algorithm.adv_estimator == "grpo"
    assert a.rollout.n == 8 and c.data.train_batch_size == 16 and a.actor.ppo_mini_batch_size == 8
    assert a.rollout.name == "vllm" and a.rollout.logprobs_mode == "processed_logprobs"
    assert a.rollout.calculate_log_probs is True
    assert a.actor.policy_loss.loss_mode == "triage"
    assert a.actor.loss_agg_mode == "seq-mean-token-mean"
    rc = c.algorithm.rollout_correction
    assert rc.rollout_is == "token" and rc.rollout_is_threshold == RAW_RATIO_THRESHOLD
    assert rc.rollout_is_batch_normalize is False
    assert list(a.model.external_lib) == ["trainers.engines.verl_patch", "triage.verl"]
    assert c.reward.custom_reward_function.path == "pkg://trainers.engines.verl_patch"
    assert c.reward.custom_reward_function.name == "compute_score"
    env = c.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.MINITE_SAMPLER_RECIPE == "nvfp4_per_token_w1x16_bf16_bwd"
    # the learner recipe travels as its fields, which rebuild the very object the driver resolved
    sent = PrecisionRecipe.from_dict(json.loads(env.MINITE_RECIPE))
    assert sent == get_qlinear_params("nvfp4_per_token_w1x16_bf16_bwd")
    # its kernel choice with it: a worker's linears run the kernels the driver's recipe names
    exact = sent.with_kernels(gemm="exact", decode="off")
    assert PrecisionRecipe.from_dict(json.loads(engine.resolved_recipe_fields(json.dumps(exact.to_dict())))) == exact
    assert all(isinstance(v, str) for v in env.values())
    # verl's tracker writes wandb/ into the run directory, as engine=local does, not the working directory
    assert env.WANDB_MODE == "offline" and env.WANDB_DIR == str((tmp_path / "run").resolve())
    assert a.actor.fsdp_config.qat.enable is True and a.actor.fsdp_config.qat.mode == "w4a16"
    assert a.rollout.qat.enable is True  # vLLM's quant config follows the actor's (interpolation)
    assert a.actor.optim.lr == cfg.optim.lr and list(a.actor.optim.betas) == list(cfg.optim.betas)
    assert c.trainer.total_training_steps == cfg.trainer.max_steps
    assert c.trainer.default_local_dir == str((tmp_path / "run" / "checkpoints").resolve())
    assert c.data.train_files == str((tmp_path / "run" / "data" / "train.parquet").resolve())

    actor = omega_conf_to_dataclass(a.actor)
    assert isinstance(actor.policy_loss, TriagePolicyLossConfig)
    assert actor.policy_loss.triage.repair_coef == 0.05
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)


def test_minite_rollout_is_the_default_and_passes_verl_validation(tmp_path):
    """rollout.name=minite with the learner's recipe in engine_kwargs.minite: composes with verl's config, passes
    validate_config, builds verl's RolloutConfig, and resolves to the registered BaseRollout."""
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig
    from verl.workers.rollout.base import get_rollout_class

    from rollout.verl_backend.rollout import MiniteRollout, check_rollout_config
    from rollout.verl_backend.settings import MiniteRolloutSettings

    regex = r"re:layers\.0\."
    cfg = _cfg(tmp_path, "triage_nvfp4", "rollout.n=8", "rollout.prompts_per_step=16", "rollout.batch_size=32",
               f"precision.exclude=[lm_head,'{regex}']")
    ov = engine.build_verl_overrides(cfg)
    assert "actor_rollout_ref.rollout.name=minite" in ov
    assert not any("gpu_memory_utilization" in o or ".qat." in o for o in ov)
    c = _compose(ov)
    validate_config(c, use_reference_policy=False, use_critic=False)
    a = c.actor_rollout_ref
    rc = omega_conf_to_dataclass(a.rollout)
    assert isinstance(rc, RolloutConfig) and rc.name == "minite" and rc.dtype == "bfloat16"
    assert rc.checkpoint_engine.backend == "naive" and rc.logprobs_mode == "processed_logprobs"
    assert rc.calculate_log_probs is True and rc.n == 8
    check_rollout_config(rc)
    assert get_rollout_class(rc.name, rc.mode) is MiniteRollout
    settings = MiniteRolloutSettings.from_rollout_config(rc)
    assert settings == engine.minite_settings(cfg)
    # the sampler recipe travels as its fields, which rebuild the recipe the driver resolved
    assert PrecisionRecipe.from_dict(settings.recipe) == get_qlinear_params("nvfp4_per_token_w1x16_bf16_bwd")
    assert settings.batch_size == 32
    assert settings.exclude == ("lm_head", regex)  # a regex arrives as written
    assert c.ray_kwargs.ray_init.runtime_env.env_vars.MINITE_EXCLUDE == f"lm_head,{regex}"
    assert a.actor.fsdp_config.qat.enable is False  # the learner's linears stay minite's, no W4A16 packing
    assert list(a.model.external_lib) == ["trainers.engines.verl_patch", "triage.verl",
                                          "rollout.verl_backend.register"]
    plan = engine.sampler_plan(cfg)
    assert plan.mode == "minite" and "nvfp4_per_token_w1x16_bf16_bwd" in plan.notes[0] and len(plan.notes) == 1

    split = engine.minite_settings(_cfg(tmp_path, "triage_rollout_nvfp4"))  # BF16 learner, NVFP4 sampler
    assert split.recipe["name"] == "nvfp4_per_token_w1x16_bf16_bwd"
    assert "differs from precision.learner=bf16" in engine.sampler_plan(_cfg(tmp_path, "triage_rollout_nvfp4")).notes[1]
    assert engine.minite_settings(_cfg(tmp_path, "bf16")).recipe == "bf16"  # plain linears: no recipe object
    assert engine.minite_settings(_cfg(tmp_path, "bf16")).fp4_weights == "auto"
    assert engine.minite_settings(_cfg(tmp_path, "bf16", "rollout.fp4_weights=off")).fp4_weights == "off"
    with pytest.raises(ConfigError, match="one GPU per replica.*verl.rollout=vllm"):
        engine.build_verl_overrides(_cfg(tmp_path, "bf16", "verl.tensor_model_parallel_size=2"))
    with pytest.raises(ConfigError, match="verl.rollout='vlm' is not valid; did you mean 'vllm'"):
        _cfg(tmp_path, "bf16", "verl.rollout=vlm")


def test_the_embedded_models_directory_builds_verls_model_config(tmp_path):
    """verl's TaskRunner first turns ``actor_rollout_ref.model`` into ``HFModelConfig``, which asserts that the
    directory's config.json names one architecture: the step the first GPU run stopped at, with a cache that
    did not name it."""
    import json

    from verl.utils.config import omega_conf_to_dataclass

    from rollout.models import load_model_and_tokenizer, smollm2_cache_dir

    load_model_and_tokenizer("smollm2-135m-instruct")  # what run_verl does before launching verl
    cfg = _cfg(tmp_path, "triage_nvfp4")
    ov = engine.build_verl_overrides(cfg)
    assert f"actor_rollout_ref.model.path='{smollm2_cache_dir()}'" in ov
    assert json.loads((smollm2_cache_dir() / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model_config = omega_conf_to_dataclass(_compose(ov).actor_rollout_ref.model)
    assert model_config.architectures == ["LlamaForCausalLM"] and model_config.local_path == str(smollm2_cache_dir())
    # the model's attention is ours (sdpa), not verl's default flash_attention_2, which needs the flash-attn
    # package: the step the second GPU run stopped at
    assert model_config.hf_config._attn_implementation == "sdpa"
    assert model_config.use_remove_padding is False  # packed rows need flash attention's varlen kernels


def test_micro_batch_tokens_maps_to_verls_dynamic_batch_size(tmp_path):
    c = _compose(engine.build_verl_overrides(_cfg(tmp_path, "bf16", "algorithm.micro_batch_tokens=12288")))
    a = c.actor_rollout_ref
    assert a.actor.use_dynamic_bsz is True and a.actor.ppo_max_token_len_per_gpu == 12288
    # verl's log-prob passes follow the actor's setting through its own interpolation
    assert a.rollout.log_prob_use_dynamic_bsz is True and a.rollout.log_prob_max_token_len_per_gpu == 12288
    plain = _compose(engine.build_verl_overrides(_cfg(tmp_path, "bf16")))
    assert plain.actor_rollout_ref.actor.use_dynamic_bsz is False


def test_tis_and_bf16_recipes_map_to_verls_own_tis_and_plain_vllm(tmp_path):
    tis = _compose(engine.build_verl_overrides(_cfg(tmp_path, "tis_nvfp4")))
    assert tis.algorithm.rollout_correction.rollout_is == "token"
    assert tis.algorithm.rollout_correction.rollout_is_threshold == 2.0
    assert tis.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert tis.actor_rollout_ref.actor.policy_loss._target_ == "verl.workers.config.PolicyLossConfig"

    bf16 = _compose(engine.build_verl_overrides(_cfg(tmp_path, "bf16", "logger.wandb.mode=disabled")))
    assert bf16.algorithm.rollout_correction.rollout_is is None  # metrics only
    assert bf16.actor_rollout_ref.actor.fsdp_config.qat.enable is False
    assert bf16.ray_kwargs.ray_init.runtime_env.env_vars.MINITE_RECIPE == "bf16"
    assert list(bf16.trainer.logger) == ["console", "file"]
    assert list(bf16.actor_rollout_ref.model.external_lib) == ["trainers.engines.verl_patch",
                                                               "rollout.verl_backend.register"]


def test_extra_overrides_replace_and_reward_hook(tmp_path):
    cfg = _cfg(
        tmp_path,
        "bf16",
        "reward.fn=my_pkg.rewards:score",
        "verl.extra=[trainer.val_before_train=true,"
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager=true]",
    )
    ov = engine.build_verl_overrides(cfg)
    assert "trainer.val_before_train=true" in ov and "trainer.val_before_train=false" not in ov
    c = _compose(ov)
    assert c.reward.custom_reward_function.path == "pkg://my_pkg.rewards"
    assert c.reward.custom_reward_function.name == "score"
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager is True


def test_sampler_plan_and_bad_sampler_recipe(tmp_path):
    vllm = "verl.rollout=vllm"
    plan = engine.sampler_plan(_cfg(tmp_path, "triage_nvfp4", vllm))
    assert plan.mode == "nvfp4_w4a16"  # 1x16 weight blocks: the learner's layout is vLLM's, activations differ
    assert not any("16x16" in n for n in plan.notes) and any("activations" in n for n in plan.notes)
    tiles = engine.sampler_plan(_cfg(tmp_path, "triage_nvfp4", "precision=nvfp4_per_token_bf16_bwd", vllm))
    assert any("16x16" in n for n in tiles.notes)
    w4a16 = engine.sampler_plan(_cfg(tmp_path, "bf16", "precision=w4a16_nvfp4", vllm))
    assert w4a16.mode == "nvfp4_w4a16" and len(w4a16.notes) == 1  # same 1x16 weights, BF16 activations
    with pytest.raises(ConfigError, match="MXFP8.*verl.rollout=minite runs any recipe"):
        engine.build_verl_overrides(_cfg(tmp_path, "bf16", "precision=mxfp8", vllm))
    minite = engine.sampler_plan(_cfg(tmp_path, "bf16", "precision=mxfp8"))  # the learner's recipe, whatever it is
    assert minite.mode == "minite" and minite.recipe == "mxfp8"
    with pytest.raises(ConfigError, match="must divide"):
        engine.build_verl_overrides(
            _cfg(tmp_path, "bf16", "rollout.prompts_per_step=6", "algorithm.mini_batches=4")
        )


def test_quantization_config_matches_compressed_tensors_w4a16():
    q = engine.quantization_config(engine.VERL_IGNORE_DEFAULT)
    g = q["config_groups"]["group_0"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "nvfp4-pack-quantized"
    assert (
        g["weights"]["group_size"] == 16 and g["weights"]["num_bits"] == 4 and g["weights"]["type"] == "float"
    )
    assert g["input_activations"] is None  # W4A16
    assert q["ignore"] == ["lm_head", "embed_tokens", "re:.*mlp.gate$"]


# ---------------------------------------------------------------------------------------------- worker patch


class _EngineConfig:
    def __init__(self, forward_only: bool) -> None:
        self.forward_only = forward_only


def _fake_engine_cls(tokenizer_dir):
    from rollout.models import tiny_random_qwen3

    class FakeEngine:
        def __init__(self, forward_only: bool = False) -> None:
            self.engine_config = _EngineConfig(forward_only)
            self.qat_calls = 0

        def _build_module(self):
            return tiny_random_qwen3(tokenizer_dir, seed=0)[0]

        def _apply_qat(self, module):
            self.qat_calls += 1
            return module

    return FakeEngine


def test_install_names_the_recipes_only_where_the_driver_set_one():
    """A worker (MINITE_RECIPE set) gets a warning naming both recipes; a process without it (the driver, which
    loads the entry point too) an info line that says its modules keep their linears, never "learner recipe bf16"."""
    import logging

    recipe = json.dumps({"name": "nvfp4_per_token_w1x16_bf16_bwd"})
    level, msg = verl_patch.install_message({verl_patch.ENV_RECIPE: recipe,
                                             verl_patch.ENV_SAMPLER_RECIPE: "nvfp4_per_token_w1x16_bf16_bwd"})
    assert level == logging.WARNING
    assert msg.endswith("(learner recipe nvfp4_per_token_w1x16_bf16_bwd, sampler recipe nvfp4_per_token_w1x16_bf16_bwd)")
    level, msg = verl_patch.install_message({})
    assert level == logging.INFO and "$MINITE_RECIPE is unset in this process" in msg and "bf16" not in msg


def test_patch_swaps_linears_and_keeps_state_dict(qwen3_tokenizer_dir, monkeypatch):
    from minite_kernels.modules import Linear

    monkeypatch.setenv(verl_patch.ENV_RECIPE, "nvfp4_per_token_bf16_bwd")
    monkeypatch.setenv(verl_patch.ENV_BACKEND, "emulated")
    monkeypatch.delenv(verl_patch.ENV_SAMPLER_RECIPE, raising=False)
    FakeEngine = _fake_engine_cls(qwen3_tokenizer_dir)
    reference = FakeEngine()._build_module()
    assert verl_patch.wrap_engine_class(FakeEngine) is True
    assert verl_patch.wrap_engine_class(FakeEngine) is False  # idempotent

    module = FakeEngine()._build_module()
    ref_sd, sd = reference.state_dict(), module.state_dict()
    assert list(sd) == list(ref_sd)  # same names, same order: FSDP2 load + weight sync unchanged
    assert all(torch.equal(sd[k], ref_sd[k]) for k in sd)
    swapped = [n for n, m in module.named_modules() if isinstance(m, Linear)]
    linears = [n for n, m in reference.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    assert sorted(swapped) == sorted(linears) and len(swapped) == 2 * 7  # q,k,v,o,gate,up,down x 2 layers
    assert not isinstance(module.lm_head, Linear)

    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        out, ref = module(ids).logits, reference(ids).logits
    assert torch.isfinite(out).all() and not torch.equal(out, ref)  # NVFP4 forward differs from fp32
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < 0.5, rel  # quantization noise, not a broken model

    ref_engine = FakeEngine(forward_only=True)  # reference policy: left alone by default
    assert not any(isinstance(m, Linear) for m in ref_engine._build_module().modules())
    monkeypatch.setenv(verl_patch.ENV_PATCH_REF, "1")
    assert any(isinstance(m, Linear) for m in ref_engine._build_module().modules())


def test_patch_bf16_noop_and_qat_guard(qwen3_tokenizer_dir, monkeypatch):
    from minite_kernels.modules import Linear

    FakeEngine = _fake_engine_cls(qwen3_tokenizer_dir)
    verl_patch.wrap_engine_class(FakeEngine)
    monkeypatch.setenv(verl_patch.ENV_RECIPE, "bf16")
    e = FakeEngine()
    m = e._build_module()
    assert not any(isinstance(x, Linear) for x in m.modules())
    e._apply_qat(m)
    assert e.qat_calls == 1  # launched without our sampler env: verl's QAT runs as usual
    monkeypatch.setenv(verl_patch.ENV_SAMPLER_RECIPE, "nvfp4_per_token_bf16_bwd")
    assert e._apply_qat(m) is m and e.qat_calls == 1  # QAT only packs weights for vLLM


def test_install_wraps_the_real_fsdp_engine_once():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    assert verl_patch.install() is False  # importing the module already installed it
    assert getattr(FSDPEngine, "_minite_verl_patched", False)
    assert FSDPEngine._build_module.__wrapped__.__qualname__ == "FSDPEngine._build_module"
    assert FSDPEngine._apply_qat.__wrapped__.__qualname__ == "FSDPEngine._apply_qat"


def test_compute_score_delegates_to_project_scorers():
    assert verl_patch.compute_score("arithmetic", "3 + 5 = 8. The answer is 8", "8") == 1.0
    assert verl_patch.compute_score("arithmetic", "The answer is 9", "8") == 0.0
    assert (
        verl_patch.compute_score("openai/gsm8k", "so #### 72", "72", extra_info={"index": 0}, num_turns=1)
        == 1.0
    )


# ---------------------------------------------------------------------------------------------- data + launch


def test_verl_trains_on_engine_locals_prompts_in_its_order(tmp_path):
    """train.parquet is engine=local's PromptSchedule, step by step (both data.shuffle settings, past one epoch of
    the 40 examples), read by verl unshuffled; a longer run's file starts with the shorter run's rows, so a run
    resumed with more steps continues where it stopped."""
    import pyarrow.parquet as pq

    from trainers.data import PromptSchedule, load_examples

    for shuffle in ("true", "false"):
        cfg = _cfg(tmp_path, "bf16", f"data.shuffle={shuffle}", "trainer.seed=3", "rollout.prompts_per_step=8",
                   "trainer.max_steps=6")
        schedule = PromptSchedule(load_examples(cfg.data), 8, 3, shuffle == "true")
        want = [ex.question for s in range(6) for ex in schedule.batch(s)]  # 48 rows: past the 40 examples
        train, _ = write_verl_data(cfg.data, tmp_path / shuffle, steps=6, prompts_per_step=8, seed=3)
        got = [row["extra_info"]["question"] for row in pq.read_table(train).to_pylist()]
        assert got == want
        short, _ = write_verl_data(cfg.data, tmp_path / f"{shuffle}_short", steps=2, prompts_per_step=8, seed=3)
        assert [r["extra_info"]["question"] for r in pq.read_table(short).to_pylist()] == want[:16]
        ov = engine.build_verl_overrides(cfg)
        assert "data.shuffle=false" in ov and "data.train_batch_size=8" in ov
        in_file_order = [ex.question for ex in load_examples(cfg.data)]
        assert (want[:40] == in_file_order) == (shuffle == "false")  # data.shuffle acts in the schedule


def test_parquet_rows_load_with_verls_rlhf_dataset(tmp_path, qwen3_tokenizer_dir):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = _cfg(tmp_path, "bf16", "data.instruction=Answer with a number.")
    train, val = write_verl_data(cfg.data, tmp_path / "d", steps=9, prompts_per_step=4, seed=0)
    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    ds = RLHFDataset(
        str(train),
        tok,
        OmegaConf.create(
            {
                "max_prompt_length": 64,
                "filter_overlong_prompts": True,
                "filter_overlong_prompts_workers": 1,
                "cache_dir": str(tmp_path / "cache"),
            }
        ),
    )
    assert len(ds) == 36  # 9 steps of 4 prompts
    row = ds[0]
    assert row["data_source"] == "arithmetic" and row["ability"] == "math"
    assert row["raw_prompt"][-1]["role"] == "user" and row["raw_prompt"][-1]["content"].endswith(
        "\nAnswer with a number."
    )
    assert row["reward_model"] == {"style": "rule", "ground_truth": row["reward_model"]["ground_truth"]}
    assert int(row["reward_model"]["ground_truth"]) == eval(row["extra_info"]["question"][8:-1])
    import pyarrow.parquet as pq

    assert pq.read_table(val).num_rows == 4


def test_example_row_has_system_prompt(tmp_path):
    from trainers.data import Example

    cfg = _cfg(tmp_path, "bf16", "data.system_prompt=Be brief.", "data.instruction=null")
    row = example_to_row(Example(3, "What is 2 + 2?", "4", "arithmetic", {"level": 1}), cfg.data, "train")
    assert row["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert row["extra_info"] == {"split": "train", "index": 3, "question": "What is 2 + 2?", "level": 1}


def test_refuses_without_cuda_or_vllm(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(engine.VerlUnavailable) as e:
        engine.run_verl(_cfg(tmp_path, "bf16", "verl.rollout=vllm"))
    msg = str(e.value)
    assert "CUDA" in msg and "engine=local" in msg
    if __import__("importlib").util.find_spec("vllm") is None:
        assert "vLLM" in msg and "verl.rollout=minite" in msg
    assert not (tmp_path / "run").exists()  # nothing written before refusing
    with pytest.raises(engine.VerlUnavailable) as e:  # the default minite rollout needs no vLLM, only its plugin
        engine.run_verl(_cfg(tmp_path, "bf16"))
    assert "CUDA" in str(e.value) and "vLLM" not in str(e.value) and "minite" not in str(e.value)
    monkeypatch.setattr(engine, "_minite_plugin_installed", lambda: False)
    with pytest.raises(engine.VerlUnavailable, match="rollout.verl_backend.register.*pip install -e"):
        engine.check_available("minite")

    from trainers.grpo import main

    assert main(["recipe=bf16", "engine=verl", f"trainer.output_dir={tmp_path / 'run'}"]) == 1
    assert "engine=local runs everywhere" in capsys.readouterr().err


def test_dry_run_writes_data_and_overrides(tmp_path, capsys):
    cfg = _cfg(tmp_path, "triage_nvfp4", "verl.dry_run=true")
    assert engine.run_verl(cfg) == 0
    run = tmp_path / "run"
    saved = (run / engine.OVERRIDES_FILE).read_text().splitlines()
    assert saved == engine.build_verl_overrides(cfg)
    out = capsys.readouterr()
    assert out.out.splitlines() == saved
    assert "actor_rollout_ref.rollout.name=minite" in saved and "# sampler (minite)" in out.err
    assert (run / "data" / "train.parquet").is_file() and (run / "data" / "val.parquet").is_file()
    assert not (run / "data" / engine.QUANT_CONFIG_FILE).exists()  # vLLM's W4A16 config: not for minite
    vllm = _cfg(tmp_path, "triage_nvfp4", "verl.dry_run=true", "verl.rollout=vllm",
                f"trainer.output_dir={tmp_path / 'run_vllm'}")
    assert engine.run_verl(vllm) == 0
    assert "actor_rollout_ref.rollout.name=vllm" in capsys.readouterr().out.splitlines()
    assert (tmp_path / "run_vllm" / "data" / engine.QUANT_CONFIG_FILE).is_file()
    assert "verl.trainer.main_ppo" in (run / engine.COMMAND_FILE).read_text()
    from trainers.config import from_yaml_file

    assert from_yaml_file(run / "config.yaml") == cfg  # the resolved config round-trips
    assert not [p for p in run.rglob("*.tmp")]  # atomic writes left no temp files


def test_a_recipe_only_the_driver_knows_reaches_the_workers_whole(qwen3_tokenizer_dir, monkeypatch):
    """The worker hook builds the recipe from the fields the driver sent (``resolved_recipe_fields``): a recipe
    that no worker's registry holds patches the model as the driver's object would."""
    from minite_kernels.modules import Linear
    from minite_kernels.recipes import RecipeError
    from rollout.models import tiny_random_qwen3

    base = get_qlinear_params("nvfp4_per_token_bf16_bwd")
    custom = dataclasses.replace(base, name="driver_only_recipe", description="registered nowhere")
    with pytest.raises(RecipeError, match="unknown precision recipe 'driver_only_recipe'"):
        get_qlinear_params("driver_only_recipe")
    fields = json.dumps(custom.to_dict())
    assert engine.resolved_recipe_fields("bf16") == "bf16"
    assert PrecisionRecipe.from_dict(json.loads(engine.resolved_recipe_fields("nvfp4_per_token_bf16_bwd"))) == base
    monkeypatch.setenv(verl_patch.ENV_RECIPE, fields)
    monkeypatch.setenv(verl_patch.ENV_BACKEND, "emulated")
    monkeypatch.delenv(verl_patch.ENV_SAMPLER_RECIPE, raising=False)
    assert verl_patch.recipe_label(verl_patch.learner_recipe()) == "driver_only_recipe"
    module = verl_patch.quantize_hf_module(tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)[0])
    assert getattr(module, "_minite_verl_patched") == "driver_only_recipe"
    recipes = {m.recipe for m in module.modules() if isinstance(m, Linear)}
    assert recipes == {custom}


def test_log_prob_micro_batches_map_to_verls_log_prob_passes(tmp_path):
    c = _compose(engine.build_verl_overrides(_cfg(
        tmp_path, "bf16", "algorithm.log_prob_micro_batch_size=16", "algorithm.log_prob_micro_batch_tokens=32768")))
    a = c.actor_rollout_ref
    for role in (a.rollout, a.ref):
        assert role.log_prob_micro_batch_size_per_gpu == 16
        assert role.log_prob_use_dynamic_bsz is True and role.log_prob_max_token_len_per_gpu == 32768
    assert a.actor.ppo_micro_batch_size_per_gpu == 4 and a.actor.use_dynamic_bsz is False  # the update keeps its own
    plain = _compose(engine.build_verl_overrides(_cfg(tmp_path, "bf16"))).actor_rollout_ref
    assert plain.rollout.log_prob_micro_batch_size_per_gpu == plain.actor.ppo_micro_batch_size_per_gpu
    assert plain.rollout.log_prob_use_dynamic_bsz is False

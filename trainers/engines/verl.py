"""engine=verl: turn a training recipe into ``verl.trainer.main_ppo`` overrides and launch it (verl 0.9.1).

    python -m trainers.grpo recipe=triage_nvfp4 engine=verl model.path=Qwen/Qwen3-4B data.task=gsm8k \\
        verl.n_gpus_per_node=8 verl.tensor_model_parallel_size=2
    python -m trainers.grpo recipe=triage_nvfp4 engine=verl verl.dry_run=true   # print + save overrides only

What the translation does (see ``build_verl_overrides``):

* GRPO (``algorithm.adv_estimator=grpo``, group size ``actor_rollout_ref.rollout.n``), batch sizes, PPO
  epochs/mini/micro-batches, AdamW settings, clip ratios, entropy coefficient, temperature/top-p/top-k,
  seeds, step count, checkpoint frequency/dir, resume mode, wandb/console/file loggers.
* Loss: ``actor_rollout_ref.actor.policy_loss.loss_mode=<algorithm.loss_mode>`` and the loss mode's own
  overrides and plugin module (``trainers.losses``); for ``triage`` the
  policy-loss config becomes ``triage.verl.TriagePolicyLossConfig`` carrying ``algorithm.triage`` and the
  sampler log-probs travel by helper C's route (c): ``rollout.calculate_log_probs=true``,
  ``algorithm.rollout_correction.rollout_is=token`` with an untruncated threshold (1e9), no batch
  normalisation; TRIAGE recovers ``delta = log w`` and applies its own TIS cap, gate and repair. Non-TRIAGE
  recipes with ``algorithm.rollout_correction.rollout_is`` get verl's own TIS (e.g. token, C = 2).
* Sampler (``verl.rollout``, default ``minite``): ``actor_rollout_ref.rollout.name=minite``, the project's own
  sampler as a verl rollout backend (``rollout.verl_backend``, registered through the ``verl.plugins`` entry
  point), or verl's ``vllm`` / ``sglang`` servers; all with ``logprobs_mode=processed_logprobs`` (log-probs after
  temperature, as the local engine).
* Learner precision: ``actor_rollout_ref.model.external_lib=trainers.engines.verl_patch`` patches
  ``FSDPEngine._build_module`` in every worker; the recipe travels as ``MINITE_RECIPE`` (the resolved recipe's
  fields as JSON, not its name, so each worker builds the driver's recipe object; plus
  ``MINITE_SAMPLER_RECIPE``, ``MINITE_EXCLUDE``, ``MINITE_BACKEND``) in
  ``+ray_kwargs.ray_init.runtime_env.env_vars``.
* Sampler precision with ``verl.rollout=minite``: the sampler's model (its own copy, in each actor worker, in
  BF16, the FSDP learner's forward dtype) is quantized with ``precision.sampler`` by ``quantize_model``, as the
  local engine's sampler copy is: W4A4 NVFP4 with the learner's quantizers for the NVFP4 recipes, plain BF16 for
  ``bf16``. The settings travel as a typed object, ``rollout.verl_backend.settings.MiniteRolloutSettings``, in
  ``+actor_rollout_ref.rollout.engine_kwargs.minite.*`` (the resolved recipe's fields, exclude, backend, alignment, and
  ``rollout.sampler`` / ``batch_size`` / ``norm_quant`` / ``fp4_weights``). verl's QAT stays off; each weight update writes the
  learner's full tensors into the sampler's parameters in place and re-quantizes them
  (``checkpoint_engine.backend=naive``). One GPU per replica (``verl.tensor_model_parallel_size=1``).
* Sampler precision with ``verl.rollout=vllm`` (or ``sglang``): ``bf16`` -> vLLM in BF16. An NVFP4 recipe -> verl's NVFP4 weight
  path (``actor_rollout_ref.actor.fsdp_config.qat.enable=true, mode=w4a16``, a compressed-tensors
  ``nvfp4-pack-quantized`` config written next to the data): at every weight sync verl's ``QATQuantizer``
  packs each decoder linear weight as NVFP4 (E2M1 values, E4M3 scale per 1x16 block, FP32 global scale per
  tensor, the minimum taken across fused q/k/v and gate/up) and vLLM serves it as W4A16
  (``compressed-tensors`` W4A16-FP4, a Marlin kernel, on Hopper and on Blackwell alike). ``verl_patch``
  keeps verl's own ``QATLinear`` off the learner, whose linears follow ``precision.learner``.

Mismatch consequences with vLLM (documented, not hidden): the vLLM sampler is *not* numerically the learner's
recipe.
It quantizes weights in 1x16 blocks with a per-tensor global scale (the learner's NVFP4 recipes use 16x16
weight tiles) and keeps activations in BF16 (the learner's ``nvfp4_per_token*`` recipes quantize
activations per token). The train/rollout gap that TIS/TRIAGE see is therefore larger than on engine=local,
where sampler and learner share one model object; the ``mismatch/*`` and ``rollout_corr/*`` metrics
measure it. True W4A4 NVFP4 sampling (FP4 tensor cores on Blackwell; ``--linear-backend emulation`` on
other GPUs) needs static activation global scales (``input_global_scale``) in the served checkpoint
(verl's ``qat.mode=w4a4`` restores them from ``model*.safetensors``); this project does not export such a
calibrated checkpoint yet, so W4A4 is not emitted (pass ``verl.extra`` overrides to try it by hand).

Verified on CPU: every override composes with verl's own Hydra config (``verl/trainer/config``) and
passes verl's ``validate_config`` (the check ``main_ppo`` runs before Ray starts), incl. instantiating
``TriagePolicyLossConfig`` and verl's ``RolloutConfig`` with ``name=minite``; data files load with
``RLHFDataset``; the refusal and the dry run work; the minite backend's contract (tests/rollout).
Not verified: an actual verl run (needs a CUDA GPU, and vLLM for verl.rollout=vllm; the development machines
have neither).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import shlex
import subprocess
import sys
from typing import Any

from minite_util.fileio import atomic_write_text
from rollout.precision import resolved_recipe, resolved_recipe_name
from trainers.config import Config, ConfigError, to_yaml
from trainers.losses import loss_mode

PATCH_MODULE = "trainers.engines.verl_patch"
MINITE_REGISTER = "rollout.verl_backend.register"  # the verl.plugins entry point of the minite rollout
REWARD_PATH = f"pkg://{PATCH_MODULE}"
REWARD_NAME = "compute_score"
OVERRIDES_FILE = "verl_overrides.txt"
COMMAND_FILE = "verl_command.sh"
QUANT_CONFIG_FILE = "nvfp4_w4a16_quantization_config.json"
VERL_IGNORE_DEFAULT = ("lm_head", "embed_tokens", "re:.*mlp.gate$")
_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class VerlUnavailable(RuntimeError):
    """engine=verl cannot run on this machine; the message says what is missing."""


# --------------------------------------------------------------------------------------------- helpers


def _q(value: Any) -> str:
    """A Hydra override value: bools/numbers/None as literals, strings quoted when not plain."""
    from rollout.verl_backend.settings import hydra_value

    return hydra_value(value)


def _qs(value: Any) -> str:
    """Always a quoted string (env vars must reach Ray as strings)."""
    from rollout.verl_backend.settings import hydra_value

    return hydra_value(value, quote=True)


def data_dir(cfg: Config) -> pathlib.Path:
    return pathlib.Path(cfg.verl.data_dir) if cfg.verl.data_dir else cfg.output_dir / "data"


def resolve_model_path(cfg: Config) -> str:
    """verl needs an HF directory or hub id; the embedded SmolLM2 alias maps to its safetensors cache."""
    from rollout.models import SMOLLM2_ALIASES, smollm2_cache_dir

    if str(cfg.model.path).lower() in SMOLLM2_ALIASES:
        return str(smollm2_cache_dir())
    p = pathlib.Path(cfg.model.path).expanduser()
    return str(p.resolve()) if p.exists() else str(cfg.model.path)


def resolved_recipe_fields(name: str) -> str:
    """What the workers' ``$MINITE_RECIPE`` carries: ``bf16``, or the resolved recipe's fields as JSON (its
    ``to_dict``), so that each worker builds the very recipe the driver resolved, custom recipes registered only in
    the driver included, instead of looking a name up in its own registry."""
    return "bf16" if name == "bf16" else json.dumps(resolved_recipe(name).to_dict(), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class SamplerPlan:
    """How the rollout realises ``precision.sampler`` and how far that is from the recipe."""

    recipe: str
    mode: str  # "minite" | "bf16" | "nvfp4_w4a16"
    notes: tuple[str, ...] = ()


def minite_settings(cfg: Config) -> Any:
    """The minite rollout's settings: the sampler's precision as ``engine=local`` applies it to its sampler."""
    from rollout.verl_backend.settings import MiniteRolloutSettings

    p, r = cfg.precision, cfg.rollout
    recipe = "bf16" if p.sampler == "bf16" else resolved_recipe(p.sampler).to_dict()  # the recipe itself, not its name
    return MiniteRolloutSettings(recipe=recipe, exclude=tuple(str(e) for e in p.exclude),
                                 backend=p.backend, alignment=p.alignment, sampler=r.sampler,
                                 batch_size=r.batch_size, norm_quant=r.norm_quant, fp4_weights=r.fp4_weights)


def sampler_plan(cfg: Config) -> SamplerPlan:
    name = resolved_recipe_name(cfg.precision.sampler)
    if cfg.verl.rollout == "minite":
        learner = resolved_recipe_name(cfg.precision.learner)
        what = "BF16 linears" if name == "bf16" else f"recipe {name} through minite's quantize_model"
        notes = [(f"the minite rollout samples with {what} (the learner's quantizers), in BF16 (the FSDP "
                  "learner's forward dtype)")]
        if name != learner:
            notes.append(f"precision.sampler={name} differs from precision.learner={learner}: the gap includes "
                         "the recipe difference")
        return SamplerPlan(name, "minite", tuple(notes))
    if name == "bf16":
        return SamplerPlan("bf16", "bf16", ("vLLM samples in BF16",))
    r = resolved_recipe(name)
    w, a = r.fprop.b, r.fprop.a
    if w.format == "bf16" and a.format == "bf16":
        return SamplerPlan(name, "bf16", (f"recipe {name} runs a BF16 forward; vLLM samples in BF16",))
    if w.format != "nvfp4":
        raise ConfigError(
            f"precision.sampler={cfg.precision.sampler!r} quantizes weights as {w.format}; verl's vLLM "
            "rollout offers NVFP4 W4A16 (this engine) and blockwise-128 FP8, not MXFP8. "
            "Valid choices for engine=verl with verl.rollout=vllm: "
            "bf16 or an NVFP4 recipe (python -m minite_kernels recipes); verl.rollout=minite runs any recipe"
        )
    notes = [
        (
            "vLLM serves NVFP4 W4A16 (compressed-tensors nvfp4-pack-quantized, Marlin kernel): weights in "
            "1x16 blocks with a per-tensor global scale (shared, min, across q/k/v and gate/up), "
            "activations BF16"
        )
    ]
    if tuple(w.tile or (1, 16)) != (1, 16):
        notes.append(
            f"recipe {name} quantizes learner weights in {w.tile[0]}x{w.tile[1]} tiles; the sampler "
            "uses 1x16 blocks, so quantized weights differ"
        )
    if a.format != "bf16":
        notes.append(
            f"recipe {name} quantizes activations ({a.format}, {a.scaling}); the sampler keeps BF16 "
            "activations (W4A4 needs static activation scales this project does not export)"
        )
    return SamplerPlan(name, "nvfp4_w4a16", tuple(notes))


def quantization_config(ignore: tuple[str, ...]) -> dict:
    """compressed-tensors NVFP4 W4A16 config verl injects into vLLM (``qat.quantization_config_path``)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "symmetric": True,
                    "strategy": "tensor_group",
                    "group_size": 16,
                    "dynamic": False,
                    "observer": "minmax",
                },
                "input_activations": None,
                "output_activations": None,
                "format": "nvfp4-pack-quantized",
            }
        },
        "ignore": list(ignore),
        "kv_cache_scheme": None,
    }


def _ignore_patterns(cfg: Config) -> tuple[str, ...]:
    extra = [p for p in cfg.precision.exclude if p not in VERL_IGNORE_DEFAULT]
    return VERL_IGNORE_DEFAULT + tuple(extra)


def metrics_path(cfg: Config) -> pathlib.Path:
    """``metrics.jsonl`` (verl's file logger: one ``{"step", "data"}`` line per step). verl opens it with
    "wb", so a resumed launch writes ``metrics.<k>.jsonl`` instead of truncating the earlier log."""
    p = cfg.output_dir / "metrics.jsonl"
    k = 1
    while p.exists() and p.stat().st_size > 0:
        p, k = cfg.output_dir / f"metrics.{k}.jsonl", k + 1
    return p


def worker_env(cfg: Config) -> dict[str, str]:
    """Environment for every Ray worker (recipes for verl_patch, wandb mode and directory, import path)."""
    from trainers.engines.verl_patch import ENV_BACKEND, ENV_EXCLUDE, ENV_RECIPE, ENV_SAMPLER_RECIPE

    env = {
        ENV_RECIPE: resolved_recipe_fields(cfg.precision.learner),
        ENV_SAMPLER_RECIPE: resolved_recipe_name(cfg.precision.sampler),
        ENV_EXCLUDE: ",".join(cfg.precision.exclude),
        ENV_BACKEND: cfg.precision.backend,
        "VERL_FILE_LOGGER_PATH": str(metrics_path(cfg).resolve()),
    }
    mode = cfg.logger.wandb.mode
    if mode == "auto":
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if mode != "disabled":
        env["WANDB_MODE"] = mode
        env["WANDB_DIR"] = str(cfg.output_dir.resolve())  # the run's wandb/ beside its metrics, as engine=local
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    )
    return env


def _use_v1() -> bool:
    """verl's v1 trainer needs TransferQueue; without it use the legacy RayPPOTrainer (still in 0.9.1)."""
    return importlib.util.find_spec("transfer_queue") is not None


# --------------------------------------------------------------------------------------------- overrides


def build_verl_overrides(cfg: Config) -> list[str]:
    """``verl.trainer.main_ppo`` Hydra overrides for the resolved training config ``cfg`` (pure, no I/O)."""
    if cfg.algorithm.adv_estimator != "grpo":  # pragma: no cover - schema allows only grpo today
        raise ConfigError(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: engine=verl supports grpo"
        )
    r, a, t = cfg.rollout, cfg.algorithm, cfg.trainer
    if cfg.verl.ppo_mini_batch_size is not None:
        mini = cfg.verl.ppo_mini_batch_size
    else:
        if r.prompts_per_step % a.mini_batches:
            raise ConfigError(
                f"algorithm.mini_batches={a.mini_batches} must divide "
                f"rollout.prompts_per_step={r.prompts_per_step} "
                "for engine=verl (verl splits mini-batches by prompt groups); or set verl.ppo_mini_batch_size"
            )
        mini = r.prompts_per_step // a.mini_batches
    if mini <= 0 or r.prompts_per_step % mini:
        raise ConfigError(
            f"verl.ppo_mini_batch_size={mini} must be > 0 and divide rollout.prompts_per_step="
            f"{r.prompts_per_step}"
        )
    dd = data_dir(cfg).resolve()
    out = cfg.output_dir.resolve()
    ov: dict[str, str] = {}

    def put(key: str, value: Any, *, add: bool = False, raw: bool = False) -> None:
        ov[key] = ("+" if add else "") + key + "=" + (value if raw else _q(value))

    # data
    put("data.train_files", str(dd / "train.parquet"))
    put("data.val_files", str(dd / "val.parquet"))
    put("data.train_batch_size", r.prompts_per_step)
    put("data.max_prompt_length", cfg.data.max_prompt_tokens)
    put("data.max_response_length", r.max_new_tokens)
    put("data.filter_overlong_prompts", True)
    # train.parquet holds engine=local's prompts in its order (verl_data.py: data.shuffle applied there), read as is
    put("data.shuffle", False)
    put("data.seed", t.seed)
    # model + learner
    put("actor_rollout_ref.model.path", resolve_model_path(cfg))
    # verl builds its hf_config with override_config's attn_implementation, default flash_attention_2, which
    # needs the flash-attn package; model.attn_implementation (default sdpa) is what engine=local uses
    put("actor_rollout_ref.model.override_config.attn_implementation", cfg.model.attn_implementation, add=True)
    # verl's remove-padding packs a micro-batch's sequences into one row, which only flash attention's varlen
    # kernels keep apart: with sdpa or eager the sequences would attend to each other
    put("actor_rollout_ref.model.use_remove_padding", cfg.model.attn_implementation == "flash_attention_2")
    minite = cfg.verl.rollout == "minite"
    if minite and cfg.verl.tensor_model_parallel_size != 1:
        raise ConfigError(f"verl.tensor_model_parallel_size={cfg.verl.tensor_model_parallel_size}: the minite "
                          "rollout runs one GPU per replica (valid: 1; more GPUs give more replicas), or use "
                          "verl.rollout=vllm")
    mode = loss_mode(a.loss_mode)
    libs = [PATCH_MODULE] + ([mode.plugin] if mode.plugin else []) + ([MINITE_REGISTER] if minite else [])
    put("actor_rollout_ref.model.external_lib", libs)
    for role in ("actor", "ref"):
        put(f"actor_rollout_ref.{role}.strategy", "fsdp2")
        put(f"actor_rollout_ref.{role}.fsdp_config.strategy", "fsdp2")
    put("actor_rollout_ref.actor.fsdp_config.model_dtype", _DTYPE[cfg.model.dtype])
    put("actor_rollout_ref.actor.fsdp_config.seed", t.seed)
    put("actor_rollout_ref.actor.data_loader_seed", t.seed)
    put("actor_rollout_ref.actor.optim.lr", cfg.optim.lr)
    put("actor_rollout_ref.actor.optim.weight_decay", cfg.optim.weight_decay)
    put("actor_rollout_ref.actor.optim.betas", list(cfg.optim.betas))
    put("actor_rollout_ref.actor.optim.clip_grad", cfg.optim.grad_clip)
    put("actor_rollout_ref.actor.grad_clip", cfg.optim.grad_clip)
    if cfg.optim.warmup_steps:
        put("actor_rollout_ref.actor.optim.lr_warmup_steps", cfg.optim.warmup_steps)
    if cfg.optim.eps != 1e-8:
        put(
            "actor_rollout_ref.actor.optim.override_optimizer_config",
            "{eps:" + repr(cfg.optim.eps) + "}",
            raw=True,
        )
    put("actor_rollout_ref.actor.ppo_mini_batch_size", mini)
    put("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", cfg.verl.micro_batch_size_per_gpu)
    for role in ("rollout", "ref"):  # the no-gradient log-prob passes (algorithm.log_prob_micro_batch_*)
        put(f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu",
            a.log_prob_micro_batch_size or cfg.verl.micro_batch_size_per_gpu)
    if a.micro_batch_tokens:
        put("actor_rollout_ref.actor.use_dynamic_bsz", True)
        put("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", a.micro_batch_tokens)
    if a.log_prob_micro_batch_tokens:  # else verl's log-prob passes follow the actor's (its own interpolation)
        for role in ("rollout", "ref"):
            put(f"actor_rollout_ref.{role}.log_prob_use_dynamic_bsz", True)
            put(f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu", a.log_prob_micro_batch_tokens)
    put("actor_rollout_ref.actor.ppo_epochs", a.ppo_epochs)
    put("actor_rollout_ref.actor.clip_ratio", a.clip_ratio)
    put("actor_rollout_ref.actor.clip_ratio_low", a.clip_ratio_low)
    put("actor_rollout_ref.actor.clip_ratio_high", a.clip_ratio_high)
    put("actor_rollout_ref.actor.clip_ratio_c", a.clip_ratio_c)
    put("actor_rollout_ref.actor.entropy_coeff", a.entropy_coeff)
    put("actor_rollout_ref.actor.calculate_entropy", True)
    put("actor_rollout_ref.actor.use_kl_loss", False)
    put("actor_rollout_ref.actor.loss_agg_mode", a.loss_agg_mode)
    put("actor_rollout_ref.actor.policy_loss.loss_mode", a.loss_mode)
    # algorithm
    put("algorithm.adv_estimator", "grpo")
    put("algorithm.norm_adv_by_std_in_grpo", a.norm_adv_by_std_in_grpo)
    put("algorithm.use_kl_in_reward", False)
    for item in mode.verl_overrides(a):
        key, value = item.split("=", 1)
        put(key.lstrip("+"), value, add=key.startswith("+"), raw=True)
    if not mode.sampler_logp and a.rollout_correction.rollout_is is not None:  # verl's own TIS
        put("algorithm.rollout_correction.rollout_is", a.rollout_correction.rollout_is)
        put("algorithm.rollout_correction.rollout_is_threshold", a.rollout_correction.rollout_is_threshold)
    # rollout
    put("actor_rollout_ref.rollout.name", cfg.verl.rollout)
    put("actor_rollout_ref.rollout.n", r.n)
    put("actor_rollout_ref.rollout.temperature", r.temperature)
    put("actor_rollout_ref.rollout.top_p", r.top_p)
    put("actor_rollout_ref.rollout.top_k", r.top_k)
    put("actor_rollout_ref.rollout.seed", t.seed)
    put("actor_rollout_ref.rollout.tensor_model_parallel_size", cfg.verl.tensor_model_parallel_size)
    put("actor_rollout_ref.rollout.calculate_log_probs", True)
    put("actor_rollout_ref.rollout.logprobs_mode", "processed_logprobs")
    if minite:  # the sampler lives in the actor worker: weights arrive in process, in the learner's forward dtype
        put("actor_rollout_ref.rollout.dtype", "bfloat16")
        put("actor_rollout_ref.rollout.checkpoint_engine.backend", "naive")
        for item in minite_settings(cfg).overrides():
            key, value = item.split("=", 1)
            put(key.lstrip("+"), value, add=True, raw=True)
    else:
        put("actor_rollout_ref.rollout.gpu_memory_utilization", cfg.verl.gpu_memory_utilization)
    plan = sampler_plan(cfg)
    if plan.mode == "nvfp4_w4a16":
        q = "actor_rollout_ref.actor.fsdp_config.qat"
        put(f"{q}.enable", True)
        put(f"{q}.mode", "w4a16")
        put(f"{q}.group_size", 16)
        put(f"{q}.ignore_patterns", list(_ignore_patterns(cfg)))
        put(f"{q}.quantization_config_path", str(dd / QUANT_CONFIG_FILE))
    # reward
    if cfg.reward.fn:
        mod, fn = cfg.reward.fn.split(":", 1)
        put("reward.custom_reward_function.path", f"pkg://{mod}")
        put("reward.custom_reward_function.name", fn)
    else:
        put("reward.custom_reward_function.path", REWARD_PATH)
        put("reward.custom_reward_function.name", REWARD_NAME)
    # trainer
    put("trainer.use_v1", _use_v1())
    put("trainer.total_training_steps", t.max_steps)
    put("trainer.total_epochs", 1_000_000)  # the step count decides; verl stops at total_training_steps
    put("trainer.save_freq", t.save_every if t.save_every > 0 else t.max_steps)
    put("trainer.default_local_dir", str(out / "checkpoints"))
    put("trainer.max_actor_ckpt_to_keep", t.keep_checkpoints)
    if t.resume in ("auto", "force"):  # verl keeps no run identity to compare
        put("trainer.resume_mode", "auto")
    elif t.resume == "never":
        put("trainer.resume_mode", "disable")
    else:
        put("trainer.resume_mode", "resume_path")
        put("trainer.resume_from_path", str(pathlib.Path(t.resume).resolve()))
    put("trainer.project_name", cfg.logger.wandb.project)
    put("trainer.experiment_name", cfg.logger.wandb.name or pathlib.Path(cfg.recipe).stem)
    loggers = ["console", "file"] + ([] if cfg.logger.wandb.mode == "disabled" else ["wandb"])
    put("trainer.logger", loggers)
    put("trainer.n_gpus_per_node", cfg.verl.n_gpus_per_node)
    put("trainer.nnodes", cfg.verl.nnodes)
    put("trainer.val_before_train", False)
    put("trainer.test_freq", -1)
    put("trainer.device", "cuda")
    # worker environment
    for k, v in worker_env(cfg).items():
        put(f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", _qs(v), add=True, raw=True)
    for item in cfg.verl.extra:  # raw user overrides, last
        key = item.split("=", 1)[0].lstrip("+~")
        ov[key] = item
    return list(ov.values())


# --------------------------------------------------------------------------------------------- launch


def _minite_plugin_installed() -> bool:
    """The minite rollout's ``verl.plugins`` entry point is installed (``pip install -e .`` of this checkout)."""
    from importlib.metadata import entry_points

    return any(ep.value == MINITE_REGISTER for ep in entry_points(group="verl.plugins"))


def check_available(rollout: str = "vllm") -> None:
    """Raise VerlUnavailable naming what is missing (CUDA, the rollout engine, verl)."""
    missing = []
    if importlib.util.find_spec("verl") is None:
        missing.append("verl (pip install 'verl[vllm]==0.9.1')")
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        cuda = False
    if not cuda:
        missing.append(
            "a CUDA GPU (torch.cuda.is_available() is False; verl 0.9.1 has no CPU platform: its workers "
            "run FSDP with NCCL on GPUs)"
        )
    if rollout == "vllm" and importlib.util.find_spec("vllm") is None:
        missing.append("vLLM (pip install 'verl[vllm]==0.9.1', which pins vllm==0.24.0), or use the default "
                       "verl.rollout=minite")
    if rollout == "sglang" and importlib.util.find_spec("sglang") is None:
        missing.append("SGLang (pip install 'verl[sglang]==0.9.1')")
    if rollout == "minite" and not _minite_plugin_installed():
        missing.append(f"the minite rollout's verl.plugins entry point ({MINITE_REGISTER}; pip install -e . in "
                       "this checkout registers it)")
    if missing:
        raise VerlUnavailable(
            "engine=verl cannot run here: missing "
            + "; ".join(missing)
            + ". engine=local runs everywhere (CPU or one GPU): drop engine=verl, or use "
            "verl.dry_run=true to print and save the verl command without running it."
        )


def command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def prepare(cfg: Config) -> tuple[list[str], SamplerPlan]:
    """Write the parquet data (+ NVFP4 quantization config), the resolved config, overrides and command."""
    from trainers.engines.verl_data import write_verl_data

    overrides = build_verl_overrides(cfg)
    plan = sampler_plan(cfg)
    dd = data_dir(cfg)
    write_verl_data(cfg.data, dd, steps=cfg.trainer.max_steps, prompts_per_step=cfg.rollout.prompts_per_step,
                    seed=cfg.trainer.seed)
    if plan.mode == "nvfp4_w4a16":
        atomic_write_text(
            dd / QUANT_CONFIG_FILE, json.dumps(quantization_config(_ignore_patterns(cfg)), indent=2) + "\n"
        )
    out = cfg.output_dir
    atomic_write_text(out / "config.yaml", to_yaml(cfg))
    atomic_write_text(out / OVERRIDES_FILE, "\n".join(overrides) + "\n")
    atomic_write_text(out / COMMAND_FILE, "#!/bin/sh\n" + shlex.join(command(overrides)) + "\n", mode=0o755)
    atomic_write_text(
        out / "verl_sampler_plan.json",
        json.dumps(
            {
                "recipe": plan.recipe,
                "mode": plan.mode,
                "notes": list(plan.notes),
                "learner_recipe": resolved_recipe_name(cfg.precision.learner),
            },
            indent=2,
        )
        + "\n",
    )
    return overrides, plan


def run_verl(cfg: Config) -> int:
    """Write data + overrides into the run dir and run ``python -m verl.trainer.main_ppo`` (exit code).

    With ``verl.dry_run=true`` it only writes and prints them (works on any machine). Otherwise it refuses
    with :class:`VerlUnavailable` when CUDA or the rollout engine (the minite plugin, vLLM, SGLang) is missing.
    """
    if not cfg.verl.dry_run:
        check_available(cfg.verl.rollout)
    from trainers.runlock import RunLock

    with RunLock(cfg.output_dir):
        return _run_verl(cfg)


def _run_verl(cfg: Config) -> int:
    overrides, plan = prepare(cfg)
    print("\n".join(overrides))
    for note in plan.notes:
        print(f"# sampler ({plan.mode}): {note}", file=sys.stderr)
    print(f"# saved {cfg.output_dir / OVERRIDES_FILE} and {cfg.output_dir / COMMAND_FILE}", file=sys.stderr)
    if cfg.verl.dry_run:
        return 0
    from rollout.models import SMOLLM2_ALIASES, load_model_and_tokenizer

    if str(cfg.model.path).lower() in SMOLLM2_ALIASES:
        load_model_and_tokenizer(cfg.model.path)  # builds the safetensors cache verl loads
    env = dict(os.environ)
    env.update(worker_env(cfg))
    return subprocess.call(command(overrides), env=env)

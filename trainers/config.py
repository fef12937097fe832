"""Training configuration: frozen dataclasses (defaults in code), YAML training recipes, Hydra-style overrides.

    python -m trainers.grpo recipe=triage_nvfp4 trainer.max_steps=50 +algorithm.triage.repair_coef=0.05

* ``recipe=NAME`` loads ``recipes/NAME.yaml`` (or a path to a YAML file). A recipe may start with
  ``defaults: [base]`` to inherit another recipe; later files override earlier ones.
* ``precision=NAME`` sets ``precision.learner`` and ``precision.sampler`` together.
* ``a.b=c`` sets an existing key (unknown key -> error naming the closest valid key); ``+a.b=c`` adds a key
  that does not exist yet (only meaningful inside sections that start empty, such as ``algorithm.triage``);
  ``~a.b`` resets a key to its code default.
* Values are parsed with OmegaConf's grammar (``null``, numbers, booleans, ``[a,b]`` lists).
* Every field is type-checked and every choice validated before anything runs.
"""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from minite_util.choices import did_you_mean
from trainers import losses
from triage.config import CLIP_RATIO_C, CLIP_RATIO_HIGH, CLIP_RATIO_LOW, TriageConfig

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = "default"


class ConfigError(ValueError):
    """A configuration problem; the message names the key, the bad value and the valid choices."""


@dataclass(frozen=True)
class ModelConfig:
    path: str = "smollm2-135m-instruct"  # HF id, local HF dir, or the embedded SmolLM2 alias
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # auto -> cuda when available, else cpu
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"


@dataclass(frozen=True)
class PrecisionConfig:
    # "bf16" = plain linears in model.dtype (no patching); "auto" = $MINITE_RECIPE or minite's default;
    # anything else is a minite precision recipe name (minite_kernels.recipes.list_recipes()).
    # the two may differ (a BF16 learner with an NVFP4 or FP8 sampler, as verl runs vLLM): engine=local then
    # gives the sampler its own copy of the model, which the weight sync refreshes after every update
    learner: str = "bf16"
    sampler: str = "bf16"
    # left in high precision: module-name patterns (glob or 're:regex') and block indices (-1 = the last block)
    exclude: tuple[int | str, ...] = ("lm_head",)
    backend: str = "auto"  # minite backend: auto | emulated | triton | te | flashinfer | strict
    # strict: every reduction on the token path batch-invariant (minite_kernels.strict: fp64 rounded once on
    # CPU, fixed-order Triton kernels on CUDA), so the sampler's log-probs equal the learner's bit for bit;
    # default: the kernels' own order
    alignment: Literal["default", "strict"] = "default"


@dataclass(frozen=True)
class ArithmeticConfig:
    size: int = 2000
    levels: tuple[int, ...] = (1, 2)  # 1: a+b (1 digit); 2: 2-digit + 1-digit; 3: 2-digit + 2-digit; 4: a*b (1 digit)
    seed: int = 1234
    # true: never draw a problem of the held-out part (trainers.data.split; the eval task arithmetic_heldout), so
    # that held-out evals score problems the run never trained on; false: the draws of earlier studies
    exclude_heldout: bool = False


@dataclass(frozen=True)
class DataConfig:
    task: Literal["arithmetic", "gsm8k", "jsonl"] = "arithmetic"
    path: str | None = None  # jsonl file; gsm8k defaults to the copy the package carries
    prompt_key: str = "question"
    answer_key: str = "answer"
    system_prompt: str | None = None
    instruction: str | None = None  # appended to every question (null or empty: none)
    max_prompt_tokens: int = 512
    limit: int | None = None  # use only the first N rows
    shuffle: bool = True
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8
    n: int = 4  # samples per prompt (the GRPO group)
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    batch_size: int | None = None  # sequences per generation batch (None = all at once)
    # auto: the CUDA-graph engine on CUDA (reference loop for models it does not reproduce), the loop on CPU;
    # graph: the engine everywhere (eager off CUDA); loop: the reference loop (rollout.local)
    sampler: Literal["auto", "graph", "loop"] = "auto"
    # the graph engine makes the NVFP4 projections' quantized activation in the launch of the op before them
    # (the norm, the SiLU product: rollout.graph_sampler norm_quant); off by default: on the H200 its gain was
    # within run-to-run noise (benchmarks/RESULTS.md)
    norm_quant: bool = False
    # the graph engine's NVFP4 projections read the packed NVFP4 weight (4.5 bits per value) through the
    # FP4-weight GEMM (minite_kernels.backends.triton.fp4w): auto where its measured table prefers it, on
    # wherever it runs, off keeps BF16 dequantized copies (rollout.packed)
    fp4_weights: Literal["auto", "on", "off"] = "auto"


@dataclass(frozen=True)
class RewardConfig:
    fn: str | None = None  # "module:function" (see trainers.rewards); None = the task's scorer


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    rollout_is: Literal["token", "sequence"] | None = None  # verl's TIS weights (None = off)
    rollout_is_threshold: float = 2.0


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: Literal["grpo"] = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    loss_mode: str = "vanilla"  # a verl policy loss: vanilla | triage | gspo | ...
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = "token-mean"
    # the PPO clip ratios' single definition is triage.config (DAPO's clip-higher 0.2 / 0.28, dual clip 3); the
    # trainer passes its values to whichever loss runs. clip_ratio: verl's symmetric fallback for an unset side
    clip_ratio: float = CLIP_RATIO_LOW
    clip_ratio_low: float = CLIP_RATIO_LOW
    clip_ratio_high: float = CLIP_RATIO_HIGH
    clip_ratio_c: float = CLIP_RATIO_C
    entropy_coeff: float = 0.0
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer steps per PPO epoch
    micro_batch_size: int = 8  # sequences per forward/backward
    # > 0: micro-batches also by a token budget, rows x padded length <= micro_batch_tokens (at least one row;
    # verl's use_dynamic_bsz / ppo_max_token_len_per_gpu). On a GPU, small micro-batches leave the learner
    # host-bound: a budget of ~16k tokens with a large micro_batch_size runs few, full forwards
    micro_batch_tokens: int = 0
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    # TRIAGE's settings (loss_mode=triage); a recipe names only the fields it changes (+algorithm.triage.x=v)
    triage: TriageConfig = field(default_factory=TriageConfig)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0
    warmup_steps: int = 0
    # local engine: "minite" = minite_kernels.optim.AdamW (one fused Triton pass that also records each weight's
    # amax, so weight sync reads every weight once); "torch" = torch.optim.AdamW; "auto" = minite on CUDA with
    # Triton, else torch. Same AdamW either way (fp32 math; checkpoints interchange).
    impl: Literal["auto", "torch", "minite"] = "auto"


@dataclass(frozen=True)
class TrainerConfig:
    max_steps: int = 20
    output_dir: str | None = None  # None -> runs/<recipe>
    save_every: int = 10  # 0: only the final checkpoint
    # auto: the newest intact checkpoint, refusing a directory that holds another run; force: the same, accepting
    # another run (printing how it differs); never: start over; or a checkpoint directory
    resume: str = "auto"
    seed: int = 0
    keep_checkpoints: int = 2
    logprob_chunk_size: int = 256
    max_consecutive_nan: int = 3
    save_final: bool = True
    log_samples: int = 2  # responses per step appended to <output_dir>/samples.jsonl (0 = off)
    # torch CPU threads; None = auto: torch's default, or 1 when the 1-min load average already fills the cores
    # (OpenMP threads on an oversubscribed CPU stall at every barrier: measured 6.6x slower decode at 2 threads);
    # a resumed run keeps the interrupted run's count (float reductions depend on it)
    cpu_threads: int | None = None


@dataclass(frozen=True)
class EvalConfig:
    # held-out evaluation inside the run (trainers.heldout; verl's trainer.test_freq): every `every` steps and after
    # the last one, the run's own sampler (the policy as trained: same weights, precision and alignment) answers
    # `tasks` (python -m eval task names) into <output_dir>/eval/step_<N>/ and the metrics' val/<task>; 0 = off
    every: int = 0
    tasks: tuple[str, ...] = ("arithmetic",)
    limit: int | None = None  # the first N prompts of each task
    samples: int = 1  # responses per prompt (avg@k)
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 256
    batch_size: int = 64  # sequences per generation batch
    seed: int = 0


@dataclass(frozen=True)
class WandbConfig:
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"  # auto: online with WANDB_API_KEY else offline
    project: str = "minite-rl"
    entity: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress: bool = True


@dataclass(frozen=True)
class VerlConfig:
    n_gpus_per_node: int = 1
    nnodes: int = 1
    # the rollout engine. minite: the project's sampler with the learner's own precision recipe (precision.sampler,
    # rollout.sampler / batch_size / norm_quant), one GPU per replica (rollout.verl_backend); vllm / sglang:
    # verl's inference servers (an NVFP4 recipe is served as W4A16: 1x16 weight blocks, BF16 activations)
    rollout: Literal["minite", "vllm", "sglang"] = "minite"
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    ppo_mini_batch_size: int | None = None  # prompts per optimizer step (default: prompts_per_step)
    micro_batch_size_per_gpu: int = 4
    data_dir: str | None = None  # where the parquet train/val files are written (default <output_dir>/data)
    extra: tuple[str, ...] = ()  # raw verl overrides appended last
    dry_run: bool = False  # print the verl command and exit


@dataclass(frozen=True)
class Config:
    recipe: str = DEFAULT_RECIPE
    description: str = ""
    engine: Literal["local", "verl"] = "local"
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)

    @property
    def output_dir(self) -> pathlib.Path:
        return pathlib.Path(self.trainer.output_dir or f"runs/{pathlib.Path(self.recipe).stem}")


# --------------------------------------------------------------------------------------------- typing helpers

def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dc(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


#: sections that their own class builds from the fields a recipe sets (``from_mapping``: it validates them and its
#: error names the bad key and the valid ones); in the override tree they start empty, so that ``+key=v`` adds a
#: field and ``key=v`` sets one
SELF_BUILT = (TriageConfig,)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, root: type = Config) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        raise ConfigError(f"{key}={value!r} is not valid{did_you_mean(value, choices)}; valid choices: "
                          + ", ".join(repr(c) for c in choices))
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, root)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}={value!r} must be {_describe(tp)}" + (f" ({errors[0]})" if errors else ""))
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            if isinstance(value, str) and typing.get_args(tp)[-1] is Ellipsis:
                value = [value]
            else:
                raise ConfigError(f"{key}={value!r} must be a list")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", root) for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}={list(value)!r} must have {len(args)} items")
        return tuple(_coerce(v, a, f"{key}[{i}]", root) for i, (v, a) in enumerate(zip(value, args)))
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # 1e400 parses as inf, .nan as nan: neither is a setting
                raise ConfigError(f"{key}={value!r} must be a finite number")
            return float(value)
        raise ConfigError(f"{key}={value!r} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}={value!r} must be a string")
    if tp in SELF_BUILT:
        try:
            return tp.from_mapping(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{key}: {e}") from None
    if _is_dc(tp):
        return build(tp, value, key + ".", root)
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        k = prefix + f.name
        if _is_dc(tp):
            out.extend(all_keys(tp, k + "."))
        else:
            out.append(k)
    return out


def _unknown(key: str, root: type = Config) -> ConfigError:
    valid = all_keys(root)
    hint = did_you_mean(key, valid, cutoff=0.5)
    if not hint:  # the same leaf under another section
        leaf = key.rsplit(".", 1)[-1]
        hint = did_you_mean(leaf, [k for k in valid if k.rsplit(".", 1)[-1] == leaf], cutoff=0.0)
    # the trainer's schema is too long to print in one line; a smaller one (trainers.controlled) lists its keys
    where = ("list them all with `python -m trainers.grpo --keys`" if root is Config
             else "valid: " + ", ".join(valid))
    return ConfigError(f"unknown config key {key!r}{hint} ({where})")


def build(cls: type, data: Any, prefix: str = "", root: type | None = None) -> Any:
    """Build dataclass `cls` from a nested mapping, validating every key and value.

    ``root`` is the schema the whole mapping follows (default: ``cls``), whose keys an unknown key is matched
    against; any frozen-dataclass schema works (``trainers.controlled.config`` builds its own with it)."""
    root = cls if root is None else root
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            raise _unknown(key, root)
        kwargs[k] = _coerce(v, hints[k], key, root)
    obj = cls(**kwargs)
    _check_values(obj, prefix)
    return obj


def _positive(obj: Any, prefix: str, *names: str, allow_zero: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is not None and (v < 0 if allow_zero else v <= 0):
            raise ConfigError(f"{prefix}{n}={v!r} must be {'>= 0' if allow_zero else '> 0'}")


def _check_values(obj: Any, prefix: str) -> None:
    if isinstance(obj, RolloutConfig):
        _positive(obj, prefix, "prompts_per_step", "n", "max_new_tokens", "batch_size")
        _positive(obj, prefix, "temperature", allow_zero=True)
        if not 0 < obj.top_p <= 1:
            raise ConfigError(f"{prefix}top_p={obj.top_p} must be in (0, 1]")
        if obj.top_k == 0 or obj.top_k < -1:
            raise ConfigError(f"{prefix}top_k={obj.top_k} must be -1 (off) or >= 1")
    elif isinstance(obj, AlgorithmConfig):
        _positive(obj, prefix, "ppo_epochs", "mini_batches", "micro_batch_size", "clip_ratio_c")
        _positive(obj, prefix, "clip_ratio", "clip_ratio_low", "clip_ratio_high", "entropy_coeff",
                  "micro_batch_tokens", allow_zero=True)
        if obj.clip_ratio_c <= 1:
            raise ConfigError(f"{prefix}clip_ratio_c={obj.clip_ratio_c} must be > 1 (dual-clip bound)")
    elif isinstance(obj, OptimConfig):
        _positive(obj, prefix, "lr", "eps")
        _positive(obj, prefix, "weight_decay", "grad_clip", "warmup_steps", allow_zero=True)
    elif isinstance(obj, TrainerConfig):
        _positive(obj, prefix, "max_steps", "logprob_chunk_size", "keep_checkpoints", "max_consecutive_nan")
        _positive(obj, prefix, "save_every", allow_zero=True)
        _positive(obj, prefix, "cpu_threads")
        _positive(obj, prefix, "log_samples", allow_zero=True)
    elif isinstance(obj, EvalConfig):
        _positive(obj, prefix, "every", "temperature", allow_zero=True)
        _positive(obj, prefix, "limit", "samples", "max_new_tokens", "batch_size")
        if not 0 < obj.top_p <= 1:
            raise ConfigError(f"{prefix}top_p={obj.top_p} must be in (0, 1]")
    elif isinstance(obj, ArithmeticConfig):
        _positive(obj, prefix, "size")
        bad = [lv for lv in obj.levels if lv not in (1, 2, 3, 4)]
        if bad or not obj.levels:
            raise ConfigError(f"{prefix}levels={list(obj.levels)} must be a non-empty list drawn from [1, 2, 3, 4]")
    elif isinstance(obj, DataConfig):
        _positive(obj, prefix, "max_prompt_tokens", "limit")


def validate(cfg: Config) -> Config:
    """Cross-field checks (the per-field ones ran while building)."""
    if cfg.rollout.top_p < 1 or cfg.rollout.top_k != -1:
        raise ConfigError(
            f"rollout.top_p={cfg.rollout.top_p} / rollout.top_k={cfg.rollout.top_k}: truncated sampling is refused "
            "for training. The learner would have to recompute log-probs under the same truncation, and a token "
            "the sampler kept can fall outside the learner's (differently rounded) top-p set, giving an infinite "
            "gap (verl issue #6240). Use top_p=1, top_k=-1 (the RL default); the sampler supports truncation "
            "for evaluation.")
    for side in ("learner", "sampler"):
        name = getattr(cfg.precision, side)
        if name in ("bf16", "auto"):
            continue
        try:
            from minite_kernels.recipes import recipe_names
        except ImportError:  # pragma: no cover - minite_kernels ships with this project
            break
        valid = ["bf16", "auto"] + [n for n in recipe_names() if n != "bf16"]
        if name not in valid:
            raise ConfigError(f"precision.{side}={name!r} is not a precision recipe{did_you_mean(name, valid)}; "
                              "valid choices: "
                              + ", ".join(valid))
    if cfg.precision.alignment == "strict" and cfg.precision.learner != cfg.precision.sampler:
        raise ConfigError(
            f"precision.learner={cfg.precision.learner!r} != precision.sampler={cfg.precision.sampler!r}: strict "
            "alignment makes the sampler compute the learner's bits, which needs one precision recipe for both. "
            "Set them equal (precision=NAME), or use precision.alignment=default")
    if cfg.engine == "verl" and any(isinstance(e, int) for e in cfg.precision.exclude):
        raise ConfigError(
            f"precision.exclude={list(cfg.precision.exclude)!r}: block indices apply to engine=local; with "
            "engine=verl name the modules instead (e.g. 're:layers\\.0\\.'), so the learner and vLLM's ignore "
            "list agree")
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", cfg.model.device):
        raise ConfigError(f"model.device={cfg.model.device!r} is not a device; valid: auto, cpu, cuda, cuda:N, mps")
    if cfg.precision.alignment == "strict" and cfg.engine != "local":
        raise ConfigError(
            f"precision.alignment=strict runs with engine=local (its sampler and learner share the strict kernels); "
            f"got engine={cfg.engine}. Use engine=local, or precision.alignment=default")
    if cfg.precision.alignment == "strict" and cfg.precision.backend not in ("auto", "strict", "emulated"):
        raise ConfigError(
            f"precision.alignment=strict runs the quantized linears as dequantized GEMMs, which the batch-invariant "
            f"kernels compute (backend strict: the Triton quantizer where it runs; emulated: pure PyTorch); got "
            f"precision.backend={cfg.precision.backend}. Valid with strict: auto, strict, emulated")
    if cfg.eval.every:
        from eval.task import get_task, task_names

        if not cfg.eval.tasks or len(set(cfg.eval.tasks)) != len(cfg.eval.tasks):
            raise ConfigError(f"eval.tasks={list(cfg.eval.tasks)!r} must list distinct tasks; valid tasks: "
                              f"{', '.join(task_names())}")
        for t in cfg.eval.tasks:
            try:
                get_task(t)
            except ValueError as e:
                raise ConfigError(f"eval.tasks: {e}") from None
        if cfg.engine == "verl":
            raise ConfigError(f"eval.every={cfg.eval.every} runs on engine=local; engine=verl validates on its val "
                              "split with verl's own trainer.test_freq (verl.extra=[trainer.test_freq=N]). Use "
                              "eval.every=0 with engine=verl")
    if cfg.engine == "verl" and cfg.optim.impl == "minite":
        raise ConfigError("optim.impl='minite' applies to engine=local; verl's FSDP workers build their own "
                          "optimizer (valid with engine=verl: 'auto', 'torch')")
    try:
        losses.check(cfg.algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    group = cfg.rollout.prompts_per_step * cfg.rollout.n
    if group % cfg.algorithm.mini_batches:
        raise ConfigError(f"algorithm.mini_batches={cfg.algorithm.mini_batches} must divide "
                          f"rollout.prompts_per_step * rollout.n = {group}")
    if cfg.trainer.resume not in ("auto", "force", "never") and not pathlib.Path(cfg.trainer.resume).is_dir():
        raise ConfigError(f"trainer.resume={cfg.trainer.resume!r}: valid choices are 'auto', 'force', 'never' or an "
                          "existing checkpoint directory")
    if cfg.reward.fn is not None and ":" not in cfg.reward.fn:
        raise ConfigError(f"reward.fn={cfg.reward.fn!r} must look like 'package.module:function'")
    return cfg


# --------------------------------------------------------------------------------------------- recipes + overrides

def recipe_dirs() -> list[pathlib.Path]:
    dirs = []
    env = os.environ.get("MINITE_RECIPES_DIR")
    if env:
        dirs.append(pathlib.Path(env))
    dirs += [pathlib.Path.cwd() / "recipes", REPO_ROOT / "recipes"]
    out: list[pathlib.Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def list_recipes() -> list[str]:
    names = set()
    for d in recipe_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def find_recipe(name: str) -> pathlib.Path:
    p = pathlib.Path(name).expanduser()
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    for d in recipe_dirs():
        q = d / f"{name}.yaml"
        if q.is_file():
            return q
    valid = list_recipes()
    searched = ", ".join(str(d) for d in recipe_dirs()) or "recipes/"
    raise ConfigError(f"unknown recipe {name!r}{did_you_mean(name, valid)}; valid recipes: "
                      f"{', '.join(valid) or '(none found)'} (searched {searched})")


def _load_recipe_tree(name: str, seen: tuple[str, ...] = ()) -> dict:
    from omegaconf import OmegaConf

    path = find_recipe(name)
    if str(path.resolve()) in seen:
        raise ConfigError(f"recipe inheritance cycle: {' -> '.join(seen + (str(path),))}")
    try:
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception as e:
        raise ConfigError(f"cannot parse recipe {path}: {e}") from e
    if not isinstance(node, dict):
        raise ConfigError(f"recipe {path} must be a YAML mapping")
    parents = node.pop("defaults", []) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict = {}
    for parent in parents:
        pname = pathlib.Path(path).parent / f"{parent}.yaml"
        merged = _merge(merged, _load_recipe_tree(str(pname) if pname.is_file() else parent,
                                                  seen + (str(path.resolve()),)))
    return _merge(merged, node)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _parse_value(key: str, raw: str) -> Any:
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.from_dotlist([f"v={raw}"])
        return OmegaConf.to_container(node, resolve=True)["v"]
    except Exception as e:
        raise ConfigError(f"cannot parse the value of override {key}={raw!r}: {e}") from e


def _free_form_parent(path: list[str]) -> bool:
    """True when path[:-1] points to a dict-typed field or a section that starts empty (e.g. algorithm.triage)."""
    cls: Any = Config
    for i, part in enumerate(path[:-1]):
        hints = _hints(cls) if _is_dc(cls) else {}
        if part not in hints:
            return False
        tp = hints[part]
        if tp is dict or typing.get_origin(tp) is dict or tp in SELF_BUILT:
            return True
        cls = tp
    return False


def _exists(tree: dict, path: list[str]) -> bool:
    node: Any = tree
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _set(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def _delete(tree: dict, path: list[str]) -> None:
    node: Any = tree
    for part in path[:-1]:
        node = node.get(part, {})
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _defaults_tree() -> dict:
    def conv(obj: Any) -> Any:
        if isinstance(obj, SELF_BUILT):
            return {}
        if dataclasses.is_dataclass(obj):
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, tuple):
            return [conv(v) for v in obj]
        return obj
    return conv(Config())


def load_config(args: list[str] | tuple[str, ...] = ()) -> Config:
    """Parse ``recipe=NAME`` and overrides into a validated :class:`Config`."""
    recipe = DEFAULT_RECIPE
    overrides: list[str] = []
    for a in args:
        if a.startswith("recipe="):
            recipe = a.split("=", 1)[1]
        elif a.startswith("--"):
            raise ConfigError(f"unknown option {a!r}; use key=value overrides (e.g. trainer.max_steps=5)")
        else:
            overrides.append(a)
    tree = _merge(_defaults_tree(), _load_recipe_tree(recipe))
    tree["recipe"] = recipe
    # keys the recipe files introduced are validated by build(); overrides follow Hydra's grammar
    for ov in overrides:
        if ov.startswith("~"):
            path = ov[1:].split("=", 1)[0].split(".")
            _delete(tree, path)
            default = _defaults_tree()
            node: Any = default
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if node is not None:
                _set(tree, path, node)
            continue
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} must look like key=value (or +key=value to add a key)")
        key, raw = ov.split("=", 1)
        if key == "precision":  # shorthand: one precision recipe for learner and sampler
            _set(tree, ["precision", "learner"], raw)
            _set(tree, ["precision", "sampler"], raw)
            continue
        plus = key.startswith("+")
        key = key.lstrip("+")
        path = key.split(".")
        if key == "recipe":
            continue
        exists = _exists(tree, path)
        if plus and exists:
            raise ConfigError(f"override +{key}: key already exists; drop the '+' to change it")
        if not plus and not exists and not _free_form_parent(path):
            raise _unknown(key)
        _set(tree, path, _parse_value(key, raw))
    return validate(build(Config, tree))


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1, "c": {}}}`` -> ``{"a.b": 1, "a.c": {}}``: dotted keys, as overrides write them (an empty
    mapping stays a value)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def to_container(cfg: Config) -> dict:
    def conv(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, (tuple, list)):
            return [conv(v) for v in obj]
        if isinstance(obj, dict):
            return {k: conv(v) for k, v in obj.items()}
        return obj
    return conv(cfg)


def to_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(to_container(cfg)))


def from_yaml_file(path: str | os.PathLike) -> Config:
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return validate(build(Config, tree))

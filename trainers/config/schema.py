"""The training configuration's schema: frozen dataclasses with the defaults in code (:class:`Config` and its
sections), :class:`ConfigError`, and the schema's views (its keys, its YAML form)."""
from __future__ import annotations

import dataclasses
import pathlib
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from triage.config import CLIP_RATIO_C, CLIP_RATIO_HIGH, CLIP_RATIO_LOW, TriageConfig

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
    # (the norm, the SiLU product: rollout.graph_sampler norm_quant); auto: where the sampler holds FP4-weight
    # groups (measured faster there at the 4B and 8B shapes; benchmarks/RESULTS.md); true / false read as on / off
    norm_quant: Literal["auto", "on", "off"] = "auto"
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
    # the old policy's log-prob recompute runs without gradients and holds no activations for a backward, so it
    # can take larger micro-batches, hence fewer forwards and less host time (verl's
    # log_prob_micro_batch_size_per_gpu / log_prob_max_token_len_per_gpu). 0: micro_batch_size / micro_batch_tokens
    log_prob_micro_batch_size: int = 0
    log_prob_micro_batch_tokens: int = 0
    # where the PPO ratio's old log-probs come from. auto: when the update is one epoch of one mini-batch, no
    # optimizer step falls between the batch's forwards, so the update's own forward is the old policy's: its
    # detached log-probs are π_old (ratio exactly 1) and the no-gradient recompute, one forward of the batch, is
    # skipped; otherwise, and under precision.alignment=strict, the recompute. recompute: always the recompute.
    # engine=verl: verl's trainer always recomputes
    old_log_prob: Literal["auto", "recompute"] = "auto"
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    # TRIAGE's settings (loss_mode=triage); a recipe names only the fields it changes (+algorithm.triage.x=v)
    triage: TriageConfig = field(default_factory=TriageConfig)

    def log_prob_micro(self) -> tuple[int, int]:
        """(rows, token budget) of the log-prob recompute's micro-batches."""
        return (self.log_prob_micro_batch_size or self.micro_batch_size,
                self.log_prob_micro_batch_tokens or self.micro_batch_tokens)

    def old_from_update(self) -> bool:
        """Whether the update's forward gives the old log-probs (``old_log_prob=auto`` with one epoch of one
        mini-batch; the step also keeps the recompute under strict alignment)."""
        return self.old_log_prob == "auto" and self.ppo_epochs == 1 and self.mini_batches == 1


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
    # engine=local, the learner's head statistics: auto takes the fused Triton kernel on CUDA where it computes the
    # same function (about 3x faster; ~1.5 GB more peak memory at 4B for its fp32 head gradient); torch: always the
    # chunked PyTorch path (trainers/learner/logprobs.py)
    logprob_kernel: Literal["auto", "torch"] = "auto"
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
    # also evaluate the policy under this sampler precision (bf16 or a recipe name; lm_head kept high, default
    # alignment) into <output_dir>/eval@<precision>/step_<N>/ and val@<precision>/<task>: every arm of a study read
    # at one precision, next to its own (issue 40); null: only the run's own sampler
    precision: str | None = None


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

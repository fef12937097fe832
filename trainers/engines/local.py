"""``engine=local``: one process, CPU or one GPU. One GRPO step (docs/ARCHITECTURE.md "One GRPO step"):

prompts -> sampler (KV-cache decode, precision P) -> tokens + sampler_logp -> rewards -> GRPO advantages ->
learner recomputes old_logp (one full forward, same P) -> delta = old_logp - sampler_logp -> policy loss
(verl registry: vanilla / triage), PPO epochs x mini-batches x micro-batches -> AdamW -> weight sync
(re-quantize) -> metrics (mismatch diagnostics every step) -> checkpoint.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import pathlib
import platform
import random
import sys
import time
import uuid
from typing import Any

import numpy as np
import torch

from rollout import SamplingParams, make_sampler
from rollout.decoder import UnsupportedModel
from rollout.models import load_model_and_tokenizer
from rollout.precision import Requantizer, patch_precision, triton_kernels_ok
from trainers import heldout
from trainers.checkpoint import (
    CheckpointError,
    atomic_write_text,
    checkpoints_newest_first,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainers.config import Config, ConfigError, flatten, to_container, to_yaml
from trainers.data import PromptSchedule, load_examples, render_prompt
from trainers.learner import actor as A
from trainers.learner.batch import RolloutBatch, collate, micro_batches
from trainers.learner.logprobs import response_logprobs
from trainers.losses import loss_mode
from trainers.rewards.registry import load_reward_fn, score_one
from trainers.runlock import RunLock
from trainers.stopping import GracefulStop
from trainers.tracking import Tracker

ENV_ECHO_PREFIXES = ("MINITE_", "WANDB_MODE", "WANDB_PROJECT", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES",
                     "VERL_", "OMP_NUM_THREADS", "DISABLE_BACKWARD_QUANT", "PYTORCH_")


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite losses; the last good checkpoint is intact."""


#: GraphSampler.stats counters logged per step as ``rollout/<name>`` (what changed during that step's rollout;
#: ``capture_s``: the seconds of it spent on new graph keys)
SAMPLER_COUNTS = ("captures", "refills", "eager_steps", "compactions", "capture_s")


def env_snapshot() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_ECHO_PREFIXES)}


def choose_cpu_threads(requested: int | None, device: torch.device) -> int:
    """Set torch's CPU threads: `requested`, else 1 on a CPU whose load already fills its cores, else torch's
    default. Returns the number in use."""
    if requested:
        torch.set_num_threads(requested)
    elif device.type == "cpu" and hasattr(os, "getloadavg"):
        cores = os.cpu_count() or 1
        if cores > 1 and os.getloadavg()[0] >= cores:
            print(f"[trainers] CPU busy (load {os.getloadavg()[0]:.1f} on {cores} cores): using 1 torch thread "
                  "(set trainer.cpu_threads to override)", file=sys.stderr)
            torch.set_num_threads(1)
    return torch.get_num_threads()


def _optim_impl(impl: str, triton_ok: bool) -> str:
    """optim.impl resolved: "auto" is minite_kernels' AdamW where its fused kernel runs (CUDA with Triton)."""
    if impl == "auto":
        return "minite" if triton_ok else "torch"
    return impl


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed(store: dict[str, float], key: str, device: torch.device):
    _sync(device)
    t0 = time.perf_counter()
    yield
    _sync(device)
    store[key] = store.get(key, 0.0) + time.perf_counter() - t0


def _write_meta(run_dir: pathlib.Path, updates: dict[str, Any]) -> None:
    path = run_dir / "run_meta.json"
    meta = json.loads(path.read_text()) if path.is_file() else {}
    meta.update(updates)
    atomic_write_text(path, json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")


def apply_precision(model, cfg: Config, run_dir: pathlib.Path | None, side: str = "learner") -> dict[str, Any]:
    """Patch the linears with ``precision.<side>`` (one model serves learner and sampler when the two are equal);
    'bf16' leaves them as is. ``run_dir``: where ``quantize_model`` records its layer report (None: nowhere)."""
    name = getattr(cfg.precision, side)
    env_recipe = os.environ.get("MINITE_RECIPE")
    if env_recipe and name not in ("bf16", "auto") and env_recipe != name:
        print(f"[trainers] MINITE_RECIPE={env_recipe} is ignored: the training recipe names precision "
              f"{name!r} explicitly (explicit > $MINITE_RECIPE > default)", file=sys.stderr)
    return patch_precision(model, name, exclude=cfg.precision.exclude, backend=cfg.precision.backend,
                           alignment=cfg.precision.alignment, run_dir=run_dir)


def _row_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, ValueError, TypeError):
        return 1 << 62


#: keys that make a run what it is: resuming a directory whose run differs in one of them is refused
RUN_IDENTITY = ("model.path", "precision.learner", "precision.sampler", "data.task", "data.path",
                "algorithm.loss_mode")


def _saved_config(path: pathlib.Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        return flatten(OmegaConf.to_container(OmegaConf.load(path)))
    except Exception:  # noqa: BLE001 - an unreadable config.yaml only costs the comparison
        return None


def check_same_run(path: pathlib.Path, cfg: Config) -> None:
    """Refuse to resume a directory that holds another run (another model, data, recipe, task or loss); with
    ``trainer.resume=force`` say how it differs and continue it."""
    old = _saved_config(path)
    if old is None:
        return
    new = flatten(to_container(cfg))
    diff = [f"{k}={old.get(k)!r} (this command: {new.get(k)!r})" for k in RUN_IDENTITY if old.get(k) != new.get(k)]
    if diff and cfg.trainer.resume == "force":
        print(f"[trainers] trainer.resume=force: continuing the run in {path.parent}, which differs: "
              f"{'; '.join(diff)}", file=sys.stderr)
    elif diff:
        raise ConfigError(f"trainer.output_dir={path.parent} holds another run: {'; '.join(diff)}. Choose another "
                          "trainer.output_dir, pass trainer.resume=never to start a new run there, or "
                          "trainer.resume=force to continue it with this command's settings")


def _warn_config_changes(path: pathlib.Path, cfg: Config) -> None:
    """On resume, list keys whose value differs from the interrupted run's (exact resumption needs none)."""
    a = _saved_config(path)
    if a is None:
        return
    b = flatten(to_container(cfg))
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)
                     and not k.startswith(("trainer.max_steps", "trainer.resume", "logger.")))
    if changed:
        print(f"[trainers] resuming with a changed config ({', '.join(changed)}); the run will not match an "
              "uninterrupted one", file=sys.stderr)


def _param_pairs(learner, sampler) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(sampler parameter, learner parameter) by name; the two models must hold the same parameters (both are
    the loaded model, patched with different recipes, which keeps parameter names and shapes)."""
    mine, theirs = dict(learner.named_parameters()), dict(sampler.named_parameters())
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        diff = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k].shape != theirs[k].shape]
        raise ConfigError(f"precision.sampler: the sampler's model does not hold the learner's parameters "
                          f"(first difference: {diff[0]!r}); use one precision for both")
    return [(theirs[k], mine[k]) for k in mine]


class AlignmentError(RuntimeError):
    """A strict-alignment run saw the sampler and the learner disagree."""


class LocalTrainer:
    """``model_and_tokenizer`` injects an already-built (model, tokenizer) instead of loading ``model.path``
    (benchmarks and tests with random models); everything else follows ``cfg``."""

    def __init__(self, cfg: Config, *, model_and_tokenizer: tuple[Any, Any] | None = None) -> None:
        self.cfg = cfg
        self._injected = model_and_tokenizer
        self.run_dir = cfg.output_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        dev = cfg.model.device
        self.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"model.device={dev}, but this torch ({torch.__version__}) sees no CUDA device; use "
                              "model.device=auto or cpu")

    # ----------------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cpu_threads = choose_cpu_threads(cfg.trainer.cpu_threads, self.device)
        random.seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed)
        torch.manual_seed(cfg.trainer.seed)
        self.examples = load_examples(cfg.data)  # data errors surface before the model loads
        heldout.check(cfg)  # and so do missing eval data or checkers
        self.reward_fn, self.reward_name = load_reward_fn(cfg.reward.fn)
        self.loss_mode = loss_mode(cfg.algorithm.loss_mode)
        self.loss_fn = self.loss_mode.loss_fn()
        if self._injected is not None:
            self.model, self.tok = self._injected
            self.model.to(self.device)
        else:
            self.model, self.tok = load_model_and_tokenizer(cfg.model.path, dtype=cfg.model.dtype,
                                                            device=str(self.device))
        # precision.sampler != precision.learner: the sampler runs its own copy of the model under its own recipe
        # (verl's layout: a BF16 learner with an FP8 or NVFP4 rollout), and the weight sync copies the learner's
        # parameters into it after every update
        separate = cfg.precision.sampler != cfg.precision.learner
        self.sampler_model = copy.deepcopy(self.model).requires_grad_(False).eval() if separate else self.model
        self.precision = apply_precision(self.model, cfg, self.run_dir)
        self.sampler_precision = (apply_precision(self.sampler_model, cfg, None, side="sampler") if separate
                                  else self.precision)
        self._param_pairs = _param_pairs(self.model, self.sampler_model) if separate else []
        try:
            self.sampler = make_sampler(self.sampler_model, self.tok, batch_size=cfg.rollout.batch_size,
                                        engine=cfg.rollout.sampler, alignment=cfg.precision.alignment,
                                        norm_quant=cfg.rollout.norm_quant, fp4_weights=cfg.rollout.fp4_weights)
        except UnsupportedModel as e:
            raise ConfigError(f"rollout.sampler={cfg.rollout.sampler}: {e}") from None
        except ValueError as e:
            if not cfg.rollout.norm_quant:
                raise
            raise ConfigError(f"rollout.norm_quant=true: {e}") from None
        self.schedule = PromptSchedule(self.examples, cfg.rollout.prompts_per_step, cfg.trainer.seed,
                                       cfg.data.shuffle)
        self._prompt_cache: dict[int, list[int]] = {}
        params = [p for p in self.model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optim_impl = _optim_impl(o.impl, triton_kernels_ok(self.device))
        opt_cls = torch.optim.AdamW
        if self.optim_impl == "minite":
            from minite_kernels.optim import AdamW as opt_cls
        self.optimizer = opt_cls(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
        # shared parameters: the optimizer's recorded amaxes spare the grouped re-quantizer a read of each weight
        shared = self.sampler_model is self.model
        self._requantize = Requantizer(self.sampler_model, self.sampler.pad_id,
                                       optimizer=self.optimizer if shared else None)
        self._eager_reported = False  # the graph sampler's fallback to eager decoding, said once
        warm = o.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)
        group = cfg.rollout.prompts_per_step * cfg.rollout.n
        self.actor_cfg = A.build_actor_config(cfg.algorithm, micro_batch_size=cfg.algorithm.micro_batch_size,
                                              mini_batch_size=group // cfg.algorithm.mini_batches,
                                              n=cfg.rollout.n)
        self.diag_cfg = self.loss_mode.diagnostics_config(cfg.algorithm)
        self.state = {"nan_skipped_total": 0, "consecutive_nan": 0, "run_id": None, "cpu_threads": self.cpu_threads}
        self.start_step = 0
        ckpt = self._resume()
        if ckpt is not None:
            st = self._resumed_state
            self.state.update({k: st[k] for k in self.state if k in st})
            if cfg.trainer.cpu_threads is None and self.state["cpu_threads"] != self.cpu_threads:
                # float reductions depend on the thread count: keep the interrupted run's, so that the resumed
                # steps reproduce what an uninterrupted run would have computed
                self.cpu_threads = choose_cpu_threads(self.state["cpu_threads"], self.device)
            self.state["cpu_threads"] = self.cpu_threads
            self.start_step = int(st["step"])
            self._copy_to_sampler()
            print(f"[trainers] resumed from {ckpt} (step {self.start_step})", file=sys.stderr)
        self.state["run_id"] = self.state["run_id"] or uuid.uuid4().hex[:12]
        if ckpt is not None:
            _warn_config_changes(self.run_dir / "config.yaml", cfg)
        gone = heldout.drop_after(self.run_dir, self.start_step)
        if gone:
            print(f"[trainers] dropped the evals after step {self.start_step}, of the interrupted execution: "
                  f"{', '.join(gone)}", file=sys.stderr)
        samples = self.run_dir / "samples.jsonl"
        if samples.is_file():  # keep the samples of the steps the restored checkpoint contains
            keep = [ln for ln in samples.read_text().splitlines() if ln.strip() and _row_step(ln) <= self.start_step]
            atomic_write_text(samples, "".join(ln + "\n" for ln in keep))
        atomic_write_text(self.run_dir / "config.yaml", to_yaml(cfg))
        meta = {"command": " ".join(sys.argv), "recipe": cfg.recipe, "env": env_snapshot(),
                "engine": "local", "device": str(self.device), "precision": self.precision,
                "sampler_precision": self.sampler_precision,
                "cpu_threads": self.cpu_threads, "optimizer": self.optim_impl,
                "alignment": cfg.precision.alignment,
                "python": platform.python_version(), "torch": torch.__version__, "run_id": self.state["run_id"],
                "resumed_from": str(ckpt) if ckpt else None, "reward_fn": self.reward_name,
                "sampler": self.sampler.describe(),
                "num_examples": len(self.examples)}
        _write_meta(self.run_dir, meta)
        self.meta = meta
        print(to_yaml(cfg), file=sys.stderr)

    def _resume(self) -> pathlib.Path | None:
        """Load the checkpoint to resume from, if any, into the model and optimizer; return its path.

        ``trainer.resume=auto`` tries the newest checkpoint first and falls back to the previous one when it is
        damaged (each failure printed). A directory holding another run is refused before anything loads."""
        cfg = self.cfg
        if cfg.trainer.resume == "never":
            return None
        explicit = cfg.trainer.resume not in ("auto", "force")
        candidates = [pathlib.Path(cfg.trainer.resume)] if explicit else checkpoints_newest_first(self.ckpt_root)
        if not candidates:
            return None
        if not explicit:
            check_same_run(self.run_dir / "config.yaml", cfg)
        errors = []
        for c in candidates:
            try:
                self._resumed_state = load_checkpoint(c, model=self.model, optimizer=self.optimizer,
                                                      scheduler=self.scheduler)
                return c
            except CheckpointError as e:
                if explicit:
                    raise
                errors.append(str(e))
                print(f"[trainers] cannot resume from {c.name}: {e}", file=sys.stderr)
        raise CheckpointError(f"no checkpoint in {self.ckpt_root} can be resumed ({len(errors)} tried; the newest: "
                              f"{errors[0]}). Pass trainer.resume=never to start over in this directory, or "
                              "choose another trainer.output_dir")

    # ----------------------------------------------------------------------------------------------- step
    def _prompt_ids(self, ex) -> list[int]:
        if ex.index not in self._prompt_cache:
            self._prompt_cache[ex.index] = render_prompt(self.tok, ex, self.cfg.data)
        return self._prompt_cache[ex.index]

    def _score(self, step: int, examples, completions) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.cfg.rollout.n
        scores, extras = [], {}
        self._texts = []
        for i, c in enumerate(completions):
            ex = examples[i // n]
            text = self.tok.decode(c.token_ids, skip_special_tokens=True)
            self._texts.append(text)
            s, extra = score_one(self.reward_fn, self.reward_name, data_source=ex.data_source, response=text,
                                 ground_truth=ex.answer,
                                 extra_info={"question": ex.question, "index": ex.index, "step": step, **ex.extra},
                                 sample=f"step {step}, sample {i} (prompt index {ex.index})")
            scores.append(s)
            for k, v in extra.items():
                extras.setdefault(f"reward/{k}", []).append(v)
        return torch.tensor(scores, dtype=torch.float32), {k: float(np.mean(v)) for k, v in extras.items()}

    def _logprobs(self, batch: RolloutBatch, rows: torch.Tensor, *, grad: bool, with_entropy: bool):
        sub = batch.select(rows)
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        with ctx:
            logp, ent = response_logprobs(self.model, sub.input_ids, sub.attention_mask, sub.response_mask,
                                          prompt_len=sub.prompt_len, temperature=self.cfg.rollout.temperature,
                                          chunk_size=self.cfg.trainer.logprob_chunk_size,
                                          with_entropy=with_entropy)
        return logp, ent, sub.response_mask.shape[1]

    def _recompute_old(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        B, R = batch.response_mask.shape
        old = torch.zeros((B, R), device=self.device)
        ent = torch.zeros((B, R), device=self.device)
        alg = self.cfg.algorithm
        self.model.eval()
        for rows in micro_batches(batch, torch.arange(B, device=self.device), alg.micro_batch_size,
                                  alg.micro_batch_tokens):
            lp, en, r = self._logprobs(batch, rows, grad=False, with_entropy=True)
            old[rows, :r] = lp
            ent[rows, :r] = en
        return old, ent

    def _update(self, step: int, batch: RolloutBatch, old: torch.Tensor, adv: torch.Tensor,
                weights: torch.Tensor | None) -> tuple[dict[str, float], bool]:
        cfg, alg = self.cfg, self.cfg.algorithm
        B = batch.response_mask.shape[0]
        mask = batch.response_mask
        gen = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_003 + step)
        sums: dict[str, list[float]] = {}
        nonfinite = False
        grad_norms = []
        self.model.train()
        for _epoch in range(alg.ppo_epochs):
            perm = torch.randperm(B, generator=gen).to(self.device)
            for mini in perm.chunk(alg.mini_batches):
                A.set_global_batch_info(self.actor_cfg, num_tokens=int(mask[mini].sum().item()),
                                        num_seqs=int(mini.numel()))
                self.optimizer.zero_grad(set_to_none=True)
                pg_loss_sum = 0.0
                for micro in micro_batches(batch, mini, alg.micro_batch_size, alg.micro_batch_tokens):
                    logp, ent, r = self._logprobs(batch, micro, grad=True, with_entropy=alg.entropy_coeff > 0)
                    loss, m = A.micro_batch_loss(
                        self.actor_cfg, self.loss_fn, logp=logp, entropy=ent if alg.entropy_coeff > 0 else None,
                        old_logp=old[micro, :r], advantages=adv[micro, :r], mask=mask[micro, :r],
                        weights=None if weights is None else weights[micro, :r],
                        sampler_logp=batch.sampler_logp[micro, :r])
                    if not A.is_finite(loss.detach()):
                        nonfinite = True
                        break
                    loss.backward()
                    pg_loss_sum += m.pop("actor/pg_loss")
                    for k, v in m.items():
                        sums.setdefault(k, []).append(v)
                if nonfinite:
                    break
                sums.setdefault("actor/pg_loss", []).append(pg_loss_sum)
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip or float("inf"))
                if not A.is_finite(gn):
                    nonfinite = True
                    break
                grad_norms.append(float(gn))
                self.optimizer.step()
            if nonfinite:
                break
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        if not nonfinite:
            self.scheduler.step()
        out = {k: float(np.mean(v)) for k, v in sums.items()}
        if grad_norms:
            out["actor/grad_norm"] = float(np.mean(grad_norms))
        out["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        return out, nonfinite

    def _weight_sync(self) -> dict[str, float]:
        """The sampler's weights after an update. With one precision it shares the learner's parameters; with
        its own (``precision.sampler``) they are first copied in place into its model. Quantized weight caches
        are keyed on the parameter version counter, so the first sampler forward after that re-quantizes. On
        CUDA with the Triton kernels, all eligible weights are re-quantized here in grouped launches, and whatever
        remains by a 1-token forward (``rollout.precision.Requantizer``), so the whole cost is reported as
        `timing/sync_s`."""
        self._copy_to_sampler()
        if not self.sampler_precision.get("patched"):
            return {}
        return self._requantize()

    def _report_eager_fallback(self, step: int) -> None:
        """Say once, on stderr and in meta.json, that the CUDA-graph sampler gave up on graphs (a failed
        capture): every later rollout decodes step by step on the host, several times slower."""
        reason = getattr(self.sampler, "eager_reason", None)
        if reason is None or self._eager_reported:
            return
        self._eager_reported = True
        print(f"[trainers] warning: from step {step} the rollout decodes eagerly, several times slower: {reason}",
              file=sys.stderr)
        _write_meta(self.run_dir, {"sampler": self.sampler.describe()})

    def _copy_to_sampler(self) -> None:
        """The learner's parameters into the sampler's own model, in place (the CUDA-graph sampler's buffers
        keep their addresses); nothing when the two share one model."""
        with torch.no_grad():
            for dst, src in self._param_pairs:
                dst.copy_(src)

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step; under ``precision.alignment=strict`` every reduction is batch-invariant
        (``minite_kernels.strict``)."""
        if self.cfg.precision.alignment != "strict":
            return self._step(step)
        from minite_kernels.strict import StrictMode

        with StrictMode():
            return self._step(step)

    def _step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        t: dict[str, float] = {}
        t_step = time.perf_counter()
        examples = self.schedule.batch(step)
        prompts = [self._prompt_ids(ex) for ex in examples for _ in range(cfg.rollout.n)]
        params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                                max_new_tokens=cfg.rollout.max_new_tokens,
                                seed=cfg.trainer.seed * 1_000_003 + step)
        self.model.eval()
        before = dict(getattr(self.sampler, "stats", {}))
        with timed(t, "timing/rollout_s", self.device):
            completions = self.sampler.generate(prompts, params)
        # the engine's graph work this step: a capture costs a warm-up step plus the capture, a refill a copy
        sampler_counts = {f"rollout/{k}": float(v - before.get(k, 0))
                          for k, v in getattr(self.sampler, "stats", {}).items() if k in SAMPLER_COUNTS}
        self._report_eager_fallback(step + 1)  # the step number the metrics log
        with timed(t, "timing/reward_s", self.device):
            scores, reward_extra = self._score(step, examples, completions)
        batch = collate(completions, self.sampler.pad_id, self.device)
        mask = batch.response_mask
        group_ids = [i // cfg.rollout.n for i in range(len(completions))]
        adv = A.grpo_advantages(scores, mask.cpu(), group_ids, cfg.algorithm.norm_adv_by_std_in_grpo).to(self.device)
        with timed(t, "timing/logprob_s", self.device):
            old, ent = self._recompute_old(batch)
        from triage import mismatch_metrics

        delta = (old - batch.sampler_logp) * mask
        if cfg.precision.alignment == "strict" and bool((delta != 0).any()):
            raise AlignmentError(
                f"precision.alignment=strict, step {step + 1}: the learner's log-probs differ from the sampler's "
                f"on {int((delta != 0).sum())} of {int(mask.sum())} tokens (max |delta| "
                f"{float(delta.abs().max()):.3g}); strict mode promises equal bits, so the run stops here")
        metrics: dict[str, float] = dict(mismatch_metrics(delta, adv, mask, self.diag_cfg))
        weights, rc_metrics = A.rollout_is_weights(cfg.algorithm, old, batch.sampler_logp, mask)
        metrics.update(rc_metrics)
        with timed(t, "timing/update_s", self.device):
            upd, nonfinite = self._update(step, batch, old, adv, weights)
        for k, v in upd.items():
            metrics.setdefault(k, v)
        with timed(t, "timing/sync_s", self.device):
            metrics.update(self._weight_sync())
        ntok = batch.num_tokens
        lengths = mask.sum(-1)
        correct = (scores >= 1.0).float()
        groups = scores.view(-1, cfg.rollout.n)
        step_s = time.perf_counter() - t_step
        metrics.update({
            "reward/mean": float(scores.mean()), "reward/std": float(scores.std(unbiased=False)),
            "reward/accuracy": float(correct.mean()),
            "reward/solved_groups_frac": float((groups.max(-1).values >= 1).float().mean()),
            "reward/zero_adv_groups_frac": float((groups.std(-1, unbiased=False) == 0).float().mean()),
            "actor/entropy": float((ent * mask).sum() / mask.sum().clamp(min=1)),
            "response/length_mean": float(lengths.float().mean()), "response/length_max": float(lengths.max()),
            "response/clip_frac": float(np.mean([c.finish_reason == "length" for c in completions])),
            "perf/response_tokens": float(ntok), "perf/step_s": step_s,
            "perf/tokens_per_s": ntok / max(step_s, 1e-9),
            "perf/rollout_tokens_per_s": ntok / max(t["timing/rollout_s"], 1e-9),
            "train/nan_skipped": float(nonfinite), **reward_extra, **t, **sampler_counts,
        })
        self._log_samples(step, examples, completions, scores)
        if nonfinite:
            self.state["nan_skipped_total"] += 1
            self.state["consecutive_nan"] += 1
        else:
            self.state["consecutive_nan"] = 0
        metrics["train/nan_skipped_total"] = float(self.state["nan_skipped_total"])
        return metrics

    def _log_samples(self, step: int, examples, completions, scores: torch.Tensor) -> None:
        k = min(self.cfg.trainer.log_samples, len(completions))
        if not k:
            return
        n = self.cfg.rollout.n
        with (self.run_dir / "samples.jsonl").open("a") as f:
            for i in range(k):
                ex = examples[i // n]
                f.write(json.dumps({"step": step + 1, "question": ex.question, "gold": ex.answer,
                                    "response": self._texts[i], "reward": float(scores[i]),
                                    "finish_reason": completions[i].finish_reason}) + "\n")

    # ----------------------------------------------------------------------------------------------- loop
    def save(self, step: int) -> pathlib.Path:
        return save_checkpoint(self.ckpt_root, step, model=self.model, tokenizer=self.tok, optimizer=self.optimizer,
                               scheduler=self.scheduler, trainer_state=dict(self.state),
                               keep=self.cfg.trainer.keep_checkpoints)

    def train(self) -> dict[str, Any]:
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ConfigError(f"trainer.output_dir={self.run_dir} is a file, not a directory")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            probe = self.run_dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"trainer.output_dir={self.run_dir} cannot hold a run: {e.strerror or e}") from None
        with RunLock(self.run_dir):
            return self._train()

    def _train(self) -> dict[str, Any]:
        cfg = self.cfg
        self.setup()
        tracker = Tracker(cfg, self.run_dir, start_step=self.start_step, meta=self.meta)
        last: dict[str, float] = {}
        stopped = False
        with GracefulStop() as stop:
            try:
                for step in range(self.start_step, cfg.trainer.max_steps):
                    last = self.step(step)
                    done = step + 1
                    if heldout.due(cfg, done) and self.state["consecutive_nan"] == 0:
                        last.update(heldout.evaluate(cfg, done, sampler=self.sampler, tokenizer=self.tok,
                                                     precision=self.sampler_precision, device=self.device,
                                                     run_dir=self.run_dir))
                    tracker.log(done, last)
                    if self.state["consecutive_nan"] >= cfg.trainer.max_consecutive_nan:
                        raise TrainingDiverged(
                            f"{self.state['consecutive_nan']} consecutive steps had a non-finite loss or gradient "
                            f"(last at step {done}); stopping. The last good checkpoint is "
                            f"{latest_checkpoint(self.ckpt_root) or '(none yet)'}, untouched.")
                    healthy = self.state["consecutive_nan"] == 0
                    if healthy and (stop.requested or (cfg.trainer.save_every and done % cfg.trainer.save_every == 0)
                                    or (done == cfg.trainer.max_steps and cfg.trainer.save_final)):
                        self.save(done)
                    if stop.requested and done < cfg.trainer.max_steps:
                        stopped = True
                        saved = "its checkpoint saved" if healthy else \
                            "not saved (a non-finite step): the last good checkpoint stays"
                        print(f"[trainers] SIGTERM: stopped after step {done}, {saved}; trainer.resume=auto "
                              "continues there", file=sys.stderr)
                        break
            finally:
                tracker.close()
                _write_meta(self.run_dir, {"sampler": self.sampler.describe()})
        ckpt = str(latest_checkpoint(self.ckpt_root) or "")
        self._report(ckpt)
        return {"run_dir": str(self.run_dir), "last_step_metrics": last, "checkpoint": ckpt, "stopped": stopped}

    def _report(self, checkpoint: str) -> None:
        """Write ``curves.png`` (the Figure-2 panels) and print the end-of-run summary; a plotting failure
        is reported, never fatal (the run itself is complete)."""
        from trainers.plots import plot, read_rows
        from trainers.summary import run_summary

        rows = read_rows(self.run_dir) if (self.run_dir / "metrics.jsonl").is_file() else []
        curves = None
        try:
            curves = plot([self.run_dir], self.run_dir / "curves.png")
        except Exception as e:  # noqa: BLE001 - e.g. a headless machine without a matplotlib backend
            print(f"[trainers] curves.png not written: {type(e).__name__}: {e}", file=sys.stderr)
        print(run_summary(self.run_dir, rows, checkpoint, curves, triage=self.loss_mode.reports_gate),
              file=sys.stderr)


def run_local(cfg: Config) -> dict[str, Any]:
    return LocalTrainer(cfg).train()



"""Building the engine: seeds and CPU threads, data, reward and loss, the model(s) and their precision, the
sampler, the optimizer and LR schedule, the actor config, the resume, and the run directory's config, samples and
meta."""
from __future__ import annotations

import copy
import platform
import random
import sys
import uuid

import numpy as np
import torch

from rollout import make_sampler
from rollout.decoder import UnsupportedModel
from rollout.models import load_model_and_tokenizer
from rollout.precision import Requantizer, triton_kernels_ok
from trainers import heldout
from trainers.checkpoint import atomic_write_text
from trainers.config import ConfigError, to_yaml
from trainers.data import PromptSchedule, load_examples
from trainers.engines.local.checkpointing import _warn_config_changes
from trainers.engines.local.rollout_phase import _row_step
from trainers.engines.local.runtime import _write_meta, choose_cpu_threads, env_snapshot
from trainers.engines.local.update import dropout_sources
from trainers.engines.local.weight_sync import _param_pairs, apply_precision
from trainers.learner import actor as A
from trainers.losses import loss_mode
from trainers.provenance import record_code
from trainers.rewards.registry import load_reward_fn


def _optim_impl(impl: str, triton_ok: bool) -> str:
    """optim.impl resolved: "auto" is minite_kernels' AdamW where its fused kernel runs (CUDA with Triton)."""
    if impl == "auto":
        return "minite" if triton_ok else "torch"
    return impl


class SetupMixin:
    """``LocalTrainer.setup``: everything a run needs before its first step."""

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
        # eval.precision: the policy also evaluated at one precision, on its own copy (of the model before any
        # recipe) unless the run's sampler already is that precision
        needs_copy = cfg.eval.precision is not None and not heldout.own_is_common(cfg)
        self.common_eval = heldout.CommonEval(cfg, self.model, self.tok) if needs_copy else None
        self.precision = apply_precision(self.model, cfg, self.run_dir)
        # algorithm.old_log_prob=auto: the update's forward gives the old log-probs only where it is the old
        # policy's forward, i.e. drops nothing in training mode
        self.old_from_update = cfg.algorithm.old_from_update() and cfg.precision.alignment != "strict"
        dropout = dropout_sources(self.model)
        if self.old_from_update and dropout:
            print(f"[trainers] the model drops activations in training ({', '.join(dropout[:3])}): the old log-probs "
                  "are recomputed without gradients (algorithm.old_log_prob=auto)", file=sys.stderr)
            self.old_from_update = False
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
            if cfg.rollout.norm_quant != "on":
                raise
            raise ConfigError(f"rollout.norm_quant=on: {e}") from None
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
        code = record_code(self.run_dir, self.start_step)[-1]  # trainers.provenance: the code this execution runs
        meta = {"command": " ".join(sys.argv), "recipe": cfg.recipe, "env": env_snapshot(),
                "engine": "local", "device": str(self.device), "precision": self.precision,
                "sampler_precision": self.sampler_precision,
                "cpu_threads": self.cpu_threads, "optimizer": self.optim_impl,
                "alignment": cfg.precision.alignment,
                "python": platform.python_version(), "torch": torch.__version__, "run_id": self.state["run_id"],
                "resumed_from": str(ckpt) if ckpt else None, "reward_fn": self.reward_name,
                "sampler": self.sampler.describe(),
                "num_examples": len(self.examples), "code": code}
        _write_meta(self.run_dir, meta)
        self.meta = meta
        print(to_yaml(cfg), file=sys.stderr)

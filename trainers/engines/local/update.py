"""The learner side of a step: response log-probs, the recompute of the old policy's log-probs, and the PPO
update (epochs x mini-batches x micro-batches -> AdamW -> LR schedule)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from trainers.learner import actor as A
from trainers.learner.batch import RolloutBatch, Rows, micro_batches
from trainers.learner.logprobs import response_logprobs


def dropout_sources(model: torch.nn.Module) -> list[str]:
    """Where ``model`` drops activations in training mode: ``nn.Dropout`` modules with p > 0, and config fields
    named ``*dropout*`` / ``*pdrop*`` above 0 (HF attention applies those inside its functions). Where there is
    any, the update's forward is not the old policy's forward, so its log-probs cannot stand in for them."""
    found = [name for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.p > 0]
    conf = getattr(model, "config", None)
    for key, value in (conf.to_dict() if hasattr(conf, "to_dict") else {}).items():
        if ("dropout" in key or "pdrop" in key) and type(value) in (int, float) and value > 0:  # not flags
            found.append(f"config.{key}={value}")
    return found


class LearnerMixin:
    """``LocalTrainer``'s learner methods: log-probs and the policy update."""

    def _logprobs(self, batch: RolloutBatch, rows: Rows, *, grad: bool, with_entropy: bool):
        sub = batch.select(rows)
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        with ctx:
            logp, ent = response_logprobs(self.model, sub.input_ids, sub.attention_mask, sub.response_mask,
                                          prompt_len=sub.prompt_len, temperature=self.cfg.rollout.temperature,
                                          chunk_size=self.cfg.trainer.logprob_chunk_size,
                                          with_entropy=with_entropy, kernel=self.cfg.trainer.logprob_kernel,
                                          response_tokens=sub.num_tokens, padded=sub.padded())
        return logp, ent, sub.response_mask.shape[1]

    def _recompute_old(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        B, R = batch.response_mask.shape
        old = torch.zeros((B, R), device=self.device)
        ent = torch.zeros((B, R), device=self.device)
        rows_per_micro, tokens_per_micro = self.cfg.algorithm.log_prob_micro()
        self.model.eval()
        for rows in micro_batches(batch, torch.arange(B, device=self.device), rows_per_micro, tokens_per_micro):
            lp, en, r = self._logprobs(batch, rows, grad=False, with_entropy=True)
            old[rows.index, :r] = lp
            ent[rows.index, :r] = en
        return old, ent

    def _update(self, step: int, batch: RolloutBatch, old: torch.Tensor, adv: torch.Tensor,
                weights: torch.Tensor | None, fill: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[dict[str, float], bool]:
        """The PPO update. ``fill = (ent, reached)``: the update's forward gives the old log-probs
        (``AlgorithmConfig.old_from_update``: one epoch of one mini-batch, so no optimizer step falls between the
        forwards): each micro-batch's detached log-probs go into ``old`` and its entropies into ``ent`` before its
        loss, ``reached`` marks its rows, and its rollout-correction weights are made from them (per token or per
        sequence, so per micro-batch is the whole batch's rule); ``weights`` is then None."""
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
                for rows in micro_batches(batch, mini, alg.micro_batch_size, alg.micro_batch_tokens):
                    micro = rows.index
                    logp, ent, r = self._logprobs(batch, rows, grad=True,
                                                  with_entropy=alg.entropy_coeff > 0 or fill is not None)
                    w = None if weights is None else weights[micro, :r]
                    if fill is not None:
                        old[micro, :r] = logp.detach()
                        fill[0][micro, :r] = ent.detach()
                        fill[1][micro] = True
                        w, _ = A.rollout_is_weights(alg, old[micro, :r], batch.sampler_logp[micro, :r],
                                                    mask[micro, :r])
                    loss, m = A.micro_batch_loss(
                        self.actor_cfg, self.loss_fn, logp=logp, entropy=ent if alg.entropy_coeff > 0 else None,
                        old_logp=old[micro, :r], advantages=adv[micro, :r], mask=mask[micro, :r],
                        weights=w, sampler_logp=batch.sampler_logp[micro, :r])
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

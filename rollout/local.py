"""Our own batched generation loop (the `engine=local` sampler), with a KV cache.

It runs the *same* (possibly minite-patched) model object as the learner but through a different code path:
a prefill over the left-padded prompts, then one token at a time with ``past_key_values``. The learner runs a
single full-sequence forward, so the log-prob gap it measures between the two is real execution mismatch
(report §2.2), not an artefact of reusing one forward.

Layout: prompts are left-padded; ``attention_mask`` marks real tokens and ``position_ids = cumsum(mask) - 1``,
so every sequence sees positions 0, 1, 2, ... exactly as in the learner's unpadded forward. Finished rows are
dropped from the batch (and the cache) as soon as they emit a stop token.

Truncated sampling: ``top_p`` / ``top_k`` are supported here (evaluation uses them) and the returned log-probs
are then those of the truncated distribution. The trainer refuses them (``trainers.config.validate``): the
learner would have to recompute log-probs under the same truncation, and a token the sampler kept can fall
outside the learner's differently-rounded nucleus, which makes the gap infinite (verl issue #6240). RL runs
use the defaults top_p = 1, top_k = -1.

Measured on CPU: per-token NVFP4 activation scaling quantizes every token row on its own, so on a 2-layer
model decode and full forward agree to fp32 rounding (~3e-7, tests/trainers/test_precision_gap.py) while
per-tensor scaling opens a gap (~3e-2 mean |delta|). On the 30-layer SmolLM2-135M with
``nvfp4_per_token_bf16_bwd`` the gap is 0.30-0.41 mean |delta| (neg. tail depth 1.6): fp32 rounding
differences between the decode and full-forward GEMM shapes (~1e-6) move values across FP4 rounding
boundaries, and each flip is a full FP4 step that the following layers amplify (report §2.2).
"""
from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field

import torch

from rollout.models import stop_token_ids
from rollout.rng import seed_word
from rollout.sampling import draw

#: what ``Completion.extra["sampling_backend"]`` and the run metadata name the draw: inverse-CDF in torch
#: with the per-row counter streams of ``rng.py``
DRAW = "torch-rowhash"
#: ``default``: each kernel's own reduction order; ``strict``: batch-invariant (``minite_kernels.strict``)
ALIGNMENTS = ("default", "strict")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) [B, L] for left-padded prompts; positions count real tokens
    from 0 (pads get 0), as in the learner's unpadded forward."""
    B, L = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, L - len(p):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def check_prompts(prompt_ids: list[list[int]]) -> None:
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was sampled; it is included in token_ids) or "length"
    extra: dict = field(default_factory=dict)
    #: the same log-probs as an fp32 tensor on the sampler's device (a sampler that keeps them there sets it): the
    #: learner's batch takes its values from here, so they do not go through Python floats on their way back
    logprob_row: torch.Tensor | None = field(default=None, repr=False, compare=False)


class Sampler(abc.ABC):
    """What every sampler shares: the model and tokenizer, the pad and default stop ids, and ``generate``,
    which cuts the prompts into batches of ``batch_size`` and hands each, with the call index of its first
    row, to ``_generate_batch``. ``alignment="strict"`` runs it under ``minite_kernels.strict.StrictMode``
    (batch-invariant reductions: the log-probs equal the learner's, bit for bit, under the same mode)."""

    name = "sampler"

    def __init__(self, model, tokenizer, *, batch_size: int | None = None, alignment: str = "default") -> None:
        if alignment not in ALIGNMENTS:
            raise ValueError(f"unknown alignment {alignment!r}; valid: {', '.join(ALIGNMENTS)}")
        self.alignment = alignment
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("tokenizer has neither pad_token_id nor eos_token_id; set tokenizer.pad_token")
        self.pad_id = int(pad)
        self.default_stop_ids = stop_token_ids(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams = SamplingParams()) -> list[Completion]:
        if not prompt_ids:
            return []
        check_prompts(prompt_ids)
        bs = self.batch_size or len(prompt_ids)
        out: list[Completion] = []
        with self._alignment_mode():
            for start in range(0, len(prompt_ids), bs):
                out.extend(self._generate_batch(prompt_ids[start:start + bs], params, start))
        return out

    def _alignment_mode(self):
        """StrictMode under alignment 'strict', unless the caller (a strict trainer step) already runs one."""
        from minite_kernels import StrictMode, strict_active

        return StrictMode() if self.alignment == "strict" and not strict_active() else contextlib.nullcontext()

    def describe(self) -> dict:
        return {"sampler": self.name, "sampling_backend": DRAW, "alignment": self.alignment}

    @abc.abstractmethod
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, row0: int) -> list[Completion]:
        """Completions of one batch whose first row is row ``row0`` of the call (its random stream id)."""


class LocalSampler(Sampler):
    """Batched sampler returning per-token processed log-probs of the sampled tokens (the CPU path, and the
    reference the CUDA-graph engine is tested against). Row ``i`` of a call draws token ``t`` with
    ``row_uniforms(seed, i, t)``, whatever the batch size."""

    name = "loop"

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, row0: int) -> list[Completion]:
        from transformers import DynamicCache

        dev = self.device
        stops = torch.tensor(sorted(set(self.default_stop_ids) | set(params.stop_token_ids)) or [-1], device=dev)
        key = torch.tensor(seed_word(params.seed))
        B = len(prompts)
        input_ids, mask, position_ids = left_pad(prompts, self.pad_id, dev)
        cache = DynamicCache(config=self.model.config)
        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        reasons = ["length"] * B
        alive = torch.arange(B, device=dev)  # original row of each live row
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        next_pos = position_ids[:, -1:] + 1
        for t in range(params.max_new_tokens):
            tok, lp = draw(out.logits[:, -1, :], params.temperature, params.top_k, params.top_p, key,
                           alive + row0, t)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            rows = alive.tolist()
            for j, r in enumerate(rows):
                tokens[r].append(tok_l[j])
                logps[r].append(lp_l[j])
            done = torch.isin(tok, stops)
            for j in done.nonzero().flatten().tolist():
                reasons[rows[j]] = "stop"
            if t == params.max_new_tokens - 1 or bool(done.all()):
                break
            keep = (~done).nonzero().flatten()
            if keep.numel() < alive.numel():
                alive, tok, next_pos, mask = alive[keep], tok[keep], next_pos[keep], mask[keep]
                cache.batch_select_indices(keep)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            out = self.model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos,
                             past_key_values=cache, use_cache=True)
            next_pos = next_pos + 1
        return [Completion(prompt_ids=list(p), token_ids=tokens[i], logprobs=logps[i], finish_reason=reasons[i],
                           extra={"sampling_backend": DRAW})
                for i, p in enumerate(prompts)]

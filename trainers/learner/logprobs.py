"""Learner log-probs: one full-sequence forward, then a chunked log-softmax gather.

For response token y_t with hidden state h_{t-1} (the position that predicts it):

    z = lm_head(h_{t-1}) / T ;  logp_t = z[y_t] - logsumexp(z) ;  H_t = -sum_v softmax(z)_v * log softmax(z)_v

The [N, V] fp32 logits are built `chunk_size` tokens at a time and only for response tokens (mask = 1); with
gradients enabled each chunk is wrapped in activation checkpointing, so neither the forward nor the backward
ever holds more than one chunk of logits. Example: 512 response tokens, V = 151,669, chunk 128 -> 78 MB of fp32
logits live at once instead of 311 MB.

Where it applies (a CUDA device, a plain BF16/FP16 ``nn.Linear`` head without bias, no logit soft-capping, a
positive temperature, not under strict alignment), ``kernel="auto"`` computes the same statistics with the fused
Triton kernel instead (``minite_kernels.backends.triton.logprobs_and_entropy``: chunked BF16 GEMMs, one pass per
chunk with an online log-sum-exp, its own recomputing backward): about 3x faster forward and backward on an H100
and within 2e-6 of this path's log-probs (``scripts/bench_logprob_paths.py``, ``benchmarks/RESULTS.md``). Strict
alignment keeps the chunked path, whose rounding the sampler reproduces bit for bit.

Layout (verl's): ``input_ids = [left-padded prompt | right-padded response]``; response tokens start at column P.
``position_ids = cumsum(attention_mask) - 1`` so positions match the sampler's KV-cache decode exactly.

Given the batch's host facts (``response_tokens``, ``padded``: ``RolloutBatch.num_tokens`` / ``padded()``)
the pass reads nothing back from the GPU before its loss. It then gathers the response positions by their known
count instead of a boolean mask, and for the decoders in ``CAUSAL_MASK_MODELS`` on sdpa it makes the mask
transformers would make (None where nothing is padded, so sdpa's ``is_causal``; else the boolean [B, 1, S, S]
``key <= query and attention_mask[b, key]``) instead of letting transformers check the mask for padding on the
device. The ``MASK_MAPPING_MODELS`` get it as the mapping their forward takes ready-made, since given None they
would check the position ids for packed sequences on the device instead (Llama, whose forward always makes its
mask, still does that once per forward of an unpadded batch). Same operands, same kernels, so the same bits
(``tests/trainers/test_logprobs.py``); without the facts, each of these asks the GPU once.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from torch import nn

from minite_kernels.strict import StrictMode, strict_active
from rollout.sampling import process_logits

#: transformers model types whose layers all attend through the one causal mask ``create_causal_mask`` makes
#: (with no sliding-window layer: ``causal_mask`` checks ``config.layer_types``)
CAUSAL_MASK_MODELS = ("llama", "qwen2", "qwen3", "qwen3_moe")
#: of those, the ones whose forward also takes the mask already made, as the mapping ``{layer type: mask}`` it
#: would build itself (transformers' path for masks ``generate`` prepared), and then makes none: only that way
#: does an unpadded batch skip transformers' packed-sequence check of the position ids, which reads the device
#: back (``masking_utils.find_packed_sequence_indices``) when the mask is None
MASK_MAPPING_MODELS = ("qwen2", "qwen3")
#: tokens per chunk of the fused kernel: one chunk x V BF16 logits block at a time (2048 x 151,936: 0.6 GB)
FUSED_CHUNK = 2048
KERNELS = ("auto", "torch")


def _chunk_stats(lm_head, h: torch.Tensor, y: torch.Tensor, temperature: float, softcap: float | None,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = lm_head(h)
    if softcap:
        logits = torch.tanh(logits.float() / softcap) * softcap
    z = process_logits(logits, temperature)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
    else:
        ent = torch.zeros_like(logp)
    return logp, ent


def _fused(lm_head, h: torch.Tensor, temperature: float, softcap):
    """``logprobs_and_entropy`` where the module docstring says it applies, else None."""
    w = getattr(lm_head, "weight", None)
    if type(lm_head) is not nn.Linear or lm_head.bias is not None or softcap or not temperature > 0:
        return None
    if w.dtype not in (torch.bfloat16, torch.float16) or h.dtype != w.dtype or strict_active():
        return None
    try:
        from minite_kernels.backends.triton import kernel_device_ok, logprobs_and_entropy
    except ImportError:  # no Triton: the chunked path
        return None
    return logprobs_and_entropy if kernel_device_ok(h) else None


def causal_mask(model, attention_mask: torch.Tensor, padded: bool) -> torch.Tensor | dict | None:
    """The attention mask to hand ``model``: for a ``CAUSAL_MASK_MODELS`` decoder on sdpa, what transformers'
    ``create_causal_mask`` would make of ``attention_mask`` (``padded``: whether it has a 0), made without reading
    it back (for ``MASK_MAPPING_MODELS`` as the mapping ``{"full_attention": mask}``, so that the model makes no
    mask and checks nothing); for any other model ``attention_mask`` itself."""
    conf = model.config
    if (conf.model_type not in CAUSAL_MASK_MODELS or getattr(conf, "_attn_implementation", None) != "sdpa"
            or "sliding_attention" in (getattr(conf, "layer_types", None) or ())):
        return attention_mask
    mask = None  # sdpa's is_causal, as transformers chooses for a mask without padding
    if padded:
        pos = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        mask = (pos[None, None, None, :] <= pos[None, None, :, None]) & attention_mask.bool()[:, None, None, :]
    return {"full_attention": mask} if conf.model_type in MASK_MAPPING_MODELS else mask


def response_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                      *, prompt_len: int, temperature: float = 1.0, chunk_size: int = 256,
                      with_entropy: bool = True, kernel: str = "auto", response_tokens: int | None = None,
                      padded: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (logp [B, R], entropy [B, R]) of the response tokens, zero where response_mask is 0. ``kernel``:
    ``auto`` takes the fused kernel where it applies (module docstring), ``torch`` always the chunked path.
    ``response_tokens`` (the mask's count of 1s) and ``padded`` (whether ``attention_mask`` has a 0), known on the
    host, spare the GPU read-backs (module docstring); both or neither."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got {kernel!r}")
    if (response_tokens is None) != (padded is None):
        raise ValueError("give both response_tokens and padded (the batch's host facts), or neither")
    B, S = input_ids.shape
    R = S - prompt_len
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    base = getattr(model, model.base_model_prefix)
    mask = attention_mask if padded is None else causal_mask(model, attention_mask, padded)
    hidden = base(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                  use_cache=False).last_hidden_state
    h = hidden[:, prompt_len - 1:S - 1, :]
    targets = input_ids[:, prompt_len:]
    sel = response_mask.bool()
    # the response positions, row by row: by their known count, or by the mask (its count read back)
    where = (tuple(torch.nonzero_static(sel, size=response_tokens).unbind(1)) if response_tokens is not None
             else sel.nonzero(as_tuple=True))
    h_sel, y_sel = h[where], targets[where]
    lm_head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    fused = _fused(lm_head, h_sel, temperature, softcap) if kernel == "auto" else None
    use_ckpt = torch.is_grad_enabled() and h_sel.requires_grad
    ckpt_kw: dict = {"use_reentrant": False}
    if use_ckpt and strict_active():  # the backward's recompute must round as the forward did
        ckpt_kw["context_fn"] = lambda: (contextlib.nullcontext(), StrictMode())
    logps, ents = [], []
    if fused is not None:
        lp, en = fused(h_sel, lm_head.weight, y_sel, temperature=temperature, chunk=FUSED_CHUNK)
        logps.append(lp)
        ents.append(en if with_entropy else torch.zeros_like(lp))
    else:
        for i in range(0, h_sel.shape[0], chunk_size):
            args = (lm_head, h_sel[i:i + chunk_size], y_sel[i:i + chunk_size], temperature, softcap, with_entropy)
            lp, en = checkpoint(_chunk_stats, *args, **ckpt_kw) if use_ckpt else _chunk_stats(*args)
            logps.append(lp)
            ents.append(en)
    dtype = torch.float32
    logp = torch.zeros((B, R), dtype=dtype, device=input_ids.device)
    ent = torch.zeros((B, R), dtype=dtype, device=input_ids.device)
    if logps:
        logp = logp.index_put(where, torch.cat(logps))
        ent = ent.index_put(where, torch.cat(ents).detach() if not with_entropy else torch.cat(ents))
    return logp, ent


def naive_response_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            response_mask: torch.Tensor, *, prompt_len: int, temperature: float = 1.0
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: full [B, S, V] logits from model(...), then log_softmax. Only for tests."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    z = process_logits(logits[:, prompt_len - 1:-1, :], temperature)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    m = response_mask.to(logp.dtype)
    return logp * m, ent * m

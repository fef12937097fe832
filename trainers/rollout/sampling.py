"""Logit processing and token sampling shared by the sampler (and, for log-probs, the learner).

Processed log-prob (what verl calls ``logprobs_mode=processed_logprobs``) of the sampled token y:

    z = logits / T                       (temperature T > 0)
    z[v] = -inf  for v outside top-k / top-p (only when they are set)
    logp(y) = z[y] - logsumexp(z)

Example: logits [2, 1, 0], T = 2 -> z = [1, 0.5, 0]; logsumexp(z) = 1.6802 -> logp = [-0.6802, -1.1802, -1.6802].
With top_k = 1, z = [1, -inf, -inf] and logp(0) = 0.

T = 0 means greedy decoding; its log-probs are then those of the unscaled logits (T = 1).
Sampling uses ``flashinfer.sampling.sampling_from_probs`` on CUDA tensors when flashinfer is importable,
inverse-CDF sampling in torch otherwise; both draw from the same processed distribution.
"""
from __future__ import annotations

import functools

import torch


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0
                   ) -> torch.Tensor:
    """Return fp32 processed logits (temperature, then top-k, then top-p masking with -inf)."""
    z = logits.float()
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    if top_k is not None and 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_z, idx = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token is always kept)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


@functools.lru_cache(maxsize=1)
def flashinfer_sampling():
    """The `flashinfer.sampling` module, or None when flashinfer is not installed."""
    try:
        import flashinfer.sampling as fs  # type: ignore[import-not-found]
    except Exception:
        return None
    return fs


def sampling_backend(device: torch.device | str) -> str:
    return "flashinfer" if torch.device(device).type == "cuda" and flashinfer_sampling() is not None else "torch"


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One categorical draw per row: the first index whose cumulative probability exceeds u * total.

    One uniform per row and an fp64 cumsum (much faster than ``torch.multinomial`` on 150k-token vocabularies
    on CPU). A zero-probability token never has cdf[i] > cdf[i-1], so it is never drawn.
    """
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


def sample_tokens(processed: torch.Tensor, *, greedy: bool = False, generator: torch.Generator | None = None,
                  backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from softmax(processed); return (token_ids int64 [B], logprobs fp32 [B])."""
    logp = torch.log_softmax(processed, dim=-1)
    if greedy:
        tokens = processed.argmax(dim=-1)
    elif backend == "flashinfer":
        fs = flashinfer_sampling()
        tokens = fs.sampling_from_probs(logp.exp(), deterministic=True, generator=generator).long()
    else:
        tokens = inverse_cdf_sample(logp.exp(), generator)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

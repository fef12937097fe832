"""Logit processing and token sampling shared by the sampler (and, for log-probs, the learner).

Processed log-prob (what verl calls ``logprobs_mode=processed_logprobs``) of the sampled token y:

    z = logits / T                       (temperature T > 0)
    z[v] = -inf  for v outside top-k / top-p (only when they are set)
    logp(y) = z[y] - logsumexp(z)

Example: logits [2, 1, 0], T = 2 -> z = [1, 0.5, 0]; logsumexp(z) = 1.6802 -> logp = [-0.6802, -1.1802, -1.6802].
With top_k = 1, z = [1, -inf, -inf] and logp(0) = 0.

T = 0 means greedy decoding; its log-probs are then those of the unscaled logits (T = 1).
Sampling is inverse-CDF with one uniform per row from the per-row counter streams of ``rng.py``, so the
same (seed, row, token index) draws the same token in the reference loop, in the CUDA-graph engine, on CPU
and on GPU (given the same logits).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rollout.rng import row_uniforms


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


#: the two-level draw's block: per row, one fp64 cumsum over V / BLOCK block sums and one over a block
CDF_BLOCK = 1024


def inverse_cdf_sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row: the first index whose cumulative probability exceeds ``t = u * total``.

    ``u`` holds one fp64 uniform in [0, 1) per row (``rollout.rng.row_uniforms``). Two levels, in
    fp64: the block of ``CDF_BLOCK`` tokens whose cumulative block sum first exceeds t, then the token within
    it (a full-vocabulary fp64 scan per row costs more than the rest of the draw on a GPU). A zero-probability
    token is never drawn: its cumulative sum equals its predecessor's, so it is never the first to exceed t.

    Example: probs [0.5, 0, 0.5], u = 0.6 -> t = 0.6, cdf [0.5, 0.5, 1.0], the first cdf > 0.6 is index 2.
    """
    b, v = probs.shape
    nb = -(-v // CDF_BLOCK)
    p = F.pad(probs.double(), (0, nb * CDF_BLOCK - v)).view(b, nb, CDF_BLOCK)
    block_cdf = p.sum(-1).cumsum(-1)                                              # [B, nb]
    t = u.to(torch.float64).unsqueeze(-1) * block_cdf[:, -1:]                     # [B, 1]
    j = torch.searchsorted(block_cdf, t, right=True).clamp(max=nb - 1)            # [B, 1]
    before = torch.where(j > 0, block_cdf.gather(-1, (j - 1).clamp(min=0)), 0.0)
    inner = p.gather(1, j.unsqueeze(-1).expand(b, 1, CDF_BLOCK)).squeeze(1).cumsum(-1) + before
    # rounding may leave t at or past the block's end: aim just below it (its last nonzero token)
    t = torch.minimum(t, torch.nextafter(inner[:, -1:], torch.zeros_like(t)))
    i = torch.searchsorted(inner, t, right=True).clamp(max=CDF_BLOCK - 1)
    return (j * CDF_BLOCK + i).squeeze(-1).clamp(max=v - 1)


def sample_tokens(processed: torch.Tensor, u: torch.Tensor | None = None, *, greedy: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from softmax(processed) with the row uniforms ``u`` (argmax when ``greedy``);
    return (token_ids int64 [B], logprobs fp32 [B]). No host synchronisation: CUDA-graph safe."""
    logp = torch.log_softmax(processed, dim=-1)
    if greedy:
        tokens = processed.argmax(dim=-1)
    else:
        if u is None:
            raise ValueError("sampling needs one uniform per row (u); pass greedy=True for argmax decoding")
        tokens = inverse_cdf_sample(logp.exp(), u)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def draw(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, key: torch.Tensor,
         rows: torch.Tensor, step: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's draw: :func:`process_logits`, the uniforms of stream rows ``rows`` at token index
    ``step`` (``rollout.rng.row_uniforms`` with the folded ``key``; none when greedy) and :func:`sample_tokens`.
    The CUDA-graph engine compiles it (``rollout.fused``), which turns some thirty small kernels into a few."""
    greedy = temperature == 0
    z = process_logits(logits, temperature, top_k, top_p)
    u = None if greedy else row_uniforms(key, rows, step)
    return sample_tokens(z, u, greedy=greedy)

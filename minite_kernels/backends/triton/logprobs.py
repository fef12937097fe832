"""Token log-probabilities and entropy from hidden states and ``lm_head`` without materialising all logits.

For each token row ``h`` with target ``y`` and temperature ``T`` (report §3: the learner recomputes
``old_logp`` and the entropy bonus on the sampled tokens)::

    z     = (h @ Wᵀ) / T                    (BF16 GEMM -> BF16 logits, as the model's lm_head computes them)
    lse   = max(z) + log Σ_j exp(z_j - max(z))
    logp  = z_y - lse
    H     = lse - Σ_j p_j z_j ,   p_j = exp(z_j - lse)

Backward (chunks recomputed, so nothing of size tokens x vocab is kept)::

    dz_j  = g_logp (δ_{jy} - p_j) - g_H p_j (z_j - E_p[z]) ,   dlogits = dz / T
    dh    = dlogits @ W ,   dW += dlogitsᵀ @ h

Worked example: logits (0, ln 3) for y = 1, T = 1: p = (1/4, 3/4), logp = ln(3/4) = -0.2877,
H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623.

Two implementations of the same function:
  - :func:`logprobs_and_entropy_torch`: pure PyTorch, chunked over tokens (CPU and GPU reference);
  - :func:`logprobs_and_entropy`: chunked BF16 cuBLAS GEMMs plus one fused Triton pass per chunk (online
    max / sum-exp / Σ p z in FP32; in the backward, ``dlogits`` is written over the recomputed logits).
Peak extra memory is one ``chunk x vocab`` BF16 logits block instead of several ``tokens x vocab`` FP32
tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import interpret_mode


@triton.jit
def _lse_entropy_fwd_kernel(
    logits_ptr, ids_ptr, logp_ptr, ent_ptr, lse_ptr, ez_ptr, V, stride_row, inv_temp, BLOCK_V: tl.constexpr
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    m = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    t = tl.zeros([BLOCK_V], tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        z = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, z)
        alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        e = tl.where(z == float("-inf"), 0.0, tl.exp(z - m_new))
        s = s * alpha + e
        t = t * alpha + tl.where(z == float("-inf"), 0.0, e * z)
        m = m_new
    gm = tl.max(m, axis=0)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - gm))
    ssum = tl.sum(s * scale, axis=0)
    tsum = tl.sum(t * scale, axis=0)
    lse = gm + tl.log(ssum)
    ez = tsum / ssum
    y = tl.load(ids_ptr + row)
    zy = tl.load(base + y).to(tl.float32) * inv_temp
    tl.store(logp_ptr + row, zy - lse)
    tl.store(ent_ptr + row, lse - ez)
    tl.store(lse_ptr + row, lse)
    tl.store(ez_ptr + row, ez)


@triton.jit
def _lse_entropy_bwd_kernel(
    logits_ptr, ids_ptr, lse_ptr, ez_ptr, glp_ptr, gent_ptr, V, stride_row, inv_temp, BLOCK_V: tl.constexpr
):
    """Overwrite one row of logits with dlogits = (g_logp (onehot - p) - g_H p (z - E[z])) / T."""
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    lse = tl.load(lse_ptr + row)
    ez = tl.load(ez_ptr + row)
    glp = tl.load(glp_ptr + row)
    gent = tl.load(gent_ptr + row)
    y = tl.load(ids_ptr + row)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < V
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32) * inv_temp
        p = tl.exp(z - lse)
        dz = glp * (tl.where(cols == y, 1.0, 0.0) - p) - gent * p * (z - ez)
        tl.store(base + cols, (dz * inv_temp).to(logits_ptr.dtype.element_ty), mask=mask)


def _flatten(hidden: torch.Tensor, token_ids: torch.Tensor):
    if hidden.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and token_ids {tuple(token_ids.shape)} disagree: hidden must be "
            "[..., H] with token_ids [...] of the same leading shape"
        )
    return hidden.reshape(-1, hidden.shape[-1]), token_ids.reshape(-1)


def _check_temperature(temperature: float) -> float:
    temperature = float(temperature)
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return temperature


def logprobs_and_entropy_torch(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-PyTorch chunked reference: (logp, entropy) in FP32, shaped like ``token_ids``; differentiable
    (autograd keeps each chunk's softmax for its backward; use the fused version to avoid that)."""
    temperature = _check_temperature(temperature)
    h, ids = _flatten(hidden, token_ids)
    lps, ents = [], []
    for i in range(0, h.shape[0], chunk):
        z = (h[i : i + chunk] @ lm_head_weight.t()).float() / temperature
        logp_all = torch.log_softmax(z, dim=-1)
        lps.append(logp_all.gather(-1, ids[i : i + chunk, None].long()).squeeze(-1))
        ents.append(-(logp_all.exp() * logp_all).sum(-1))
    shape = token_ids.shape
    if not lps:
        empty = h.new_zeros(0, dtype=torch.float32)
        return empty.reshape(shape), empty.reshape(shape)
    return torch.cat(lps).reshape(shape), torch.cat(ents).reshape(shape)


def _fwd_chunk(h, w, ids, inv_temp, logits_buf, lp, ent, lse, ez):
    c = h.shape[0]
    logits = logits_buf[:c]
    torch.mm(h, w.t(), out=logits)
    _lse_entropy_fwd_kernel[(c,)](
        logits, ids, lp, ent, lse, ez, logits.shape[1], logits.stride(0), inv_temp, BLOCK_V=2048, num_warps=8
    )


class _FusedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, ids, temperature, chunk):
        inv_temp = 1.0 / temperature
        t_count = h.shape[0]
        lp = torch.empty(t_count, dtype=torch.float32, device=h.device)
        ent, lse, ez = torch.empty_like(lp), torch.empty_like(lp), torch.empty_like(lp)
        buf = torch.empty((min(chunk, max(t_count, 1)), w.shape[0]), dtype=h.dtype, device=h.device)
        for i in range(0, t_count, chunk):
            sl = slice(i, i + chunk)
            _fwd_chunk(h[sl], w, ids[sl], inv_temp, buf, lp[sl], ent[sl], lse[sl], ez[sl])
        ctx.save_for_backward(h, w, ids, lse, ez)
        ctx.inv_temp = inv_temp
        ctx.chunk = chunk
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, w, ids, lse, ez = ctx.saved_tensors
        t_count = h.shape[0]
        g_lp = torch.zeros_like(lse) if g_lp is None else g_lp.float().contiguous()
        g_ent = torch.zeros_like(lse) if g_ent is None else g_ent.float().contiguous()
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty_like(h) if need_h else None
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        chunk = ctx.chunk
        buf = torch.empty((min(chunk, max(t_count, 1)), w.shape[0]), dtype=h.dtype, device=h.device)
        for i in range(0, t_count, chunk):
            sl = slice(i, i + chunk)
            hc = h[sl]
            c = hc.shape[0]
            logits = buf[:c]
            torch.mm(hc, w.t(), out=logits)
            _lse_entropy_bwd_kernel[(c,)](
                logits,
                ids[sl],
                lse[sl],
                ez[sl],
                g_lp[sl],
                g_ent[sl],
                logits.shape[1],
                logits.stride(0),
                ctx.inv_temp,
                BLOCK_V=2048,
                num_warps=8,
            )
            if need_h:
                torch.mm(logits, w, out=dh[sl])
            if need_w:
                dw += (logits.t() @ hc).float()
        return dh, (dw.to(w.dtype) if need_w else None), None, None, None


def logprobs_and_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) in FP32, shaped like ``token_ids``, from ``hidden`` [..., H] and ``lm_head_weight``
    [V, H], without materialising ``tokens x V`` logits (peak extra memory: one ``chunk x V`` block in the
    hidden dtype). Differentiable w.r.t. ``hidden`` and ``lm_head_weight`` (chunked recompute).

    CUDA tensors use the fused Triton kernels; anything else falls back to :func:`logprobs_and_entropy_torch`.
    """
    temperature = _check_temperature(temperature)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    h, ids = _flatten(hidden, token_ids)
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != h.shape[1]:
        raise ValueError(f"lm_head_weight must be [V, H={h.shape[1]}], got {tuple(lm_head_weight.shape)}")
    on_device = (h.is_cuda and lm_head_weight.is_cuda) or interpret_mode()
    if not on_device or h.dtype != lm_head_weight.dtype or h.shape[0] == 0:
        return logprobs_and_entropy_torch(
            hidden, lm_head_weight, token_ids, temperature=temperature, chunk=chunk
        )
    lp, ent = _FusedLogprobEntropy.apply(
        h.contiguous(), lm_head_weight.contiguous(), ids.contiguous(), temperature, int(chunk)
    )
    return lp.reshape(token_ids.shape), ent.reshape(token_ids.shape)

"""One grouped Triton launch for an AdamW step over many parameters, which also records max|θ| per parameter
(the per-tensor amax that NVFP4 weight quantization needs; ``minite_kernels/optim/adamw.py`` states the
formula and owns the host side).

Per element, fp32 arithmetic in the association order of the PyTorch CPU ops the reference uses (their
vectorized kernels fuse ``lerp`` and ``addcmul`` into FMAs), round-to-nearest divisions and square roots
(``div_rn`` / ``sqrt_rn``, not Triton's approximate ``/`` and ``sqrt``), loads and stores in the tensors'
own dtypes (stores round to nearest even)::

    θ ← θ·(1 − γλ)
    m ← fma(g − m, 1 − β₁, m)
    v ← fma(g·(1 − β₂), g, v·β₂)
    θ ← θ + ((−γ / (1 − β₁ᵗ))·m) / (√v / √(1 − β₂ᵗ) + ε)
    amax[slot] ← max(amax[slot], max |θ| over the program's elements, as stored)

The amax is an integer ``atomic_max`` on the fp32 bits of ``|θ|`` (non-negative floats order like their
bits; NaN's bits sort above +inf, so a NaN parameter poisons its amax as the reference's ``amax`` does).

Table row per parameter (int64): param, grad, exp_avg, exp_avg_sq addresses (16-byte aligned, checked by
the caller), numel, first program, amax slot; ``pmap[p]`` is program ``p``'s row. A program updates
``ITERS * BLOCK`` consecutive elements of one parameter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import interpret_mode
from .quantize_bf16 import _bf16_bits

#: launch geometry (H200 sweep, 1.41 B bf16 params: 5.6 ms, 89% of copy bandwidth): BLOCK elements per loop
#: iteration at 4 per thread (8 or more per thread measured 2-4x slower; register pressure of the IEEE
#: division and square-root sequences is the likely cause, not profiled), ITERS iterations per program (the
#: table lookups amortized: 7.5 ms at 1, 5.9 at 4, 5.6 at 16)
BLOCK = 512
WARPS = 4
ITERS = 16
ROW = 8  # int64 columns per table row


@triton.jit
def _store_cast(v, DTYPE: tl.constexpr, RNE_INT: tl.constexpr):
    """``v.to(DTYPE)`` with round-to-nearest-even (the CPU interpreter truncates fp32 -> bf16 casts)."""
    if RNE_INT and DTYPE == tl.bfloat16:
        return _bf16_bits(v, True).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return v.to(DTYPE)


@triton.jit
def _fma(x, y, z, RNE_INT: tl.constexpr):
    """fp32 ``x*y + z`` with one rounding (the interpreter's fma rounds twice: emulate it in fp64, where
    the product is exact)."""
    if RNE_INT:
        return (x.to(tl.float64) * y.to(tl.float64) + z.to(tl.float64)).to(tl.float32)
    return tl.fma(x, y, z)


@triton.jit
def _col_ptr(row, col: tl.constexpr, ty: tl.constexpr):
    return tl.multiple_of(tl.load(row + col).to(tl.pointer_type(ty)), 16)


@triton.jit
def _adamw_amax_kernel(
    tab_ptr,
    pmap_ptr,
    amax_ptr,
    scal_ptr,
    P_DTYPE: tl.constexpr,
    S_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ITERS: tl.constexpr,
    RNE_INT: tl.constexpr,
):
    decay = tl.load(scal_ptr)
    one_minus_beta1 = tl.load(scal_ptr + 1)
    beta2 = tl.load(scal_ptr + 2)
    one_minus_beta2 = tl.load(scal_ptr + 3)
    neg_step_size = tl.load(scal_ptr + 4)
    bc2_sqrt = tl.load(scal_ptr + 5)
    eps = tl.load(scal_ptr + 6)
    pid = tl.program_id(0)
    i = tl.load(pmap_ptr + pid)
    row = tab_ptr + i * 8
    p_ptr = _col_ptr(row, 0, P_DTYPE)
    g_ptr = _col_ptr(row, 1, P_DTYPE)
    m_ptr = _col_ptr(row, 2, S_DTYPE)
    v_ptr = _col_ptr(row, 3, S_DTYPE)
    n = tl.load(row + 4)
    local = (pid - tl.load(row + 5)).to(tl.int64)
    slot = tl.load(row + 6)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for j in range(ITERS):  # ITERS consecutive blocks per program: the table is read once per program
        offs = (local * ITERS + j) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = p * decay
        m = _fma(g - m, one_minus_beta1, m, RNE_INT)
        v = _fma(g * one_minus_beta2, g, v * beta2, RNE_INT)
        denom = tl.math.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
        p = p + tl.math.div_rn(m * neg_step_size, denom)
        p_out = _store_cast(p, P_DTYPE, RNE_INT)
        tl.store(p_ptr + offs, p_out, mask=mask)
        tl.store(m_ptr + offs, _store_cast(m, S_DTYPE, RNE_INT), mask=mask)
        tl.store(v_ptr + offs, _store_cast(v, S_DTYPE, RNE_INT), mask=mask)
        bits = tl.abs(p_out.to(tl.float32)).to(tl.int32, bitcast=True)
        acc = tl.maximum(acc, tl.where(mask, bits, 0))
    tl.atomic_max(amax_ptr + slot, tl.max(acc, axis=0))


def launch_adamw_amax(table, pmap, amax_bits, programs: int, scalars, p_dtype, s_dtype) -> None:
    """Launch the grouped step: ``scalars`` = fp32 device tensor (1-γλ, 1-β₁, β₂, 1-β₂, -γ/(1-β₁ᵗ),
    √(1-β₂ᵗ), ε)."""
    _adamw_amax_kernel[(programs,)](
        table,
        pmap,
        amax_bits,
        scalars,
        P_DTYPE=_TL[p_dtype],
        S_DTYPE=_TL[s_dtype],
        BLOCK=BLOCK,
        ITERS=ITERS,
        RNE_INT=interpret_mode(),
        num_warps=WARPS,
        enable_fp_fusion=False,  # no contraction of p·decay + Δ: the FMAs are the explicit ones
    )


def _tl_dtypes() -> dict:
    import torch

    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


_TL = _tl_dtypes()

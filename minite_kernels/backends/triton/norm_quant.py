"""The ops that make a quantized linear's input, fused with its per-token NVFP4 quantize-dequantize: the fast
lane's activation operand X̂ in the launch that makes the activation (report §2.2 / §5.1). Two producers:
RMSNorm with the residual add before it (``add_rms_norm_deq``) and the SiLU-gated product of an MLP
(``silu_mul_deq``).

For one BF16 row (HF's ``LlamaRMSNorm`` / ``Qwen3RMSNorm`` and the residual add before them, each rounding
step as PyTorch's BF16 ops take it)::

    s  = bf16(h + y)                                    the new residual (written out)
    n  = bf16(s * rsqrt(Σ s² / K + eps))                (sum and rsqrt in fp32)
    x  = bf16(w * n)                                    the normed activation
    X̂  = deq(Q_token(x))                               per-token NVFP4, as ``quantize_token_deq_bf16``

and for the MLP's down projection input (``F.silu`` then the product, each rounded to BF16)::

    x  = bf16(bf16(g / (1 + exp(-g))) * u)              X̂ = deq(Q_token(x))

The decode step of the CUDA-graph sampler feeds X̂ to the packed q/k/v, gate/up and down GEMMs
(``rollout/packed.py``). Without these kernels it runs the producer (one launch) and the lane's quantizer
(another) per input; with them, one launch. With programmatic dependent launch on (``pdl``,
``MINITE_TRITON_PDL=on``), both let the kernel after them start at once: the FP4-weight GEMM (``fp4w.py``),
launched with PDL, then streams its weights into L2 while they run and waits for X̂.

The quantization is the BF16 per-token kernel's own device code (``quantize_bf16._token_segment_store``), fed
with ``x`` held in registers as BF16 words, so X̂ is bit-equal to ``quantize_token_deq_bf16(x)`` for the same
``x``. ``x`` itself may differ from PyTorch's ops on the same row in the last BF16 bit: the sum of squares runs in
another order, ``rsqrt`` is the GPU's approximate one (as in PyTorch's CUDA kernel) and ``exp`` Triton's.

Worked example (K = 16, eps = 0, w = 1): h = [3, 4, 0, ...], y = 0 -> s = h, Σ s² / K = 25 / 16, so
n = s / 1.25 = [2.4, 3.2, 0, ...] -> bf16 [2.40625, 3.203125, 0, ...]; the row amax 3.203125 gives
S_enc = 2688 / 3.203125 = 839.2 and the block scale e4m3(3.203125 * 839.2 / 6) = 448; the scaled values
2.40625 * 6 / 3.203125 = 4.507 and 6 round to the E2M1 values 4 and 6, so X̂ = [2.1354, 3.2031, 0, ...]
(4 and 6 times 3.203125 / 6, each rounded to bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import interpret_mode, pdl_on
from .nvfp4_jit import _encode_scale
from .pdl_jit import gdc_launch_dependents
from .quantize_bf16 import _bf16_bits, _load_halves, _max_nan, _pair_absmax, _token_segment_store

#: the widest row the kernel holds in registers (as the BF16 per-token kernel)
MAX_K = 16384


@triton.jit
def _as_words(p):
    """``p`` addressed as int32 words (two BF16 values each)."""
    return p.to(tl.pointer_type(tl.int32), bitcast=True)


@triton.jit
def _tile(rows, blks, M, NBK, stride):
    """(word offsets, mask) of words 0..3 of each block in ``_load_halves``' block-major [NB, 1, 4] tile; words
    4..7 are at ``offsets + 4``. Outputs are contiguous rows of ``stride`` words."""
    j = tl.arange(0, 4)
    off = blks[:, None, None] * 8 + rows[None, :, None] * stride + j[None, None, :]
    return off, (blks[:, None, None] < NBK) & (rows[None, :, None] < M)


@triton.jit
def _as_f32(bits):
    """fp32 value of BF16 bit patterns in the low 16 bits of int32."""
    return (bits << 16).to(tl.float32, bitcast=True)


@triton.jit
def _round(v, RNE_INT: tl.constexpr):
    """fp32 ``v`` rounded to BF16 (round to nearest even), as fp32."""
    return _as_f32(_bf16_bits(v, RNE_INT))


@triton.jit
def _words(e, o, RNE_INT: tl.constexpr):
    """int32 words of two BF16 halves (element 2j low, 2j + 1 high) from fp32 values exact in BF16."""
    return _bf16_bits(e, RNE_INT) | (_bf16_bits(o, RNE_INT) << 16)


@triton.jit
def _residual(hw, yw, HAS_Y: tl.constexpr, RNE_INT: tl.constexpr):
    """(even, odd) fp32 halves of bf16(h + y) (of h without ``y``) for words ``hw`` / ``yw``."""
    he = (hw << 16).to(tl.float32, bitcast=True)
    ho = (hw & -65536).to(tl.float32, bitcast=True)
    if HAS_Y:
        he = _round(he + (yw << 16).to(tl.float32, bitcast=True), RNE_INT)
        ho = _round(ho + (yw & -65536).to(tl.float32, bitcast=True), RNE_INT)
    return he, ho


@triton.jit
def _normed(se, so, r, ww, RNE_INT: tl.constexpr):
    """(even, odd) fp32 halves of bf16(w * bf16(s * r))."""
    we = (ww << 16).to(tl.float32, bitcast=True)
    wo = (ww & -65536).to(tl.float32, bitcast=True)
    return _round(we * _round(se * r, RNE_INT), RNE_INT), _round(wo * _round(so * r, RNE_INT), RNE_INT)


@triton.jit
def _add_rms_norm_deq_kernel(
    h_ptr,
    y_ptr,
    w_ptr,
    hout_ptr,
    x_ptr,
    deq_ptr,
    M,
    NBK,
    inv_k,
    eps,
    NB: tl.constexpr,
    HAS_Y: tl.constexpr,
    WRITE_X: tl.constexpr,
    RNE_INT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One row per program, held in registers as block-major [NB, 1, 4] word tiles (``_load_halves``).
    ``PDL``: let the next kernel, if launched with programmatic dependent launch, start now (it waits for this
    one before it reads what this one writes)."""
    if PDL:
        gdc_launch_dependents()
    rows = tl.program_id(0) + tl.arange(0, 1)
    blks = tl.arange(0, NB)
    stride = NBK * 8
    h_lo, h_hi = _load_halves(_as_words(h_ptr), rows, blks, M, NBK, stride)
    y_lo, y_hi = h_lo, h_hi
    if HAS_Y:
        y_lo, y_hi = _load_halves(_as_words(y_ptr), rows, blks, M, NBK, stride)
    w_lo, w_hi = _load_halves(_as_words(w_ptr), rows * 0, blks, 1, NBK, 0)
    se_lo, so_lo = _residual(h_lo, y_lo, HAS_Y, RNE_INT)
    se_hi, so_hi = _residual(h_hi, y_hi, HAS_Y, RNE_INT)
    off, mask = _tile(rows, blks, M, NBK, stride)
    hout_ptr = _as_words(hout_ptr)
    if HAS_Y:
        tl.store(hout_ptr + off, _words(se_lo, so_lo, RNE_INT), mask=mask)
        tl.store(hout_ptr + off + 4, _words(se_hi, so_hi, RNE_INT), mask=mask)
    ss = se_lo * se_lo + so_lo * so_lo + se_hi * se_hi + so_hi * so_hi  # padding blocks loaded as 0
    ss = tl.sum(tl.sum(ss, axis=2), axis=0)  # [1]
    r = tl.math.rsqrt(ss * inv_k + eps)[None, :, None]
    xe_lo, xo_lo = _normed(se_lo, so_lo, r, w_lo, RNE_INT)
    xe_hi, xo_hi = _normed(se_hi, so_hi, r, w_hi, RNE_INT)
    x_lo = _words(xe_lo, xo_lo, RNE_INT)
    x_hi = _words(xe_hi, xo_hi, RNE_INT)
    _store_x_and_deq(x_lo, x_hi, _as_words(x_ptr), _as_words(deq_ptr), off, mask, rows, blks, M, NBK, WRITE_X,
                     RNE_INT)


@triton.jit
def _store_x_and_deq(x_lo, x_hi, x_ptr, deq_ptr, off, mask, rows, blks, M, NBK, WRITE_X: tl.constexpr,
                     RNE_INT: tl.constexpr):
    """Store the activation words (``WRITE_X``) and their per-token quantize-dequantize: the steps of
    ``quantize_bf16._quant_token_kernel_bf16`` on the words in registers."""
    if WRITE_X:
        tl.store(x_ptr + off, x_lo, mask=mask)
        tl.store(x_ptr + off + 4, x_hi, mask=mask)
    vmax = tl.reduce(_max_nan(_pair_absmax(x_lo), _pair_absmax(x_hi)), 2, _max_nan)  # [NB, 1]
    amax = tl.reduce(vmax, 0, _max_nan)  # [1]
    bad = ~(amax < float("inf"))
    amax = tl.where(bad, 0.0, amax)
    s_enc, s_dec = _encode_scale(amax)
    _token_segment_store(
        x_lo, x_hi, vmax, amax, bad, s_enc, s_dec,
        deq_ptr, deq_ptr, deq_ptr, deq_ptr, deq_ptr,  # only deq is written (no codes, scales, qs or random bits)
        rows, blks, M, NBK,
        False, False, False, True, RNE_INT,
    )


@triton.jit
def _silu(v, RNE_INT: tl.constexpr):
    """bf16(v / (1 + exp(-v))) (``F.silu`` on BF16: fp32 math, one rounding)."""
    return _round(tl.math.div_rn(v, 1.0 + tl.exp(-v)), RNE_INT)


@triton.jit
def _silu_mul_halves(gw, uw, RNE_INT: tl.constexpr):
    """(even, odd) fp32 halves of bf16(silu(g) * u) for words ``gw`` / ``uw``."""
    ge = (gw << 16).to(tl.float32, bitcast=True)
    go = (gw & -65536).to(tl.float32, bitcast=True)
    ue = (uw << 16).to(tl.float32, bitcast=True)
    uo = (uw & -65536).to(tl.float32, bitcast=True)
    return _round(_silu(ge, RNE_INT) * ue, RNE_INT), _round(_silu(go, RNE_INT) * uo, RNE_INT)


@triton.jit
def _silu_mul_deq_kernel(
    g_ptr,
    u_ptr,
    x_ptr,
    deq_ptr,
    M,
    NBK,
    stride_g,
    stride_u,
    NB: tl.constexpr,
    WRITE_X: tl.constexpr,
    RNE_INT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One row per program, as ``_add_rms_norm_deq_kernel`` (``PDL`` too); ``g`` and ``u`` rows ``stride_*``
    words apart (the two halves of a gate/up GEMM's output)."""
    if PDL:
        gdc_launch_dependents()
    rows = tl.program_id(0) + tl.arange(0, 1)
    blks = tl.arange(0, NB)
    g_lo, g_hi = _load_halves(_as_words(g_ptr), rows, blks, M, NBK, stride_g)
    u_lo, u_hi = _load_halves(_as_words(u_ptr), rows, blks, M, NBK, stride_u)
    xe_lo, xo_lo = _silu_mul_halves(g_lo, u_lo, RNE_INT)
    xe_hi, xo_hi = _silu_mul_halves(g_hi, u_hi, RNE_INT)
    off, mask = _tile(rows, blks, M, NBK, NBK * 8)
    _store_x_and_deq(_words(xe_lo, xo_lo, RNE_INT), _words(xe_hi, xo_hi, RNE_INT), _as_words(x_ptr),
                     _as_words(deq_ptr), off, mask, rows, blks, M, NBK, WRITE_X, RNE_INT)


def _check(fn: str, operands, k: int, *, row_strided: bool = False) -> None:
    """BF16 operands of the given shapes, contiguous (``row_strided``: rows may be apart, each contiguous, at
    an even element stride), starting at an even element (they are read as 32-bit words)."""
    for name, t, shape in operands:
        if t is None:
            continue
        layout_ok = t.is_contiguous() or (row_strided and t.dim() == 2 and t.stride(1) == 1 and t.stride(0) % 2 == 0)
        if t.dtype != torch.bfloat16 or tuple(t.shape) != shape or not layout_ok:
            want = "rows contiguous at an even stride" if row_strided else "contiguous"
            raise ValueError(
                f"{fn}: {name} must be a bfloat16 tensor of shape {shape}, {want}; got {t.dtype} {tuple(t.shape)} "
                f"strides {t.stride()}"
            )
        if t.data_ptr() % 4:
            raise ValueError(f"{fn}: {name} must start at an even element (read as 32-bit words)")
    if k % 16 or not 0 < k <= MAX_K:
        raise ValueError(f"{fn}: K must be a multiple of 16 in [16, {MAX_K}]; got {k}")


def _warps(nb: int) -> int:
    """Warps for a row of ``nb`` blocks: at least 4 words (one whole 16-element half block) per thread, so that a
    block's max never crosses threads; at most 32 (a program holds one row, so an MLP-wide row of 9728-12288
    values needs the whole block's threads to finish in a few microseconds)."""
    return max(1, min(32, nb // 32))


def add_rms_norm_deq(
    h: torch.Tensor,
    y: torch.Tensor | None,
    w: torch.Tensor,
    eps: float,
    *,
    write_x: bool = False,
    pdl: bool | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """``(h + y, X̂, x)`` for BF16 rows ``h`` (and ``y``) [M, K] and the norm weight ``w`` [K] (see the module
    docstring): the new residual (None without ``y``), the quantize-dequantized normed activation, and the
    normed activation itself with ``write_x`` (else None). K % 16 == 0, K <= 16384, contiguous operands.

    ``pdl`` (default: ``pdl_enabled``, i.e. ``MINITE_TRITON_PDL=on`` / ``options().pdl`` on sm_90+): the kernel
    lets the next one start at once if that one is launched with programmatic dependent launch (the FP4-weight
    GEMM, which prefetches its weights and then waits for X̂). It changes no value; True where it cannot run
    (the interpreter, a pre-Hopper GPU) is an error."""
    m, k = h.shape
    _check("add_rms_norm_deq", (("h", h, (m, k)), ("y", y, (m, k)), ("w", w, (k,))), k)
    on = pdl_on(h, pdl)
    deq = torch.empty_like(h)
    h_out = torch.empty_like(h) if y is not None else None
    x = torch.empty_like(h) if write_x else None
    if m:
        nb = triton.next_power_of_2(k // 16)
        _add_rms_norm_deq_kernel[(m,)](
            h,
            y if y is not None else h,
            w,
            h_out if h_out is not None else deq,
            x if x is not None else deq,
            deq,
            m,
            k // 16,
            1.0 / k,
            float(eps),
            NB=nb,
            HAS_Y=y is not None,
            WRITE_X=write_x,
            RNE_INT=interpret_mode(),
            PDL=on,
            num_warps=_warps(nb),
        )
    return h_out, deq, x


def silu_mul_deq(
    g: torch.Tensor, u: torch.Tensor, *, write_x: bool = False, pdl: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(X̂, x)`` for the SiLU-gated product ``x = silu(g) * u`` of BF16 rows ``g``, ``u`` [M, K] (see the module
    docstring): its quantize-dequantize, and ``x`` itself with ``write_x`` (else None). Rows of ``g`` and ``u``
    may be apart (the two column halves of one [M, 2K] tensor), each contiguous; X̂ and x are contiguous.
    ``pdl``: as :func:`add_rms_norm_deq`."""
    m, k = g.shape
    _check("silu_mul_deq", (("g", g, (m, k)), ("u", u, (m, k))), k, row_strided=True)
    on = pdl_on(g, pdl)
    deq = torch.empty_like(g)
    x = torch.empty_like(g) if write_x else None
    if m:
        nb = triton.next_power_of_2(k // 16)
        _silu_mul_deq_kernel[(m,)](
            g, u, x if x is not None else deq, deq, m, k // 16, g.stride(0) // 2, u.stride(0) // 2,
            NB=nb, WRITE_X=write_x, RNE_INT=interpret_mode(), PDL=on, num_warps=_warps(nb),
        )
    return deq, x

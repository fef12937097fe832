"""Emulated NVFP4 GEMM on BF16 tensor cores: ``Y = (QS_a @ QS_bᵀ) * amax_a[m] * amax_b[n] * fl(1/2688²)``.

Report §2.2/§5.1; notes §1.4 (TE reference GEMM, cuBLAS ``alpha``) and §2 (row-scaled GEMM: TE runs the
per-tensor GEMM with unit amaxes, then multiplies by ``row_amax[:, None] * w_amax``). ``QS = e2m1 * s_b``
is exact in BF16 (an E2M1 value has 2 significant bits, an E4M3 scale 4), so a BF16 x BF16 -> FP32 MMA
on ``QS`` operands computes ``Σ_k q_a s_a q_b s_b`` with only FP32 accumulation error; the FP32 outer scales
(a scalar per tensor, a vector per token) are applied in the epilogue.

Worked example: a = b = ones(1, 16), per tensor: amax = 1, S_enc = 2688, s_b = 448, q = 6 (code 7)
-> qs = 2688; acc = 16 * 2688² ; Y = acc * 1 * 1 / 2688² = 16.

Two implementations (``impl``; the backend picks ``cublas`` for ``MINITE_TRITON_GEMM=exact`` and
``triton`` for ``exact_fused``):
  - ``triton``: one Triton kernel, FP32 accumulate, scales fused in the epilogue, output in ``out_dtype``;
  - ``cublas``: ``torch.mm`` on the BF16 ``QS`` operands (cuBLAS, BF16 output), then one fused Triton
    epilogue pass applying the scales (one extra BF16 rounding, within the GEMM tolerance).
On the H200 (Qwen3-4B shapes, 4096 tokens) cuBLAS + epilogue was 0-25% faster than the Triton kernel.
Tolerance against the FP32 reference GEMM (``formats`` dequantize, FP64 matmul), BF16 output: elementwise
``|Y - Y_ref| <= 2e-2 * |Y_ref| + 2e-3 * max|Y_ref|`` and relative L2 error <= 5e-3; FP32 output of the
Triton kernel: relative L2 error <= 1e-5.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_kernels.options import resolve_kernels

from ._common import INV_2688_SQ, interpret_mode

INV_2688_SQ_C = tl.constexpr(INV_2688_SQ)


@triton.jit
def _scaled_mm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    M_BUCKET,  # only the autotuning key (``m_bucket``): unused in the body
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    SA_VEC: tl.constexpr,
    SB_VEC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_F32: tl.constexpr = False,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    a_ptrs = a_ptr + am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + bn[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        if DOT_F32:  # Triton's CPU interpreter mis-handles bf16 dots: use (exact) fp32 operands there
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SA_VEC:
        sa = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    else:
        sa = tl.load(sa_ptr)
    if SB_VEC:
        sb = tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr)
    c = (acc * INV_2688_SQ_C) * (sa * sb)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=4),
]
#: the autotuning key. M is bucketed: a learner's M is rows x padded length, new almost every step, and an
#: exact-M key re-benchmarks all configurations for each new M (seconds per GEMM shape, far more on a shared GPU)
AUTOTUNE_KEY = ["M_BUCKET", "N", "K", "SA_VEC", "SB_VEC"]
#: decode-sized GEMMs (M <= SMALL_M rows) take one fixed configuration instead of the autotuner: each new batch
#: bucket of a sampler would otherwise benchmark every configuration for every linear shape, which is where an
#: fp32 model's slow CUDA-graph captures went when several runs shared the GPU (benchmarks/learning/README.md).
#: One M tile holds all the rows; 64-wide N tiles give a small-N linear several programs.
SMALL_M = 64
SMALL_M_META = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}


def m_bucket(m: int) -> int:
    """The autotuning bucket of M: the next power of two, at least 16 (so 1-16, 17-32, 33-64, ... share one)."""
    return max(16, 1 << (max(m, 1) - 1).bit_length())


def fixed_meta(m: int) -> dict | None:
    """The launch configuration of an M-row fused GEMM when it is not autotuned (None: the autotuner picks)."""
    if interpret_mode():  # Triton's CPU interpreter: small tiles, and fp32 dots (it mis-handles bf16 ones)
        return {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "DOT_F32": True}
    return dict(SMALL_M_META) if m <= SMALL_M else None


_scaled_mm_tuned = (
    _scaled_mm_kernel
    if interpret_mode()
    # cache_results: the choice per key is kept in Triton's cache directory, so the other processes of a
    # machine (parallel runs, a resumed run) reuse it instead of benchmarking again
    else triton.autotune(configs=_CONFIGS, key=AUTOTUNE_KEY, cache_results=True)(_scaled_mm_kernel)
)


@triton.jit
def _scale_epilogue_kernel(
    c_ptr,
    out_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    SA_VEC: tl.constexpr,
    SB_VEC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c = tl.load(c_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    if SA_VEC:
        sa = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    else:
        sa = tl.load(sa_ptr)
    if SB_VEC:
        sb = tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr)
    out = (c * INV_2688_SQ_C) * (sa * sb)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def gemm_impl() -> str:
    """``triton`` where the process-wide GEMM formulation is ``exact_fused``, else ``cublas`` (the backend passes
    ``impl`` from its plan's choice; this default is for direct calls)."""
    return "triton" if resolve_kernels().gemm == "exact_fused" else "cublas"


def scaled_mm_nt(
    qa: torch.Tensor,
    qb: torch.Tensor,
    amax_a: torch.Tensor,
    amax_b: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    impl: str | None = None,
) -> torch.Tensor:
    """``(qa @ qbᵀ) * amax_a[:, None] * amax_b[None, :] / 2688²`` with FP32 accumulation.

    ``qa`` [M, K] and ``qb`` [N, K]: BF16 ``e2m1 * s_b`` operands; ``amax_a``: fp32 [1] or [M];
    ``amax_b``: fp32 [1] or [N].
    """
    m, k = qa.shape
    n = qb.shape[0]
    impl = impl or gemm_impl()
    sa_vec = amax_a.numel() != 1
    sb_vec = amax_b.numel() != 1
    out = torch.empty((m, n), dtype=out_dtype, device=qa.device)
    if m == 0 or n == 0:
        return out
    if impl == "cublas" and not interpret_mode():
        c = torch.mm(qa, qb.t())
        bm, bn = 32, 128
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
        _scale_epilogue_kernel[grid](
            c, out, amax_a, amax_b, m, n, SA_VEC=sa_vec, SB_VEC=sb_vec, BLOCK_M=bm, BLOCK_N=bn, num_warps=4
        )
        return out
    meta = fixed_meta(m)
    kernel = _scaled_mm_tuned if meta is None else _scaled_mm_kernel
    meta = meta or {}

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    kernel[grid](
        qa,
        qb,
        out,
        amax_a,
        amax_b,
        m,
        n,
        k,
        m_bucket(m),
        qa.stride(0),
        qa.stride(1),
        qb.stride(0),
        qb.stride(1),
        out.stride(0),
        out.stride(1),
        SA_VEC=sa_vec,
        SB_VEC=sb_vec,
        **meta,
    )
    return out

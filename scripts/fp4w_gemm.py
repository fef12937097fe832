"""A packed-weight GEMM for the decode step: ``Y = X̂ Ŵᵀ`` for a few dozen BF16 activation rows, reading the NVFP4
weight as its packed bytes (4.5 bits per value) and forming the BF16 dequantized weight Ŵ in registers. It is kept
out of the library because on the H200 it is slower than ``torch.mm(X̂, Ŵᵀ)`` on the BF16 Ŵ at decode sizes, and
its timing floor (``decode=False``: the same loads and MMAs without the decode arithmetic) is no faster than cuBLAS
(``scripts/bench_fp4w_gemm.py``; the numbers are in benchmarks/RESULTS.md, 2026-12-04).
``tests/minite_kernels/test_fp4w_gemm.py`` loads it by path and checks it against the reference.

For weight row n (an output column) and K block j of 16 values, with ``d`` the per-block decode factor of
``nvfp4_jit._decode_factor`` (TE's order) and ``a[n]`` the amax of the tensor row n belongs to (a packed group of
several linears has one per row)::

    Ŵ[n, k] = bf16( ±e2m1(code[n, k]) * d(e4m3(s[n, j]), a[n]) )     k in block j      (as ``dequantize_nvfp4``)
    Y[m, n] = bf16( Σ_k X̂[m, k] Ŵ[n, k] )                            (fp32 accumulation, tensor cores)
    Y[m, n] = bf16( Y[m, n] + b[n] )                                    with a bias (PyTorch's two roundings)

Every Ŵ element is the one the BF16 dequantizer writes, bit for bit; only the order of the fp32 accumulation
differs from ``torch.mm(X̂, Ŵᵀ)``. The two nibbles of a byte are decoded apart (the tile's even and odd
columns, against the matching columns of X̂: two MMAs per K tile), and a nibble becomes ``±e2m1 * 2^-14`` by
reading its bits as an fp16 (``_e2m1_scaled_down``).

Split-K (``split > 1``): each of the split programs of an output tile stores its fp32 partial, and the last to
arrive (an atomic counter per tile, acquire-release, reset by that program) sums them in split order, so the
result does not depend on which program finished last.

Worked example: one row X̂ = [1, 0, ..., 0] (K = 32) against a weight row of codes [7, 0, ...] (value 6), scale
byte 0x38 (1.0) and amax 2688: d = fp32(1.0 * 2688) * fl(1/2688) = 1, Ŵ[n, 0] = 6, Y = 6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minite_kernels.backends.triton._common import interpret_mode
from minite_kernels.backends.triton.decode import _workspace
from minite_kernels.backends.triton.norm_quant import _round
from minite_kernels.backends.triton.nvfp4_jit import _decode_factor, _e4m3_decode
from minite_kernels.backends.triton.quantize import _num_sms

#: the most activation rows one program holds (one M tile); more rows take several M tiles
MAX_BLOCK_M = 64


@triton.jit
def _e2m1_scaled_down(c):
    """±e2m1(c) * 2^-14 (exact) for int32 codes ``c`` (bit 3 the sign): the three magnitude bits placed at fp16
    bits 9..11 read as an fp16 whose exponent field is the E2M1 exponent (code 1 becomes the subnormal 2^-15),
    then widened to fp32."""
    h = ((c & 7) << 9) | ((c & 8) << 12)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _w_halves(codes_ptr, scales_ptr, amax_w, offs_n, nmask, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              DECODE: tl.constexpr):  # fmt: skip
    """(Ŵ at the even, Ŵ at the odd columns of the tile), each [BLOCK_N, BLOCK_K // 2] in fp32 (rounded to BF16
    by the caller). Without ``DECODE``: the raw nibbles as values (the timing floor, not Ŵ)."""
    hc = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    b = tl.load(codes_ptr + offs_n[:, None] * (K // 2) + hc[None, :], mask=nmask[:, None], other=0).to(tl.int32)
    if not DECODE:
        return (b & 15).to(tl.float32), (b >> 4).to(tl.float32)
    bc = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    sb = tl.load(scales_ptr + offs_n[:, None] * (K // 16) + bc[None, :], mask=nmask[:, None], other=0)
    f = _decode_factor(_e4m3_decode(sb.to(tl.int32)), amax_w[:, None])[:, :, None]  # [BN, BK // 16, 1]
    lo = tl.reshape(_e2m1_scaled_down(b & 15) * 16384.0, [BLOCK_N, BLOCK_K // 16, 8]) * f
    hi = tl.reshape(_e2m1_scaled_down(b >> 4) * 16384.0, [BLOCK_N, BLOCK_K // 16, 8]) * f
    return tl.reshape(lo, [BLOCK_N, BLOCK_K // 2]), tl.reshape(hi, [BLOCK_N, BLOCK_K // 2])


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, nmask, HAS_BIAS: tl.constexpr, RNE_INT: tl.constexpr):
    """bf16(acc), then bf16(that + b) with a bias: as ``torch.mm`` then ``+ b`` round (values as fp32)."""
    y = _round(acc, RNE_INT)
    if HAS_BIAS:
        y = _round(y + tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :], RNE_INT)
    return y


@triton.jit
def _fp4w_gemm_kernel(x_ptr, codes_ptr, scales_ptr, wamax_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
                      K_PER_SPLIT, stride_xm, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr,
                      INTERP: tl.constexpr):  # fmt: skip
    """Grid (N tiles, SPLIT, M tiles). ``x`` BF16 [M, K] (row stride ``stride_xm``), ``codes`` u8 [N, K/2],
    ``scales`` E4M3 bytes [N, K/16], ``wamax`` fp32 [N], ``y`` BF16 [M, N]; K_PER_SPLIT a multiple of
    BLOCK_K. Under the interpreter (``INTERP``: it truncates fp32 -> BF16 casts and mis-handles BF16 dots) Ŵ
    is rounded on its bits and the dots run on the (exact) fp32 values."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    amax_w = tl.load(wamax_ptr + offs_n, mask=nmask, other=0.0)
    offs_k = tl.arange(0, BLOCK_K)
    k_start = pid_k * K_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=mmask[:, None], other=0.0)
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_K // 2, 2]))
        w_even, w_odd = _w_halves(codes_ptr, scales_ptr, amax_w, offs_n, nmask, k0, K, BLOCK_N, BLOCK_K, DECODE)
        if INTERP:
            acc = tl.dot(x_even.to(tl.float32), tl.trans(_round(w_even, True)), acc)
            acc = tl.dot(x_odd.to(tl.float32), tl.trans(_round(w_odd, True)), acc)
        else:
            acc = tl.dot(x_even, tl.trans(w_even.to(tl.bfloat16)), acc)
            acc = tl.dot(x_odd, tl.trans(w_odd.to(tl.bfloat16)), acc)
    omask = mmask[:, None] & nmask[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    if SPLIT == 1:
        tl.store(y_ptrs, _epilogue(acc, bias_ptr, offs_n, nmask, HAS_BIAS, INTERP).to(tl.bfloat16), mask=omask)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        p_ptrs = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(p_ptrs + pid_k * M * N, acc, mask=omask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tot = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                tot += tl.load(p_ptrs + s * M * N, mask=omask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, _epilogue(tot, bias_ptr, offs_n, nmask, HAS_BIAS, INTERP).to(tl.bfloat16), mask=omask)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@dataclass
class PackedFP4:
    """A weight [N, K] as the kernel reads it: ``codes`` u8 [N, K/2] (element 2i in the low nibble of byte i),
    ``scales`` E4M3 bytes (u8) [N, K/16], ``amax`` fp32 [N] (each row's tensor amax)."""

    codes: torch.Tensor
    scales: torch.Tensor
    amax: torch.Tensor

    @classmethod
    def empty(cls, n: int, k: int, device) -> PackedFP4:
        return cls(
            torch.zeros((n, k // 2), dtype=torch.uint8, device=device),
            torch.zeros((n, k // 16), dtype=torch.uint8, device=device),
            torch.zeros((n,), dtype=torch.float32, device=device),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 2

    def copy_rows_(self, row: int, data: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor) -> int:
        """Write one quantized weight (``NVFP4Tensor`` fields: data [n, K/2], scales [n, K/16], amax [1] or
        [n]) into rows ``row:row + n`` (same addresses every time); returns ``row + n``."""
        n = data.shape[0]
        self.codes[row:row + n].copy_(data)
        self.scales[row:row + n].copy_(scales.view(torch.uint8))
        self.amax[row:row + n].copy_(amax.reshape(-1).expand(n) if amax.numel() == 1 else amax.reshape(-1))
        return row + n


def _split(device: torch.device, programs: int, k_tiles: int) -> int:
    """Powers of two dividing the K tiles, while the programs would not fill the SMs and each split keeps at
    least two K tiles."""
    target = _num_sms(device)
    split = 1
    while programs * split < target and k_tiles % (split * 2) == 0 and k_tiles // (split * 2) >= 2:
        split *= 2
    return split


def fp4w_linear(x_hat: torch.Tensor, w: PackedFP4, bias: torch.Tensor | None = None, *, block_m: int | None = None,
                block_n: int = 32, block_k: int | None = None, split: int | None = None, num_warps: int = 4,
                stages: int = 3, decode: bool = True) -> torch.Tensor:  # fmt: skip
    """``bf16(X̂ Ŵᵀ)`` (then ``bf16(· + b)`` with ``bias``) for BF16 ``x_hat`` [M, K] (unit stride along K,
    K % 32 == 0) against the packed weight ``w`` [N, K]. ``split`` (split-K, a power of two; default: enough to
    fill the SMs) and the tile sizes do not change Ŵ, and split-K sums its partials in a fixed order.
    ``decode=False`` times the same structure without the decode arithmetic (not Ŵ: the result is garbage)."""
    n, k = w.shape
    if x_hat.dim() != 2 or x_hat.dtype != torch.bfloat16 or x_hat.shape[1] != k or x_hat.stride(1) != 1:
        raise ValueError(
            f"fp4w_linear takes BF16 x_hat [M, {k}] with unit stride along K; got {x_hat.dtype} "
            f"{tuple(x_hat.shape)} stride {tuple(x_hat.stride())}"
        )
    if k % 32:
        raise ValueError(f"fp4w_linear needs K % 32 == 0; got K={k}")
    m = x_hat.shape[0]
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x_hat.device)
    if m == 0 or n == 0:
        return y
    bm = block_m or min(MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))
    bk = block_k or next(b for b in (128, 64, 32) if k % b == 0)
    if k % bk or bk % 32:
        raise ValueError(f"fp4w_linear: block_k={bk} must be a multiple of 32 dividing K={k}")
    n_tiles, m_tiles = triton.cdiv(n, block_n), triton.cdiv(m, bm)
    s = split or _split(x_hat.device, n_tiles * m_tiles, k // bk)
    if s & (s - 1) or k % (s * bk):
        raise ValueError(f"fp4w_linear: split={s} must be a power of two with K={k} a multiple of split * {bk}")
    part, cnt = _workspace(x_hat.device, s, m, n, n_tiles * m_tiles) if s > 1 else (y, y)
    _fp4w_gemm_kernel[(n_tiles, s, m_tiles)](
        x_hat, w.codes, w.scales, w.amax, bias if bias is not None else y, y, part, cnt, m, n, k, k // s,
        x_hat.stride(0), HAS_BIAS=bias is not None, SPLIT=s, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=bk,
        DECODE=decode, INTERP=interpret_mode(), num_warps=num_warps, num_stages=stages,
    )
    return y

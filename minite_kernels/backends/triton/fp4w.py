"""FP4-weight GEMM for the sampler's decode step: ``Y = X̂ (Q_w)ᵀ · g_w (+ b)`` reading the NVFP4 weight as its
packed E2M1 codes and E4M3 block scales (4.5 bits per value) and decoding them in registers on Hopper, where
there are no FP4 tensor cores. At decode batch sizes (tens of rows) and the model sizes people train, a
projection is bound by the bytes of its weight, so reading 4.5 bits per value instead of 16 is what can make an
NVFP4 rollout faster than a BF16 one (how close this kernel gets: ``benchmarks/RESULTS.md``).

For weight row n and K block j of 16 values, with ``q`` the E2M1 value of a code, ``s`` the E4M3 block scale,
``a[n]`` the amax of the weight tensor row n belongs to (a packed q/k/v group keeps one per linear)::

    QS[n, k] = q[n, k] * s[n, j]                 exact in BF16 (2 significant bits times 4)
    g[n]     = fp32(a[n] * fl(1/2688))           the per-tensor decode factor, 2688 = 6 * 448
    Y[m, n]  = bf16( fp32( Σ_k X̂[m, k] QS[n, k] ) * g[n] )        fp32 accumulation on BF16 tensor cores
    Y[m, n]  = bf16( Y[m, n] + b[n] )                               with a bias (PyTorch's two roundings)

``X̂`` is the learner's per-token activation, quantized exactly as the dequantized-weight path quantizes it
(``deq(Q_token(x))`` in BF16). Every product ``X̂ · QS`` is exact in fp32 (8 significant bits times 5), so the
weight side is TE's exact semantics (``QS``, with the per-tensor factor in the epilogue), and the result
differs from the learner's
dequantized-weight GEMM ``X̂ Ŵᵀ`` (Ŵ = bf16(q · fp32(s · a · fl(1/2688)))) by Ŵ's per-element BF16 rounding and
the output roundings: ``|ΔY| <= 2^-8 Σ_k |X̂ Ŵ| + 2^-7 |Y|`` (a relative L2 difference of about 3e-3 on random
data). The tests check that bound, and bit-equality with the pure-PyTorch reference
:func:`fp4w_linear_reference` wherever one term is summed.

The program is swap-AB: weight rows are the MMA's M dimension (64-128 per program), activation rows its N
dimension, and split-K fills the SMs for short N. The codes and scales reach shared memory by asynchronous copies
that Triton pipelines over the K loop; each thread then reads its codes in the MMA's register layout, upcasts them
(a nibble's bits placed into a 16-bit float, times the block scale: :data:`UPCASTS`) and feeds the register
operand of the Hopper MMA (``wgmma`` with A from registers), so the weight crosses HBM packed and never exists
in BF16 in memory. For the upcast to land in that layout without shuffles, the codes are stored chunked
(:func:`chunk_codes`): within each 64 values of a row, byte j holds value j in its low nibble and value 32 + j in
its high nibble, so the low nibbles of a step form one MMA operand and the high nibbles another, each against
its own rows of X̂ᵀ. ``tl.dot_scaled`` would do the upcast itself, but Triton 3.6 lowers it on Hopper only for
E8M0 (MX) scales. Split-K partials are summed by the last program to arrive, in split order, so results do
not depend on scheduling. The same program runs under Triton's CPU interpreter (with fp32 dots on the exact
values), where the tests check it against the reference bit for bit.

Worked example: one row X̂ = [1, 0, ..., 0] (K = 64) against a weight row of codes [7, 0, ...] (q = 6), scale
byte 0x38 (s = 1) and amax 2688: QS[n, 0] = 6, g = fp32(2688 * fl(1/2688)) = 1, Y = 6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minite_kernels.backends.triton._common import INV_2688, interpret_mode
from minite_kernels.backends.triton.decode import _workspace
from minite_kernels.backends.triton.norm_quant import _round
from minite_kernels.backends.triton.quantize import _num_sms

#: the most activation rows one program holds; more rows take several M tiles
MAX_BLOCK_M = 128


#: values per chunk of the codes' layout (:func:`chunk_codes`); K and every BLOCK_K are multiples of it
CHUNK = 64


def chunk_codes(data: torch.Tensor) -> torch.Tensor:
    """NVFP4 bytes u8 [N, K/2] (value 2i in the low nibble of byte i) in the kernel's chunked layout: within each
    64 values, byte j holds value j (low nibble) and value 32 + j (high nibble). Pure bit operations on the
    bytes, on their device. Example: the first chunk's bytes 0 and 16, [v1 v0] and [v33 v32], become bytes 0
    and 1: [v32 v0] and [v33 v1]."""
    n, kh = data.shape
    a, b = data.view(n, kh // 32, 32).split(16, dim=-1)  # values 0..31 and 32..63 of each chunk
    even = (a & 15) | ((b & 15) << 4)  # new byte 2i: value 2i and 32 + 2i
    odd = (a >> 4) | (b & 0xF0)  # new byte 2i + 1: value 2i + 1 and 33 + 2i
    return torch.stack((even, odd), dim=-1).view(n, kh)


def chunk_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [N, K/16] in the kernel's order: per row, the scales of every chunk's first 32 values (its
    blocks 0 and 1), then those of every chunk's last 32 (blocks 2 and 3), so that a K step's low-nibble scales
    and its high-nibble scales are each contiguous."""
    n, kb = scales.shape
    return scales.view(n, kb // 4, 2, 2).transpose(1, 2).reshape(n, kb)


def unchunk_scales(scales: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`chunk_scales`."""
    n, kb = scales.shape
    return scales.view(n, 2, kb // 4, 2).transpose(1, 2).reshape(n, kb)


def unchunk_codes(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`chunk_codes`."""
    n, kh = codes.shape
    c = codes.view(n, kh // 32, 16, 2)
    even, odd = c[..., 0], c[..., 1]
    a = (even & 15) | ((odd & 15) << 4)
    b = (even >> 4) | (odd & 0xF0)
    return torch.cat((a, b), dim=-1).view(n, kh)


@dataclass(frozen=True)
class FP4WConfig:
    """One launch configuration: weight rows per program (``block_n``), K per step (``block_k``, a multiple of
    :data:`CHUNK`), split-K (``split``; None: enough to fill the SMs), warps, pipeline stages, and the upcast's
    arithmetic (``upcast``, one of :data:`UPCASTS`; the same values)."""

    block_n: int = 128
    block_k: int = 128
    split: int | None = None
    num_warps: int = 4
    num_stages: int = 4
    upcast: str = "f32"


#: measured configurations, ``(N, K) -> {M bucket: config, or None where cuBLAS on the BF16 Ŵ was faster}``.
#: ``scripts/bench_fp4w.py --write-table`` rewrites this block from a sweep on the GPU; shapes missing here follow
#: what the sweeps found for every shape so far (:func:`table_config`).
# fmt: off
# BEGIN TABLE
TABLE: dict[tuple[int, int], dict[int, FP4WConfig | None]] = {
    (1024, 2048): {16: None, 64: None, 128: None},
    (1024, 3072): {16: FP4WConfig(block_n=64, block_k=128, split=8, num_warps=4, num_stages=4, upcast='f32'), 64: None, 128: None},
    (2560, 4096): {16: FP4WConfig(block_n=64, block_k=256, split=8, num_warps=4, num_stages=4, upcast='f32'), 64: None, 128: None},
    (2560, 9728): {16: None, 64: None, 128: None},
    (4096, 1024): {16: None, 64: None, 128: None},
    (4096, 4096): {16: FP4WConfig(block_n=64, block_k=256, split=4, num_warps=4, num_stages=4, upcast='f32'), 64: None, 128: None},
    (4096, 12288): {16: FP4WConfig(block_n=128, block_k=128, split=8, num_warps=4, num_stages=3, upcast='f32'), 64: None, 128: None},
    (6144, 1024): {16: None, 64: None, 128: None},
    (6144, 2560): {16: None, 64: None, 128: None},
    (6144, 4096): {16: FP4WConfig(block_n=64, block_k=256, split=4, num_warps=4, num_stages=4, upcast='f32'), 64: None, 128: None},
    (19456, 2560): {16: FP4WConfig(block_n=64, block_k=256, split=2, num_warps=4, num_stages=4, upcast='f32'), 64: None, 128: None},
    (24576, 4096): {16: FP4WConfig(block_n=64, block_k=256, split=1, num_warps=4, num_stages=4, upcast='f32'), 64: None, 128: None},
}
# END TABLE
# fmt: on

DEFAULT_CONFIG = FP4WConfig()

#: the activation-row buckets of the table (a row count takes the smallest bucket that holds it)
M_BUCKETS = (8, 16, 32, 64, 128, 256)
#: the most rows at which a shape missing from the table takes the FP4 kernel: no measured shape was faster at
#: 64 rows, and 8 of 12 were at 16
UNMEASURED_MAX_ROWS = 16


def m_bucket(m: int) -> int:
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


def table_config(n: int, k: int, m: int) -> FP4WConfig | None:
    """The measured configuration for a [N, K] weight at ``m`` rows: a config, or None where the measurement
    found cuBLAS on the BF16 Ŵ faster. A bucket not measured takes the nearest measured one below it (else the
    smallest); a shape not measured takes :data:`DEFAULT_CONFIG` up to :data:`UNMEASURED_MAX_ROWS` rows and
    None above, as the measured shapes did."""
    row = TABLE.get((n, k))
    if not row:
        return DEFAULT_CONFIG if m_bucket(m) <= UNMEASURED_MAX_ROWS else None
    b = m_bucket(m)
    below = [x for x in row if x <= b]
    return row[max(below) if below else min(row)]


def prefers_fp4(n: int, k: int, rows: tuple[int, ...] = (64,)) -> bool:
    """Whether a [N, K] weight should be held packed for the decode step: the table (or the default) picks the
    FP4 kernel for any of ``rows``."""
    return any(table_config(n, k, m) is not None for m in rows)


@dataclass
class FP4Weight:
    """An NVFP4 weight [N, K] as the kernel reads it: ``codes`` u8 [N, K/2] in the chunked layout of
    :func:`chunk_codes`, ``scales`` float8_e4m3fn [N, K/16] in the order of :func:`chunk_scales`, ``gain`` fp32 [N] (``g[n] = fp32(amax · fl(1/2688))``
    of the tensor row n belongs to). Allocated once; :meth:`copy_rows_` writes in place, so graphs that read it
    stay valid when the weights change."""

    codes: torch.Tensor
    scales: torch.Tensor
    gain: torch.Tensor

    @classmethod
    def empty(cls, n: int, k: int, device) -> FP4Weight:
        if k % CHUNK:
            raise ValueError(f"FP4Weight needs K % {CHUNK} == 0; got K={k}")
        return cls(
            torch.zeros((n, k // 2), dtype=torch.uint8, device=device),
            torch.zeros((n, k // 16), dtype=torch.float8_e4m3fn, device=device),
            torch.zeros((n,), dtype=torch.float32, device=device),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 2

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.gain))

    def copy_rows_(self, row: int, data: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor) -> int:
        """Write one quantized weight (``NVFP4Tensor`` fields: data u8 [n, K/2], scales E4M3 [n, K/16], amax
        [1] per tensor or [n] per row) into rows ``row:row + n`` at the same addresses; returns ``row + n``."""
        n = data.shape[0]
        if amax.numel() not in (1, n):
            raise ValueError(f"FP4Weight takes one amax per tensor or per row ({n}); got {amax.numel()}")
        self.codes[row:row + n].copy_(chunk_codes(data))
        self.scales[row:row + n].copy_(chunk_scales(scales.view(torch.float8_e4m3fn)))
        self.gain[row:row + n].copy_((amax.reshape(-1).to(torch.float32) * INV_2688).expand(n))
        return row + n


def fp4w_linear_reference(x_hat: torch.Tensor, w: FP4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The module docstring's formula in pure PyTorch (fp64 sums of the exact products, then the fp32 gain):
    ``bf16(fp32(Σ_k X̂ QS) · g)`` (then ``bf16(· + b)``). Equal to the kernel up to the order of its fp32 sum."""
    from minite_kernels.formats.e2m1 import e2m1_decode, unpack_nibbles

    n, k = w.shape
    q = e2m1_decode(unpack_nibbles(unchunk_codes(w.codes))).to(torch.float64).view(n, k // 16, 16)
    qs = (q * unchunk_scales(w.scales).to(torch.float64).unsqueeze(-1)).view(n, k)
    acc = (x_hat.to(torch.float64) @ qs.t()).to(torch.float32)
    y = (acc * w.gain.to(torch.float32)).to(torch.bfloat16)
    return y if bias is None else (y.to(torch.float32) + bias.to(torch.float32)).to(torch.bfloat16)


#: the upcast's arithmetic (``FP4WConfig.upcast``), all giving the same sums: ``asm`` (inline PTX: four code bytes
#: to eight BF16 bit patterns in 18 integer instructions, then one BF16x2 multiply per pair), ``bf16`` (the same
#: bits from Triton integer ops on 16-bit values), ``f32`` (fp16 bits widened to fp32, fp32 multiply). ``f32`` is
#: the default: it is the one measured on a GPU so far (``benchmarks/RESULTS.md``); the other two pass the CPU
#: tests (which run the ``f32`` arithmetic) and compile for sm_90, and have not yet run on a GPU
UPCASTS = ("asm", "bf16", "f32")

#: the BF16 upcasts multiply ``q · 2^-126`` by ``s · 2^100`` (both exact), so their operand is ``QS · 2^-26`` and
#: the epilogue multiplies by 2^26 (exact: powers of two commute with the fp32 roundings)
_TWO_100 = tl.constexpr(1.2676506002282294e30)
_TWO_26 = tl.constexpr(67108864.0)
# one output register per (byte pair, nibble): the magnitude moves left by ``m`` to bits 6..8 of each half, the sign
# by ``m + 6`` to bit 15, then the BF16x2 multiply by that register's two scales
_UPCAST_PART = """shl.b32 a, {t}, {m};
shl.b32 b, {t}, {sign};
and.b32 b, b, 0x80008000;
lop3.b32 a, a, 0x01C001C0, b, 0xEA;
mul.rn.bf16x2 ${out}, a, ${scale};
"""
#: four code bytes ($4) and the block scales of their low ($5, $6) and high ($7, $8) nibbles (BF16, times
#: 2^100) to the eight BF16 operands ``QS · 2^-26``: two bytes spread to the low bytes of a register's halves
#: (prmt), a nibble's magnitude moved to bits 6..8 and its sign to bit 15 of each half (``q · 2^-126``, shl and
#: lop3), times the scales (mul.bf16x2; exact, and BF16 arithmetic keeps the subnormal input of code 1)
_UPCAST_ASM = tl.constexpr(
    "{\n.reg .b32 t0, t1, a, b;\nprmt.b32 t0, $4, 0, 0x4140;\nprmt.b32 t1, $4, 0, 0x4342;\n"
    + "".join(_UPCAST_PART.format(t=t, m=m, sign=m + 6, out=out, scale=out + 5)
              for out, (t, m) in enumerate((("t0", 6), ("t1", 6), ("t0", 2), ("t1", 2))))
    + "}"
)



@triton.jit
def _nibble_f32(n):
    """±e2m1(n) · 2^-14 (exact) in fp32 for int32 nibbles ``n`` (bit 3 the sign): the three magnitude bits placed
    at fp16 bits 9..11 read as an fp16 whose exponent field is the E2M1 exponent (code 1 becomes the subnormal
    2^-15)."""
    h = ((n & 7) << 9) | ((n & 8) << 12)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble_bf16(n):
    """±e2m1(n) · 2^-126 (exact) in BF16 for int16 nibbles ``n``: the magnitude bits placed at BF16 bits 6..8
    (code 1 becomes the subnormal 2^-127)."""
    h = ((n & 7) << 6) | ((n & 8) << 12)
    return h.to(tl.bfloat16, bitcast=True)


@triton.jit
def _scaled(q, s, BLOCK_N: tl.constexpr, HALF: tl.constexpr):
    """``q`` [BLOCK_N, HALF] times the block scales ``s`` [BLOCK_N, HALF // 16], each scale on its 16 values."""
    return tl.reshape(tl.reshape(q, [BLOCK_N, HALF // 16, 16]) * s[:, :, None], [BLOCK_N, HALF])


@triton.jit
def _upcast(c, s_ptrs, s_half, BLOCK_N: tl.constexpr, HALF: tl.constexpr, UPCAST: tl.constexpr):
    """(QS of the low nibbles, QS of the high nibbles), each [BLOCK_N, HALF] in BF16 (exact), from the code
    bytes ``c`` u8 [BLOCK_N, HALF] and the scales at ``s_ptrs`` (low) and ``s_ptrs + s_half`` (high).

    ``bf16`` / ``asm``: ``q · 2^-126`` as BF16 bits (code 1 the subnormal 2^-127) times ``s · 2^100`` in BF16,
    which is ``QS · 2^-26`` exactly (BF16 arithmetic keeps subnormal inputs, and the product is a normal number
    of at most 5 significant bits); ``f32``: ``q · 2^-14`` from fp16 bits, widened, times ``s · 2^14`` in fp32,
    rounded to BF16 (exact), which is ``QS``."""
    if UPCAST == "f32":
        ci = c.to(tl.int32)
        f_lo = tl.load(s_ptrs).to(tl.float32) * 16384.0
        f_hi = tl.load(s_ptrs + s_half).to(tl.float32) * 16384.0
        w_lo = _scaled(_nibble_f32(ci), f_lo, BLOCK_N, HALF).to(tl.bfloat16)
        w_hi = _scaled(_nibble_f32(ci >> 4), f_hi, BLOCK_N, HALF).to(tl.bfloat16)
    elif UPCAST == "asm":
        b_lo = tl.broadcast_to((tl.load(s_ptrs).to(tl.bfloat16) * _TWO_100)[:, :, None], [BLOCK_N, HALF // 16, 16])
        b_hi = tl.broadcast_to((tl.load(s_ptrs + s_half).to(tl.bfloat16) * _TWO_100)[:, :, None],
                               [BLOCK_N, HALF // 16, 16])
        w_lo, w_hi = tl.inline_asm_elementwise(
            _UPCAST_ASM, "=r,=r,=r,=r,r,r,r,r,r",
            [c, tl.reshape(b_lo, [BLOCK_N, HALF]), tl.reshape(b_hi, [BLOCK_N, HALF])],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        c16 = c.to(tl.int16)
        b_lo = tl.load(s_ptrs).to(tl.bfloat16) * _TWO_100
        b_hi = tl.load(s_ptrs + s_half).to(tl.bfloat16) * _TWO_100
        w_lo = _scaled(_nibble_bf16(c16), b_lo, BLOCK_N, HALF)
        w_hi = _scaled(_nibble_bf16((c16 >> 4) & 15), b_hi, BLOCK_N, HALF)
    return w_lo, w_hi


@triton.jit
def _fp4w_kernel(x_ptr, codes_ptr, scales_ptr, gain_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
                 K_PER_SPLIT, stride_xm, stride_c, stride_s, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 INTERP: tl.constexpr, UPCAST: tl.constexpr = "f32"):  # fmt: skip
    """Grid (N tiles, SPLIT, M tiles). ``x`` BF16 [M, K] (row stride ``stride_xm``), ``codes`` u8 [N, K/2] in the
    chunked layout of :func:`chunk_codes`, ``scales`` E4M3 [N, K/16] in the order of :func:`chunk_scales`,
    ``gain`` fp32 [N], ``y`` BF16 [M, N].

    A K step of BLOCK_K values loads BLOCK_K/2 code bytes per weight row: their low nibbles are the first half of
    each 64-value chunk (K offsets 64u + j, j < 32), their high nibbles the second half (64u + 32 + j). Each half
    is one MMA against the matching rows of X̂ᵀ, so the upcast needs no interleaving, and Triton keeps it in the
    MMA's register layout (the codes and scales go through shared memory by asynchronous copies, pipelined).
    The accumulator is [BLOCK_N, BLOCK_M]: weight rows first, the upcast weight is the MMA's register operand.
    Rows past M or N are clamped to row 0 for the loads (no masks in the K loop) and left out of the stores."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    HALF: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = offs_n < N
    mmask = offs_m < M
    rows_n = tl.where(nmask, offs_n, 0)
    rows_m = tl.where(mmask, offs_m, 0)
    k_start = pid_k * K_PER_SPLIT
    j = tl.arange(0, HALF)
    k_lo = (j // 32) * 64 + j % 32  # K offsets of the low nibbles within a step
    # offsets are multiples of a step's extent (K_PER_SPLIT and K are multiples of BLOCK_K): said explicitly, so
    # that the loads are aligned and Triton pipelines them as asynchronous copies
    c_ptrs = codes_ptr + rows_n[:, None] * stride_c + (tl.multiple_of(k_start // 2, HALF) + j)[None, :]
    # the low nibbles' block scales, then (K/32 further on) the high nibbles'
    s0 = tl.multiple_of(k_start // 32, HALF // 16)
    s_half = tl.multiple_of(K // 32, HALF // 16)
    s_ptrs = scales_ptr + rows_n[:, None] * stride_s + (s0 + tl.arange(0, HALF // 16))[None, :]
    x_ptrs = x_ptr + rows_m[None, :] * stride_xm + (k_start + k_lo)[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for _ in range(0, K_PER_SPLIT, BLOCK_K):
        c = tl.load(c_ptrs)
        x_lo = tl.load(x_ptrs)
        x_hi = tl.load(x_ptrs + 32)
        # the interpreter has neither inline PTX nor BF16 arithmetic: the fp32 upcast there
        w_lo, w_hi = _upcast(c, s_ptrs, s_half, BLOCK_N, HALF, "f32" if INTERP else UPCAST)
        if INTERP:  # the interpreter's BF16 dots are not fp32-accumulated: the (exact) fp32 values instead
            acc = tl.dot(w_lo.to(tl.float32), x_lo.to(tl.float32), acc)
            acc = tl.dot(w_hi.to(tl.float32), x_hi.to(tl.float32), acc)
        else:
            acc = tl.dot(w_lo, x_lo, acc)
            acc = tl.dot(w_hi, x_hi, acc)
        c_ptrs += HALF
        s_ptrs += HALF // 16
        x_ptrs += BLOCK_K
    omask = nmask[:, None] & mmask[None, :]
    y_ptrs = y_ptr + offs_m[None, :] * N + offs_n[:, None]
    gain = tl.load(gain_ptr + rows_n)[:, None]
    if UPCAST != "f32" and not INTERP:
        gain = gain * _TWO_26
    if SPLIT > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        p_ptrs = part_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(p_ptrs + pid_k * M * N, acc, mask=omask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tot = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for sk in tl.static_range(SPLIT):
                tot += tl.load(p_ptrs + sk * M * N, mask=omask, other=0.0, cache_modifier=".cg")
            y = _round(tot * gain, INTERP)
            if HAS_BIAS:
                y = _round(y + tl.load(bias_ptr + rows_n).to(tl.float32)[:, None], INTERP)
            tl.store(y_ptrs, y.to(tl.bfloat16), mask=omask)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        y = _round(acc * gain, INTERP)
        if HAS_BIAS:
            y = _round(y + tl.load(bias_ptr + rows_n).to(tl.float32)[:, None], INTERP)
        tl.store(y_ptrs, y.to(tl.bfloat16), mask=omask)


def _auto_split(device: torch.device, programs: int, k: int, bk: int, waves: int = 1) -> int:
    """Powers of two dividing K's tiles while the programs would not fill ``waves`` times the SMs and each split
    keeps at least two K tiles."""
    target = waves * _num_sms(device)
    tiles = k // bk
    split = 1
    while programs * split < target and tiles % (split * 2) == 0 and tiles // (split * 2) >= 2:
        split *= 2
    return split


def fp4w_linear(x_hat: torch.Tensor, w: FP4Weight, bias: torch.Tensor | None = None,
                config: FP4WConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``Y = bf16(fp32(X̂ QSᵀ) · g)`` (then ``bf16(· + b)``) for BF16 ``x_hat`` [M, K] (unit stride along K)
    against the packed weight ``w`` [N, K]; ``config`` (default: the table's for this shape) changes only the
    order of the fp32 sum. ``out``: a BF16 [M, N] tensor to write into."""
    n, k = w.shape
    if x_hat.dim() != 2 or x_hat.dtype != torch.bfloat16 or x_hat.shape[1] != k or x_hat.stride(1) != 1:
        raise ValueError(
            f"fp4w_linear takes BF16 x_hat [M, {k}] with unit stride along K; got {x_hat.dtype} "
            f"{tuple(x_hat.shape)} stride {tuple(x_hat.stride())}"
        )
    m = x_hat.shape[0]
    cfg = config or table_config(n, k, m) or DEFAULT_CONFIG
    bk, bn = cfg.block_k, cfg.block_n
    if bk % CHUNK:
        raise ValueError(f"fp4w_linear: block_k={bk} must be a multiple of {CHUNK}")
    if k % bk:  # the largest step that divides K
        bk = next((b for b in (256, 128, 64) if b <= cfg.block_k and k % b == 0), 0)
        if not bk:
            raise ValueError(f"fp4w_linear needs K % {CHUNK} == 0; got K={k}")
    y = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=x_hat.device)
    if m == 0 or n == 0:
        return y
    bm = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))
    n_tiles, m_tiles = triton.cdiv(n, bn), triton.cdiv(m, bm)
    s = cfg.split or _auto_split(x_hat.device, n_tiles * m_tiles, k, bk)
    if s & (s - 1) or k % (s * bk):
        raise ValueError(f"fp4w_linear: split={s} must be a power of two with K={k} a multiple of split * {bk}")
    part, cnt = _workspace(x_hat.device, s, m, n, n_tiles * m_tiles) if s > 1 else (y, y)
    _fp4w_kernel[(n_tiles, s, m_tiles)](
        x_hat, w.codes, w.scales, w.gain, bias if bias is not None else y, y, part, cnt, m, n, k, k // s,
        x_hat.stride(0), k // 2, k // 16, HAS_BIAS=bias is not None, SPLIT=s, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        INTERP=interpret_mode(), UPCAST=cfg.upcast, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y

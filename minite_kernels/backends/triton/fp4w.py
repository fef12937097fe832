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
differs from the learner's dequantized-weight GEMM ``X̂ Ŵᵀ`` (Ŵ = bf16(q · fp32(s · a · fl(1/2688)))) by Ŵ's
per-element BF16 rounding and the output roundings: ``|ΔY| <= 2^-8 Σ_k |X̂ Ŵ| + 2^-7 |Y|`` (a relative L2
difference of about 3e-3 on random data), plus ``2^-8 Σ_k |X̂ Ŵ|`` with a bias (both round the product before
adding it, which matters where the bias cancels the product). The tests check that bound, and bit-equality with
the pure-PyTorch reference :func:`fp4w_linear_reference` wherever one term is summed.

**The program.** Swap-AB: weight rows are the MMA's M dimension (64-256 per program), activation rows its N
dimension, and split-K fills the SMs for short N. Codes, scales and X̂ reach shared memory by asynchronous copies
that Triton pipelines over the K loop; each thread then reads its own 16-byte runs of codes, decodes them with a
few integer instructions (inline PTX) straight into the register fragments of the Hopper MMA (``wgmma`` with the
weight as its register operand), so the weight crosses HBM packed and never exists in BF16 in memory. The K
loop's trip count is a compile-time constant (``K_PER_SPLIT``, one compilation per K and split): with a run-time
count ptxas serializes these register-operand MMAs (its advisory C7515; the code waits after every MMA), with a
constant one they stay asynchronous, so the MMAs of one K step run while the next fragments decode. The other
operand order (``FP4WConfig.swap_ab=False``) writes the decoded tile to shared memory once
per K step and issues that step's MMAs back to back; the table picks between them by measurement. With
programmatic dependent launch (off unless ``MINITE_TRITON_PDL`` / ``options().pdl`` says otherwise; sm_90+) the
kernel starts while the norm or SiLU kernel that writes X̂ still runs, asks the L2 for its slice of the codes and
scales (``on``; ``head``: the slice's first pipeline stages; ``bare``: nothing), and waits for X̂ only then, so its
weight bytes stream from HBM while that (issue-bound) kernel runs. It changes no
bit, but measured in the 4B rollout every form of it was slower than launching after the previous kernel, the one
that prefetches nothing too (``benchmarks/RESULTS.md``), so it stays off.

**The layout** (:func:`pack_codes`, :func:`pack_scales`; written once per weight sync) is what makes the decode
cheap. Rows go in groups of 16 and K in tiles of 64. For each (group, tile), lane ``l = 4i + t`` of a warp owns
16 consecutive bytes, four 32-bit words, and word ``s`` holds the eight values of that lane's MMA fragment at K
step s: rows ``i`` and ``i + 8`` (h = 0, 1) times columns ``16s + 2t + p`` and ``16s + 8 + 2t + p`` (e = 0, 1;
p = 0, 1). Fragment register ``r = h + 2e`` (two BF16 values, p = 0 in the low half) is decoded as::

    r = 0, 1, 2:  bits = (word << 3r) & 0x81C081C0         sign to bit 15, magnitude to bits 6..8, per half
    r = 3:        bits = ((word << 1) & 0x80008000) | ((word >> 5) & 0x01000100) | ((word >> 4) & 0x00C000C0)

which reads as the BF16 ``q · 2^-126`` (the E2M1 exponent and mantissa bits land in the low exponent bits and the
top mantissa bit; code 1 becomes the subnormal 2^-127), then one ``mul.bf16x2`` by ``s · 2^100`` gives
``QS · 2^-26`` exactly (a normal number of at most 5 significant bits; BF16 arithmetic keeps the subnormal
input), and the epilogue multiplies by 2^26. The scales are stored re-encoded as unsigned E5M3 (every E4M3 value,
subnormals included, is a normal E5M3 number: ``byte = ((x + 10) << 3) | m`` for ``2^x (1 + m/8)``, 0 for 0), so
the BF16 bits of ``s · 2^100`` are one integer multiply-add: ``byte · 16 + 0x6C80``. Blocks whose scale is 0 get
zero codes (their values are 0 either way), so the factor that byte 0 decodes to never matters. Per eight values:
11 integer instructions, 4 multiplies, 4 for the two scales.

Split-K partials are summed by the last program to arrive, in split order, so results do not depend on
scheduling. The same program runs under Triton's CPU interpreter, which has no inline PTX: there the decode is
written with Triton integer ops on the same words (:func:`_decode_emulated`) and the MMA is an fp32 dot, and the
tests check it against the reference bit for bit; the PTX itself is checked on the CPU by executing it
instruction by instruction (``tests/minite_kernels/test_fp4w.py``) and on the GPU against the reference.

Worked example: one row X̂ = [1, 0, ..., 0] (K = 64) against a weight row of codes [7, 0, ...] (q = 6), scale
1.0 and amax 2688: QS[n, 0] = 6, g = fp32(2688 * fl(1/2688)) = 1, Y = 6. Packed, value (0, 0) is fragment
register 0's low half of lane 0's word 0: sign 0, magnitude 7 at bits 6..8, so codes byte 0 is 0xC0 and byte 1
is 0x01; the scale (E4M3 0x38, x = 0) is stored as 0x50.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minite_kernels.backends.triton._common import (
    INV_2688,
    PDL_PREFETCH,
    _pdl_launch,
    interpret_mode,
    kernel_device_ok,
    pdl_mode,
)
from minite_kernels.backends.triton.decode import _workspace
from minite_kernels.backends.triton.norm_quant import _round
from minite_kernels.backends.triton.pdl_jit import _prefetch_l2, gdc_wait
from minite_kernels.backends.triton.quantize import _num_sms

#: the most activation rows one program holds; more rows take several M tiles
MAX_BLOCK_M = 128
#: rows per group and values per K tile of the packed layout: N must be a multiple of GROUP_ROWS and K of K_TILE
GROUP_ROWS = 16
K_TILE = 64


def _e2m1_bits(r: int, p: int, code: torch.Tensor) -> torch.Tensor:
    """The bits of E2M1 ``code`` (int32, 0..15) in a packed word, as fragment register ``r``'s half ``p``."""
    sign, mag, o = (code >> 3) & 1, code & 7, 16 * p
    if r < 3:
        return (sign << (15 - 3 * r + o)) | (mag << (6 - 3 * r + o))
    return (sign << (14 + o)) | ((mag >> 2) << (13 + o)) | ((mag & 3) << (10 + o))


def _e2m1_code(r: int, p: int, word: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`_e2m1_bits`."""
    o = 16 * p
    if r < 3:
        sign, mag = (word >> (15 - 3 * r + o)) & 1, (word >> (6 - 3 * r + o)) & 7
    else:
        sign = (word >> (14 + o)) & 1
        mag = (((word >> (13 + o)) & 1) << 2) | ((word >> (10 + o)) & 3)
    return (sign << 3) | mag


def _check_shape(n: int, k: int) -> None:
    if n % GROUP_ROWS or k % K_TILE:
        raise ValueError(
            f"the FP4-weight layout needs N % {GROUP_ROWS} == 0 and K % {K_TILE} == 0; got N={n}, K={k}"
        )


def pack_codes(data: torch.Tensor) -> torch.Tensor:
    """NVFP4 bytes u8 [N, K/2] (value 2i in the low nibble of byte i) in the kernel's layout, u8 [N/16, 8K] (module
    docstring): per 16-row group and 64-value tile, 32 lanes of four little-endian words. Pure integer ops on the
    bytes' device."""
    n, kh = data.shape
    k = 2 * kh
    _check_shape(n, k)
    d = data.to(torch.int32)
    q = torch.stack((d & 15, d >> 4), dim=-1).view(n // 16, 2, 8, k // 64, 4, 2, 4, 2)  # R h i T s e t p
    q = q.permute(0, 3, 2, 6, 4, 1, 5, 7)  # R T i t s | h e p
    word = torch.zeros(q.shape[:5], dtype=torch.int32, device=data.device)
    for h in range(2):
        for e in range(2):
            for p in range(2):
                word |= _e2m1_bits(h + 2 * e, p, q[..., h, e, p])
    out = torch.stack([(word >> (8 * b)) & 255 for b in range(4)], dim=-1).to(torch.uint8)
    return out.reshape(n // 16, 8 * k)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_codes`: u8 [N/16, 8K] to NVFP4 bytes u8 [N, K/2]."""
    groups, k8 = packed.shape
    k = k8 // 8
    b = packed.to(torch.int32).view(groups, k // 64, 8, 4, 4, 4)  # R T i t s byte
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    q = torch.stack(
        [_e2m1_code(h + 2 * e, p, word) for h in range(2) for e in range(2) for p in range(2)], -1
    )
    q = q.view(*word.shape, 2, 2, 2)  # R T i t s h e p
    q = q.permute(0, 5, 2, 1, 4, 6, 3, 7).reshape(groups * 16, k)  # R h i T s e t p
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def _e5m3_tables() -> tuple[list[int], list[int]]:
    """E4M3 byte (0..126, non-negative finite) to the unsigned E5M3 byte of the same value, and back."""
    fwd, inv = [0] * 127, [0] * 256
    for b in range(1, 127):
        e, m = b >> 3, b & 7
        if e == 0:  # subnormal m · 2^-9: normalise
            x = -9 + m.bit_length() - 1
            m = (m << (4 - m.bit_length())) & 7
        else:
            x = e - 7
        fwd[b] = ((x + 10) << 3) | m
        inv[fwd[b]] = b
    return fwd, inv


_E5M3_FWD, _E5M3_INV = _e5m3_tables()


@functools.cache
def _lut(inverse: bool, device: torch.device) -> torch.Tensor:
    """The E4M3 -> E5M3 byte table (256 entries; invalid bytes map to 0), or its inverse, on ``device``: made once
    per device, since the weight sync re-encodes every quantized linear's scales before each batch."""
    return torch.tensor(_E5M3_INV if inverse else _E5M3_FWD + [0] * 129, dtype=torch.uint8, device=device)


def pack_scales(scales: torch.Tensor) -> torch.Tensor:
    """E4M3 block scales [N, K/16] (non-negative, finite: what the quantizer writes) in the kernel's layout and
    encoding, u8 [N/16, K]: per 16-row group and 64-value tile, for each i in 0..7 the scales of blocks s = 0..3 of
    rows i and i + 8 (order s, h), as unsigned E5M3 bytes (module docstring)."""
    n, kb = scales.shape
    _check_shape(n, kb * 16)
    e5 = _lut(False, scales.device)[scales.view(torch.uint8).long()]
    return e5.view(n // 16, 2, 8, kb // 4, 4).permute(0, 3, 2, 4, 1).reshape(n // 16, kb * 16)


def unpack_scales(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_scales`: E4M3 block scales [N, K/16]."""
    groups, k = packed.shape
    e4 = _lut(True, packed.device)[packed.long()].view(groups, k // 64, 8, 4, 2).permute(0, 4, 2, 1, 3)
    return e4.reshape(groups * 16, k // 16).view(torch.float8_e4m3fn)


@dataclass(frozen=True)
class FP4WConfig:
    """One launch configuration: weight rows per program (``block_n``, a multiple of 16), K per step
    (``block_k``, a multiple of :data:`K_TILE`), split-K (``split``; None: enough to fill the SMs), warps,
    pipeline stages, and which operand the decoded weight is (``swap_ab``, :func:`_fp4w_kernel`)."""

    block_n: int = 128
    block_k: int = 128
    split: int | None = None
    num_warps: int = 4
    num_stages: int = 4
    swap_ab: bool = True


#: measured configurations, ``(N, K) -> {M bucket: config, or None where cuBLAS on the BF16 Ŵ was faster}``.
#: ``scripts/bench_fp4w.py --write-table`` rewrites this block from a sweep on the GPU; shapes missing here follow
#: :func:`table_config`'s rule for unmeasured shapes.
# fmt: off
# BEGIN TABLE
TABLE: dict[tuple[int, int], dict[int, FP4WConfig | None]] = {
    (1024, 2048): {16: FP4WConfig(block_n=64, block_k=128, split=8, num_warps=4, num_stages=4, swap_ab=True), 64: None},
    (1024, 3072): {16: FP4WConfig(block_n=64, block_k=128, split=8, num_warps=4, num_stages=4, swap_ab=True), 64: None},
    (2048, 2048): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: None},
    (2048, 6144): {64: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True)},
    (2560, 4096): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: None},
    (2560, 9728): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True)},
    (4096, 1024): {16: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True), 64: None},
    (4096, 2048): {16: FP4WConfig(block_n=64, block_k=128, split=2, num_warps=4, num_stages=4, swap_ab=True), 64: None},
    (4096, 4096): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=64, block_k=128, split=2, num_warps=4, num_stages=4, swap_ab=True)},
    (4096, 12288): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True)},
    (6144, 1024): {16: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True)},
    (6144, 2560): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True)},
    (6144, 4096): {16: FP4WConfig(block_n=64, block_k=128, split=4, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=64, block_k=128, split=2, num_warps=4, num_stages=4, swap_ab=True)},
    (12288, 2048): {64: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True)},
    (19456, 2560): {16: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=128, block_k=64, split=2, num_warps=4, num_stages=4, swap_ab=True)},
    (24576, 4096): {16: FP4WConfig(block_n=64, block_k=128, split=1, num_warps=4, num_stages=4, swap_ab=True), 64: FP4WConfig(block_n=128, block_k=64, split=2, num_warps=4, num_stages=4, swap_ab=True)},
}
# END TABLE
# fmt: on

DEFAULT_CONFIG = FP4WConfig()

#: the activation-row buckets of the table (a row count takes the smallest bucket that holds it)
M_BUCKETS = (8, 16, 32, 64, 128, 256)
#: the most rows at which a shape missing from the table takes the FP4 kernel: each of the 10 projections measured
#: at 16 rows was faster there, and 3 of the 12 measured at 64 rows were slower (``benchmarks/RESULTS.md``)
UNMEASURED_MAX_ROWS = 16


def m_bucket(m: int) -> int:
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


def table_config(n: int, k: int, m: int) -> FP4WConfig | None:
    """The measured configuration for a [N, K] weight at ``m`` rows: a config, or None where the measurement
    found cuBLAS on the BF16 Ŵ faster. A bucket not measured takes the nearest measured one below it (else the
    smallest); a shape not measured takes :data:`DEFAULT_CONFIG` up to :data:`UNMEASURED_MAX_ROWS` rows and
    None above."""
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
    """An NVFP4 weight [N, K] as the kernel reads it: ``codes`` u8 [N/16, 8K] (:func:`pack_codes`), ``scales`` u8
    [N/16, K] (:func:`pack_scales`), ``gain`` fp32 [N] (``g[n] = fp32(amax · fl(1/2688))`` of the tensor row n
    belongs to). Allocated once; :meth:`copy_rows_` writes in place, so graphs that read it stay valid when the
    weights change."""

    codes: torch.Tensor
    scales: torch.Tensor
    gain: torch.Tensor

    @classmethod
    def empty(cls, n: int, k: int, device) -> FP4Weight:
        _check_shape(n, k)
        return cls(
            torch.zeros((n // 16, 8 * k), dtype=torch.uint8, device=device),
            torch.zeros((n // 16, k), dtype=torch.uint8, device=device),
            torch.zeros((n,), dtype=torch.float32, device=device),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.gain.shape[0], self.scales.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.gain))

    def copy_rows_(self, row: int, data: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor) -> int:
        """Write one quantized weight (``NVFP4Tensor`` fields: data u8 [n, K/2], scales E4M3 [n, K/16], amax
        [1] per tensor or [n] per row) into rows ``row:row + n`` (both multiples of 16) at the same addresses;
        returns ``row + n``."""
        n = data.shape[0]
        if amax.numel() not in (1, n):
            raise ValueError(f"FP4Weight takes one amax per tensor or per row ({n}); got {amax.numel()}")
        if row % GROUP_ROWS or n % GROUP_ROWS:
            raise ValueError(f"FP4Weight writes whole {GROUP_ROWS}-row groups; got rows {row}:{row + n}")
        if tuple(data.shape) != (n, self.shape[1] // 2) or tuple(scales.shape) != (n, self.shape[1] // 16):
            raise ValueError(
                f"FP4Weight [{self.shape[0]}, {self.shape[1]}] takes data [n, {self.shape[1] // 2}] and scales "
                f"[n, {self.shape[1] // 16}]; got {tuple(data.shape)} and {tuple(scales.shape)}"
            )
        if row + n > self.shape[0]:
            raise ValueError(f"FP4Weight has {self.shape[0]} rows; rows {row}:{row + n} do not fit")
        sc = scales.view(torch.uint8)
        g0, g1 = row // GROUP_ROWS, (row + n) // GROUP_ROWS
        if kernel_device_ok(data):  # one launch (fp4w_pack); the same bytes as the reference below
            from minite_kernels.backends.triton.fp4w_pack import pack_into

            pack_into(self.codes, self.scales, g0, data, sc, _lut(False, data.device))
        else:
            data = torch.where((sc == 0).repeat_interleave(8, dim=1), 0, data)  # a zero block's codes: 0
            self.codes[g0:g1].copy_(pack_codes(data))
            self.scales[g0:g1].copy_(pack_scales(sc.view(torch.float8_e4m3fn)))
        self.gain[row : row + n].copy_((amax.reshape(-1).to(torch.float32) * INV_2688).expand(n))
        return row + n


def fp4w_linear_reference(
    x_hat: torch.Tensor, w: FP4Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The module docstring's formula in pure PyTorch (fp64 sums of the exact products, then the fp32 gain):
    ``bf16(fp32(Σ_k X̂ QS) · g)`` (then ``bf16(· + b)``). Equal to the kernel up to the order of its fp32 sum."""
    from minite_kernels.formats.e2m1 import e2m1_decode, unpack_nibbles

    n, k = w.shape
    q = e2m1_decode(unpack_nibbles(unpack_codes(w.codes))).to(torch.float64).view(n, k // 16, 16)
    qs = (q * unpack_scales(w.scales).to(torch.float64).unsqueeze(-1)).view(n, k)
    acc = (x_hat.to(torch.float64) @ qs.t()).to(torch.float32)
    y = (acc * w.gain.to(torch.float32)).to(torch.bfloat16)
    return y if bias is None else (y.to(torch.float32) + bias.to(torch.float32)).to(torch.bfloat16)


#: the decode's operand is ``QS · 2^-26`` (q · 2^-126 times s · 2^100); the epilogue multiplies by 2^26 (exact:
#: powers of two commute with the fp32 roundings)
_TWO_26 = tl.constexpr(67108864.0)
#: one packed word ($4) and its two rows' scale bytes ($5: [s0, s0, s1, s1]) to the lane's four fragment
#: registers ($0..$3, register r = h + 2e): the scales' BF16 bits of s · 2^100 (prmt, mad), each register's
#: bits of q · 2^-126 (shifts, masks; lop3 with 0xE4 is ``c ? a : b``, 0xD8 is ``c ? b : a``), times its scale
_DECODE_ASM = tl.constexpr("""{
.reg .b32 a, b, c, s0, s1;
prmt.b32 s0, $5, 0, 0x4140;
prmt.b32 s1, $5, 0, 0x4342;
mad.lo.u32 s0, s0, 16, 0x6C806C80;
mad.lo.u32 s1, s1, 16, 0x6C806C80;
and.b32 a, $4, 0x81C081C0;
mul.rn.bf16x2 $0, a, s0;
shl.b32 a, $4, 3;
and.b32 a, a, 0x81C081C0;
mul.rn.bf16x2 $1, a, s1;
shl.b32 a, $4, 6;
and.b32 a, a, 0x81C081C0;
mul.rn.bf16x2 $2, a, s0;
shl.b32 a, $4, 1;
shr.b32 b, $4, 4;
shr.b32 c, $4, 5;
lop3.b32 a, a, b, 0x80008000, 0xE4;
lop3.b32 a, a, c, 0x01000100, 0xD8;
and.b32 a, a, 0x81C081C0;
mul.rn.bf16x2 $3, a, s1;
}""")


@triton.jit
def _to_matrix(r0, r1, NR: tl.constexpr, KT: tl.constexpr):
    """The decoded values [NR, KT, 32, 16] of registers (h, e = 0) and (h, e = 1), indexed (group R, tile T, lane
    4i + t, byte 4s + 2h + p), as the weight tile [16 NR, 64 KT] (row 16R + 8h + i, column 64T + 16s + 8e + 2t + p).
    Only indices move: the compiler maps this onto the MMA's register layout without moving data."""
    w = tl.reshape(tl.join(r0, r1), [NR, KT, 8, 4, 4, 2, 2, 2])  # R T i t s h p e
    w = tl.permute(w, (0, 5, 2, 1, 4, 7, 3, 6))  # R h i T s e t p
    return tl.reshape(w, [NR * 16, KT * 64])


@triton.jit
def _e2m1_value(word, R: tl.constexpr, P: tl.constexpr):
    """The E2M1 value (fp32) of fragment register R's half P in int32 ``word``s (module docstring's bits)."""
    o: tl.constexpr = 16 * P
    if R < 3:
        sign = (word >> (15 - 3 * R + o)) & 1
        mag = (word >> (6 - 3 * R + o)) & 7
    else:
        sign = (word >> (14 + o)) & 1
        mag = (((word >> (13 + o)) & 1) << 2) | ((word >> (10 + o)) & 3)
    e = (mag >> 1).to(tl.float32)
    m = (mag & 1).to(tl.float32)
    v = tl.where(e == 0, 0.5 * m, tl.exp2(e - 1.0) * (1.0 + 0.5 * m))
    return tl.where(sign == 1, -v, v)


@triton.jit
def _e5m3_value(b):
    """The value (fp32) of unsigned E5M3 scale bytes ``b`` (int32), times 2^-26."""
    v = tl.exp2(((b >> 3) - 36).to(tl.float32)) * (1.0 + (b & 7).to(tl.float32) * 0.125)
    return tl.where(b == 0, 0.0, v)


@triton.jit
def _interleave(v00, v01, v10, v11):
    """[..., 4] values of (h, p) = (0, 0), (0, 1), (1, 0), (1, 1) as [..., 16] in byte order 4s + 2h + p."""
    w = tl.join(tl.join(v00, v10), tl.join(v01, v11))  # ..., s, h, p
    return tl.reshape(w, [w.shape[0], w.shape[1], w.shape[2], 16])


@triton.jit
def _decode_emulated(c, sc, NR: tl.constexpr, KT: tl.constexpr):
    """What :data:`_DECODE_ASM` computes, with Triton integer and fp32 ops (the interpreter has no inline PTX):
    ``QS · 2^-26`` for each byte position of registers e = 0 and e = 1, [NR, KT, 32, 16] fp32 each."""
    b = tl.reshape(c.to(tl.int32), [NR, KT, 32, 4, 2, 2])  # byte 2a + b of word s
    b02, b13 = tl.split(b)
    b0, b2 = tl.split(b02)
    b1, b3 = tl.split(b13)
    word = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)  # [NR, KT, 32, 4]
    s0, s1 = tl.split(tl.reshape(sc.to(tl.int32), [NR, KT, 32, 4, 2]))
    f0 = _e5m3_value(s0)
    f1 = _e5m3_value(s1)
    r0 = _interleave(
        _e2m1_value(word, 0, 0) * f0,
        _e2m1_value(word, 0, 1) * f0,
        _e2m1_value(word, 1, 0) * f1,
        _e2m1_value(word, 1, 1) * f1,
    )
    r1 = _interleave(
        _e2m1_value(word, 2, 0) * f0,
        _e2m1_value(word, 2, 1) * f0,
        _e2m1_value(word, 3, 0) * f1,
        _e2m1_value(word, 3, 1) * f1,
    )
    return r0, r1


@triton.jit
def _decode(c, sc, NR: tl.constexpr, KT: tl.constexpr, INTERP: tl.constexpr):
    """The weight tile [16 NR, 64 KT] as ``QS · 2^-26`` (BF16 compiled, fp32 interpreted) from its packed code
    bytes ``c`` u8 [NR, KT, 32, 16] (per lane, four words) and scale bytes ``sc`` u8 [NR, KT, 32, 8]."""
    if INTERP:
        r0, r1 = _decode_emulated(c, sc, NR, KT)
    else:
        sc16 = tl.reshape(tl.join(sc, sc), [NR, KT, 32, 16])  # byte 4s + 2h + p takes scale (s, h)
        r0, r1 = tl.inline_asm_elementwise(
            _DECODE_ASM, "=r,=r,=r,=r,r,r", [c, sc16], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    return _to_matrix(r0, r1, NR, KT)


@triton.jit
def _fp4w_kernel(x_ptr, codes_ptr, scales_ptr, gain_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
                 stride_xm, K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                 INTERP: tl.constexpr, PDL: tl.constexpr = False, PREFETCH_K: tl.constexpr = 0):  # fmt: skip
    """Grid (N tiles, SPLIT, M tiles). ``x`` BF16 [M, K] (row stride ``stride_xm``), ``codes`` u8 [N/16, 8K] and
    ``scales`` u8 [N/16, K] in the layout of :func:`pack_codes` / :func:`pack_scales`, ``gain`` fp32 [N], ``y`` BF16
    [M, N]. ``SWAP_AB``: the accumulator is [BLOCK_N, BLOCK_M], weight rows first, and the decoded weight is the
    MMA's register operand (one asynchronous MMA per 64 weight rows and K step of 16); otherwise the accumulator is
    [BLOCK_M, BLOCK_N] and the decoded tile goes through shared memory as the MMA's second operand (one store of
    the tile, then the step's MMAs issued back to back). Groups past N and rows past M are clamped to 0 for the
    loads (no masks in the K loop) and left out of the stores.

    ``PDL`` (launched with programmatic dependent launch, sm_90+): the program may start while the kernel that
    writes ``x`` still runs. It first asks the L2 for the first ``PREFETCH_K`` columns of its own weight bytes
    (``K_PER_SPLIT``: its whole slice; 0: nothing), per row group the codes ``[8 (K g + k0), 8 (K g + k0 +
    PREFETCH_K))`` and the scales ``[K g + k0, K g + k0 + PREFETCH_K)`` of its split (``k0``: the split's first
    column; one bulk prefetch each, none for groups past N), then waits (``griddepcontrol.wait``); every load (x,
    gain, bias, the split-K partials and counter) and every store comes after the wait."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    NR: tl.constexpr = BLOCK_N // 16
    KT: tl.constexpr = BLOCK_K // 64
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = offs_n < N
    mmask = offs_m < M
    rows_n = tl.where(nmask, offs_n, 0)
    rows_m = tl.where(mmask, offs_m, 0)
    grp = pid_n * NR + tl.arange(0, NR)
    grp = tl.where(grp < N // 16, grp, 0)[:, None, None, None]
    tile = tl.arange(0, KT)[None, :, None, None]
    lane = tl.arange(0, 32)[None, None, :, None]
    k_start = tl.multiple_of(pid_k * K_PER_SPLIT, BLOCK_K)
    if PDL:  # the weights are constant during a rollout: no kernel this one may overlap writes them
        if PREFETCH_K > 0:
            for r in tl.static_range(NR):
                g = pid_n * NR + r
                on = g < N // 16
                c0 = g * (K * 8) + k_start * 8
                _prefetch_l2(codes_ptr, c0, tl.where(on, c0 + PREFETCH_K * 8, c0))
                s0 = g * K + k_start
                _prefetch_l2(scales_ptr, s0, tl.where(on, s0 + PREFETCH_K, s0))
        gdc_wait()
    c_ptrs = (
        codes_ptr
        + grp * (K * 8)
        + (k_start * 8 + tile * 512)
        + lane * 16
        + tl.arange(0, 16)[None, None, None, :]
    )
    # a tile's scales once per row group i (8 bytes: blocks s = 0..3 of rows i and i + 8), then each to the
    # four lanes 4i + t that use it (a broadcast read of shared memory)
    s_ptrs = scales_ptr + grp * K + (k_start + tile * 64) + tl.arange(0, 8)[None, None, :, None] * 8
    s_ptrs += tl.arange(0, 8)[None, None, None, :]
    if SWAP_AB:
        x_ptrs = x_ptr + rows_m[None, :] * stride_xm + (k_start + tl.arange(0, BLOCK_K))[:, None]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        x_ptrs = x_ptr + rows_m[:, None] * stride_xm + (k_start + tl.arange(0, BLOCK_K))[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K_PER_SPLIT, BLOCK_K):
        sc = tl.reshape(tl.broadcast_to(tl.load(s_ptrs)[:, :, :, None, :], [NR, KT, 8, 4, 8]), [NR, KT, 32, 8])
        w = _decode(tl.load(c_ptrs), sc, NR, KT, INTERP)
        xt = tl.load(x_ptrs)
        if INTERP:  # the interpreter's BF16 dots are not fp32-accumulated: the (exact) fp32 values instead
            xt = xt.to(tl.float32)
        if SWAP_AB:
            acc = tl.dot(w, xt, acc)
        else:
            acc = tl.dot(xt, tl.trans(w), acc)
        c_ptrs += KT * 512
        s_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if not SWAP_AB:
        acc = tl.trans(acc)
    omask = nmask[:, None] & mmask[None, :]
    y_ptrs = y_ptr + offs_m[None, :] * N + offs_n[:, None]
    gain = tl.load(gain_ptr + rows_n)[:, None] * _TWO_26
    if SPLIT > 1:
        tile_id = pid_m * tl.num_programs(0) + pid_n
        p_ptrs = part_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(p_ptrs + pid_k * M * N, acc, mask=omask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tot = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for sk in tl.static_range(SPLIT):
                tot += tl.load(p_ptrs + sk * M * N, mask=omask, other=0.0, cache_modifier=".cg")
            y = _round(tot * gain, INTERP)
            if HAS_BIAS:
                y = _round(y + tl.load(bias_ptr + rows_n).to(tl.float32)[:, None], INTERP)
            tl.store(y_ptrs, y.to(tl.bfloat16), mask=omask)
            tl.atomic_xchg(cnt_ptr + tile_id, 0)
    else:
        y = _round(acc * gain, INTERP)
        if HAS_BIAS:
            y = _round(y + tl.load(bias_ptr + rows_n).to(tl.float32)[:, None], INTERP)
        tl.store(y_ptrs, y.to(tl.bfloat16), mask=omask)


#: the shared memory one program may plan for (the H100 / H200 limit is 227 KiB; the estimate below is an upper
#: bound of what Triton allocates)
SMEM_BUDGET = 200 * 1024


def _smem_bytes(cfg: FP4WConfig, bm: int, bk: int) -> int:
    """An upper bound of a launch's shared memory: per pipeline stage the codes, scales and X̂ tiles, plus the
    decoded tile where it is the MMA's shared-memory operand (``swap_ab=False``)."""
    stage = cfg.block_n * bk // 2 + cfg.block_n * bk // 16 + bm * bk * 2
    return cfg.num_stages * stage + (0 if cfg.swap_ab else cfg.block_n * bk * 2)


def _block_m(cfg: FP4WConfig, m: int, bk: int) -> int:
    """Activation rows per program: all ``m`` up to :data:`MAX_BLOCK_M`, halved while the launch would not fit
    :data:`SMEM_BUDGET` (a deep pipeline measured at fewer rows, used at more)."""
    bm = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))
    while bm > 16 and _smem_bytes(cfg, bm, bk) > SMEM_BUDGET:
        bm //= 2
    return bm


def _auto_split(device: torch.device, programs: int, k: int, bk: int, waves: int = 1) -> int:
    """Powers of two dividing K's tiles while the programs would not fill ``waves`` times the SMs and each split
    keeps at least two K tiles."""
    target = waves * _num_sms(device)
    tiles = k // bk
    split = 1
    while programs * split < target and tiles % (split * 2) == 0 and tiles // (split * 2) >= 2:
        split *= 2
    return split


def fp4w_linear(
    x_hat: torch.Tensor,
    w: FP4Weight,
    bias: torch.Tensor | None = None,
    config: FP4WConfig | None = None,
    out: torch.Tensor | None = None,
    pdl: bool | None = None,
    prefetch: str | None = None,
) -> torch.Tensor:
    """``Y = bf16(fp32(X̂ QSᵀ) · g)`` (then ``bf16(· + b)``) for BF16 ``x_hat`` [M, K] (unit stride along K)
    against the packed weight ``w`` [N, K]; ``config`` (default: the table's for this shape) changes only the
    order of the fp32 sum. ``out``: a BF16 [M, N] tensor to write into.

    ``pdl`` (default: :func:`~minite_kernels.backends.triton._common.pdl_enabled`, i.e. ``MINITE_TRITON_PDL=on``
    / ``options().pdl`` on sm_90+): launch with programmatic dependent launch, so the kernel starts while the
    one before it (the norm or SiLU kernel that writes ``x_hat``) still runs, prefetches its weight slice into
    L2 and only then waits for it. The result does not depend on it; True where it cannot run (the
    interpreter, a pre-Hopper GPU) is an error. ``prefetch`` (with PDL; default: ``options().pdl``'s,
    :data:`~minite_kernels.backends.triton._common.PDL_PREFETCH`, ``slice`` where that is ``off``) is what it
    asks the L2 for before it waits: ``slice`` its whole slice of codes and scales, ``head`` the slice's first
    ``num_stages`` K steps (what the pipeline's first loads read), ``none`` nothing."""
    n, k = w.shape
    if x_hat.dim() != 2 or x_hat.dtype != torch.bfloat16 or x_hat.shape[1] != k or x_hat.stride(1) != 1:
        raise ValueError(
            f"fp4w_linear takes BF16 x_hat [M, {k}] with unit stride along K; got {x_hat.dtype} "
            f"{tuple(x_hat.shape)} stride {tuple(x_hat.stride())}"
        )
    m = x_hat.shape[0]
    if prefetch is not None and prefetch not in PREFETCH_CHOICES:
        raise ValueError(f"fp4w_linear: prefetch={prefetch!r} is not valid; valid: {', '.join(PREFETCH_CHOICES)}")
    launch = _pdl_launch(x_hat, pdl)
    cfg = config or table_config(n, k, m) or DEFAULT_CONFIG
    bk, bn = cfg.block_k, cfg.block_n
    if bk % K_TILE or bn % GROUP_ROWS:
        raise ValueError(
            f"fp4w_linear: block_k={bk} must be a multiple of {K_TILE} and block_n={bn} of {GROUP_ROWS}"
        )
    if k % bk:  # the largest step that divides K
        bk = next((b for b in (256, 128, 64) if b <= cfg.block_k and k % b == 0), 0)
    y = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=x_hat.device)
    if m == 0 or n == 0:
        return y
    bm = _block_m(cfg, m, bk)
    n_tiles, m_tiles = triton.cdiv(n, bn), triton.cdiv(m, bm)
    s = cfg.split or _auto_split(x_hat.device, n_tiles * m_tiles, k, bk)
    if s & (s - 1) or k % (s * bk):
        raise ValueError(
            f"fp4w_linear: split={s} must be a power of two with K={k} a multiple of split * {bk}"
        )
    part, cnt = _workspace(x_hat.device, s, m, n, n_tiles * m_tiles) if s > 1 else (y, y)
    _fp4w_kernel[(n_tiles, s, m_tiles)](
        x_hat,
        w.codes,
        w.scales,
        w.gain,
        bias if bias is not None else y,
        y,
        part,
        cnt,
        m,
        n,
        k,
        x_hat.stride(0),
        K_PER_SPLIT=k // s,
        HAS_BIAS=bias is not None,
        SPLIT=s,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        SWAP_AB=cfg.swap_ab,
        INTERP=interpret_mode(),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch,
        **({"PREFETCH_K": _prefetch_k(prefetch, k // s, bk, cfg.num_stages)} if launch else {}),
    )
    return y


#: what :func:`fp4w_linear` may prefetch before it waits, launched with PDL: ``slice``, ``head``, ``none``
PREFETCH_CHOICES = tuple(PDL_PREFETCH.values())


def _prefetch_k(prefetch: str | None, k_per_split: int, bk: int, stages: int) -> int:
    """The columns of its slice a program prefetches (``PREFETCH_K``): ``prefetch``, or ``options().pdl``'s."""
    prefetch = prefetch or PDL_PREFETCH.get(pdl_mode(), "slice")
    return {"slice": k_per_split, "head": min(k_per_split, stages * bk), "none": 0}[prefetch]

"""NVFP4 quantization: E2M1 data, E4M3 block scales per 16 elements, an FP32 outer amax (TE-exact reference).

Report §2.2 ("NVFP4 encoding and two-level scaling": ``x̂ = q · s_b · s_g``) and §5.1 (per-token outer scale);
numerics from notes §1.2–§1.6, TE ``reference_nvfp4.py`` / ``core_nvfp4.cuh`` followed literally, all fp32
round-to-nearest, ``fl(c)`` = the fp32 constant::

    amax  = max|x| over the scaling domain (the tensor: per_tensor; each row: per_token)
    S_enc = min(fp32(2688 / amax), FLT_MAX);  S_enc = 1 if amax == 0 or S_enc == 0      (2688 = 448 * 6)
    S_dec = fp32(1 / S_enc)
    vmax  = max|x| over the block: 1x16 along K, or the 16x16 tile (tile=(16, 16))
    pre   = vmax * fp32(S_enc * fl(1/6))                        <- THIS association (not (vmax/6)/s_global)
    s_b   = e4m3_rne(clamp(min(pre, FLT_MAX), -448, 448))      stored block scale; may be 0 or subnormal
    enc   = min(fp32(1 / fp32(float(s_b) * S_dec)), FLT_MAX)   s_b = 0 -> enc = FLT_MAX
    q     = e2m1_rne(clamp(x * enc, -6, 6))                    or stochastic rounding (see ``stochastic``)
    x̂     = e2m1(q) * fp32(fp32(float(s_b) * amax) * fl(1/2688))   TE's dequantize kernel order, for
            amax <= TE_ORDER_AMAX_MAX (~7.6e35); above it, where that order overflows:
            e2m1(q) * min(fp32(float(s_b) * fp32(amax * fl(1/2688))), DECODE_FACTOR_MAX)

Storage (the layout every backend reads and writes): ``data`` uint8 ``[M, K//2]`` (element 2j in the low nibble),
``scales`` float8_e4m3fn ``[M, K//16]`` row-major unswizzled (see ``swizzle`` for the GEMM layout), ``amax``
fp32 ``[1]`` (per_tensor) or ``[M]`` (per_token).

Shapes. Quantization runs along the last dim K, which must be a positive multiple of 16 (else ValueError).
A 1-D input is one row (M = 1); a >2-D input is quantized with its leading dims flattened into M. ``data``,
``scales`` and ``amax`` are always over the flattened 2-D view; ``dequantize()`` returns the input's shape.
M = 0 is allowed (per_tensor amax is then 0). 16x16 tiles: when M % 16 != 0 the last tile has fewer rows;
it is treated as zero-padded (TE pads with zeros), which does not change its max|x|. Each tile's scale is
written on each of its rows, so storage stays per-row 1x16 and, without RHT, quantizing Wᵀ gives exactly
the transpose of quantizing W. ``scaling="per_token"`` with ``tile=(16, 16)`` is contradictory (a tile spans
16 rows with 16 different outer scales) and raises ValueError naming both fields.

RHT (``rht=True``): the 16-point transform of ``rht.py`` is applied along K first; the input is rounded to
bf16 and the transform output is bf16, and amax/scales are taken after it. ``dequantize()`` then returns
the transformed values (what a GEMM consumes); ``rht.inverse_rht`` maps them back.

Stochastic rounding (``rounding="stochastic"``): TE's software fallback, one random byte per element drawn
with ``torch.randint(0, 256, (M, K), generator=generator)`` in row-major order (the device's default
generator when ``generator`` is None). Scale math is unchanged. With ``rounding="nearest"`` the generator
is not consumed (so a GEMM can pass one generator to both operands and only the SR operand draws from it).

Bad input. Non-tensor or non-floating dtype -> TypeError naming the dtype and the valid dtypes (float32,
bfloat16, float16, float64; float64 is rounded to float32 first). Unknown ``scaling``/``tile``/``rounding``
-> ValueError with the valid choices and a close one. NaN/Inf: a non-finite value poisons its scaling
domain (the whole tensor for per_tensor, its row for per_token): that domain's ``amax`` is NaN, its
``nonfinite`` flag is True, its scales are the E4M3 NaN (0x7F), its codes are 0, and it dequantizes to NaN.
Other rows (per_token) are quantized as if the poisoned rows were absent. Never finite garbage.
Finite input never decodes to a non-finite value. TE's decode order overflows in ``float(s_b) * amax`` once
amax > FLT_MAX/448 (~7.6e35) and gives ±inf/NaN; there, and only there, the factor is formed as
``s_b * (amax / 2688)`` and capped so that ``6 * factor`` stays finite (x̂ is then within fp32 rounding of TE's
exact value). Below that amax every byte and value is TE's.

Worked example (notes §1.9): tensor amax 10.0, a block with amax 6.3: S_enc = 268.79998779296875,
pre = 282.23999 -> s_b = 288 (byte 0x79), enc = 0.93333328; x = 1.0 -> 0.9333 -> code 2 -> x̂ = 1.0714285;
x = -3.1 -> code 13 -> x̂ = -3.214286. The 16 values 0.1, -0.25, 0.3, 0.75, 1.0, -1.3, 2.0, 2.5, -3.1, 3.5,
4.2, -5.0, 5.9, 0.0, -0.01, 6.3 pack to bytes ``80 11 a2 44 5d e6 07 78``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..capture import any_or_capturing
from ._validate import as_rows, check_choice, check_float_tensor
from .e2m1 import E2M1_MAX, e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles
from .e4m3 import E4M3_MAX, e4m3_cast
from .rht import apply_rht
from .stochastic import e2m1_encode_stochastic, random_bytes

NVFP4_BLOCK = 16
FLT_MAX = torch.finfo(torch.float32).max
SCALINGS = ("per_tensor", "per_token")
TILES = ((1, 16), (16, 16))
ROUNDINGS = ("nearest", "stochastic")
_E4M3_NAN_BYTE = 0x7F


def _f32(v: float, device: torch.device) -> torch.Tensor:
    """fp32(v) as a 0-d tensor on ``device``, made by a fill (no host-to-device copy: CUDA-graph capturable)."""
    return torch.full((), v, dtype=torch.float32, device=device)


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """``S_enc = min(fp32(2688/amax), FLT_MAX)``, and 1 where ``amax == 0`` or ``S_enc == 0`` (fp32)."""
    amax = amax.to(torch.float32)
    s_enc = torch.minimum(_f32(E4M3_MAX * E2M1_MAX, amax.device) / amax, _f32(FLT_MAX, amax.device))
    return torch.where((amax == 0) | (s_enc == 0), _f32(1.0, amax.device), s_enc)


def block_scales(vmax: torch.Tensor, s_enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From block maxima and the (broadcastable) global encode scale, return ``(s_b, enc)``.

    ``s_b`` is the stored float8_e4m3fn block scale and ``enc`` the fp32 factor applied to x before E2M1
    rounding; formulas in the module docstring (TE's association order).
    """
    dev = vmax.device
    s_dec = _f32(1.0, dev) / s_enc
    pre = vmax.to(torch.float32) * (s_enc * _f32(1.0 / 6.0, dev))
    s_b = e4m3_cast(torch.minimum(pre, _f32(FLT_MAX, dev)))
    enc = torch.minimum(_f32(1.0, dev) / (s_b.to(torch.float32) * s_dec), _f32(FLT_MAX, dev))
    return s_b, enc


def _largest_finite_multiplicand(k: float) -> float:
    """The largest fp32 ``a`` with ``fp32(k * a)`` finite."""
    kk, a = torch.tensor(k, dtype=torch.float32), torch.tensor(FLT_MAX / k, dtype=torch.float32)
    inf = torch.tensor(float("inf"))
    while torch.isfinite(kk * torch.nextafter(a, inf)):
        a = torch.nextafter(a, inf)
    while not torch.isfinite(kk * a):
        a = torch.nextafter(a, -inf)
    return float(a)


#: the largest amax for which TE's decode order ``fp32(float(s_b) * amax)`` cannot overflow (s_b <= 448)
TE_ORDER_AMAX_MAX = _largest_finite_multiplicand(E4M3_MAX)
#: the largest decode factor whose product with any E2M1 value (|q| <= 6) is finite
DECODE_FACTOR_MAX = _largest_finite_multiplicand(E2M1_MAX)


def dequant_factor(s_b: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Per-block decode factor: TE's ``fp32(fp32(float(s_b) * amax) * fl(1/2688))`` where amax <=
    ``TE_ORDER_AMAX_MAX``, else ``min(fp32(float(s_b) * fp32(amax * fl(1/2688))), DECODE_FACTOR_MAX)``, which
    cannot overflow (module docstring)."""
    s, a = s_b.to(torch.float32), amax.to(torch.float32)
    inv = _f32(1.0 / (E4M3_MAX * E2M1_MAX), s_b.device)
    safe = torch.clamp(s * (a * inv), max=DECODE_FACTOR_MAX)
    return torch.where(a > TE_ORDER_AMAX_MAX, safe, (s * a) * inv)


@dataclass
class NVFP4Tensor:
    """An NVFP4-quantized 2-D view ``[M, K]`` of a tensor (see the module docstring for the encoding).

    ``data`` uint8 [M, K//2]; ``scales`` float8_e4m3fn [M, K//16]; ``amax`` fp32 [1] or [M];
    ``nonfinite`` bool shaped like ``amax`` (True where a NaN/Inf poisoned the domain); ``shape`` is the
    original input shape (``dequantize()`` returns it).
    """

    data: torch.Tensor
    scales: torch.Tensor
    amax: torch.Tensor
    shape: torch.Size
    scaling: str = "per_tensor"
    tile: tuple[int, int] = (1, 16)
    rounding: str = "nearest"
    rht: bool = False
    orig_dtype: torch.dtype = torch.float32
    nonfinite: torch.Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.nonfinite is None:
            self.nonfinite = torch.isnan(self.amax)

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return self.data.shape[1] * 2

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: torch.device | str) -> NVFP4Tensor:
        """A copy with every tensor moved to ``device``."""
        return replace(
            self,
            data=self.data.to(device),
            scales=self.scales.to(device),
            amax=self.amax.to(device),
            nonfinite=self.nonfinite.to(device),
        )

    def codes(self) -> torch.Tensor:
        """Unpacked E2M1 codes, uint8 [M, K]."""
        return unpack_nibbles(self.data)

    def scales_f32(self) -> torch.Tensor:
        """Block scales as fp32 [M, K//16]."""
        return self.scales.to(torch.float32)

    def encode_factors(self) -> torch.Tensor:
        """The fp32 ``enc`` each block multiplied x by before rounding, [M, K//16], recomputed exactly from
        ``scales`` and ``amax`` (``enc = min(1/(float(s_b) * S_dec), FLT_MAX)``); for diagnostics."""
        amax = self.amax.reshape(-1, 1) if self.scaling == "per_token" else self.amax.reshape(1, 1)
        s_dec = _f32(1.0, self.device) / global_encode_scale(amax)
        return torch.minimum(_f32(1.0, self.device) / (self.scales_f32() * s_dec), _f32(FLT_MAX, self.device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``x̂ = e2m1 * (float(s_b) * amax * fl(1/2688))`` in fp32, cast to ``dtype``, in the input's shape."""
        m, k = self.rows, self.cols
        amax = self.amax.reshape(-1, 1) if self.scaling == "per_token" else self.amax.reshape(1, 1)
        factor = dequant_factor(self.scales, amax)  # [M, K//16]
        vals = e2m1_decode(self.codes()).view(m, k // NVFP4_BLOCK, NVFP4_BLOCK)
        return (vals * factor.unsqueeze(-1)).reshape(self.shape).to(dtype)

    def __repr__(self) -> str:
        return (
            f"NVFP4Tensor(shape={tuple(self.shape)}, scaling={self.scaling!r}, tile={self.tile}, "
            f"rounding={self.rounding!r}, rht={self.rht}, orig_dtype={self.orig_dtype}, device={self.device})"
        )


def _normalize_tile(tile: object) -> tuple[int, int]:
    """``(1, 16)``, ``[16, 16]`` or the strings ``"1x16"`` / ``"16x16"``; anything else names the valid tiles."""
    if isinstance(tile, str):
        parts = tile.lower().split("x")
        tile = parts if len(parts) == 2 and all(p.isdigit() for p in parts) else tile
    try:
        t = tuple(int(v) for v in tile)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        t = tile  # type: ignore[assignment]
    check_choice("tile", t, TILES)
    return t  # type: ignore[return-value]


def _block_max(xa: torch.Tensor, tile: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(vmax, vmax_1x16)``: max|x| per block of ``tile`` (a 16x16 tile's max is repeated on its rows) and
    per 1x16 block, both [M, K//16] fp32. Zero-padding a partial last tile does not change its max."""
    m, k = xa.shape
    kb = k // NVFP4_BLOCK
    v1 = xa.view(m, kb, NVFP4_BLOCK).amax(dim=-1)
    if tile == (1, 16):
        return v1, v1
    mt = -(-m // 16)
    padded = torch.zeros((mt * 16, kb), dtype=v1.dtype, device=v1.device)
    padded[:m] = v1
    return padded.view(mt, 16, kb).amax(dim=1).repeat_interleave(16, dim=0)[:m], v1


def quantize_nvfp4(
    x: torch.Tensor,
    *,
    scaling: str = "per_tensor",
    tile: tuple[int, int] = (1, 16),
    rounding: str = "nearest",
    rht: bool = False,
    generator: torch.Generator | None = None,
) -> NVFP4Tensor:
    """Quantize ``x`` to NVFP4 along its last dim (TE-exact; see the module docstring)."""
    check_float_tensor(x, "quantize_nvfp4")
    check_choice("scaling", scaling, SCALINGS)
    tile = _normalize_tile(tile)
    check_choice("rounding", rounding, ROUNDINGS)
    if scaling == "per_token" and tile != (1, 16):
        raise ValueError(
            f"scaling='per_token' with tile={tile} is contradictory: a 16x16 tile spans 16 rows that each have "
            "their own outer scale; use tile=(1, 16) with per_token, or scaling='per_tensor' with 16x16 tiles"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    orig_shape, orig_dtype = x.shape, x.dtype
    x2 = as_rows(x, NVFP4_BLOCK, "quantize_nvfp4")
    if rht:
        x2 = apply_rht(x2).to(torch.float32)
    m, k = x2.shape
    kb = k // NVFP4_BLOCK
    dev = x2.device

    # The domain amax is the max of the 1x16 block maxima (NaN and Inf propagate through both reductions), so
    # a non-finite amax means exactly "the domain holds a NaN/Inf".
    vmax, v1 = _block_max(x2.abs(), tile)
    if scaling == "per_token":
        amax = v1.amax(dim=1)
    else:
        amax = (v1.amax() if m else torch.zeros((), device=dev)).reshape(1)
    bad = ~torch.isfinite(amax)
    all_finite = not any_or_capturing(bad)  # captured: the non-finite path, exact on finite input
    if not all_finite:
        x2 = torch.where(torch.isfinite(x2), x2, _f32(0.0, dev))
        vmax, v1 = _block_max(x2.abs(), tile)
        amax = v1.amax(dim=1) if scaling == "per_token" else v1.amax().reshape(1)
    s_enc = global_encode_scale(amax).view(-1, 1)

    s_b, enc = block_scales(vmax, s_enc)
    scaled = (x2.view(m, kb, NVFP4_BLOCK) * enc.unsqueeze(-1)).view(m, k)
    if rounding == "stochastic":
        rbits = random_bytes((m, k), generator=generator, device=dev)
        codes = e2m1_encode_stochastic(scaled.clamp_(-E2M1_MAX, E2M1_MAX), rbits)
    else:
        codes = e2m1_encode(scaled)  # saturating: |v| > 5 -> code 7, so the clamp to ±6 is implied

    amax = amax.to(torch.float32)
    if not all_finite:
        row_bad = bad.expand(m) if scaling == "per_tensor" else bad
        codes = torch.where(row_bad.view(m, 1), torch.zeros((), dtype=torch.uint8, device=dev), codes)
        s_bytes = s_b.view(torch.uint8)
        s_bytes = torch.where(
            row_bad.view(m, 1), torch.full((), _E4M3_NAN_BYTE, dtype=torch.uint8, device=dev), s_bytes
        )
        s_b = s_bytes.view(torch.float8_e4m3fn)
        amax = torch.where(bad, _f32(float("nan"), dev), amax)

    return NVFP4Tensor(
        data=pack_nibbles(codes),
        scales=s_b.contiguous(),
        amax=amax,
        shape=orig_shape,
        scaling=scaling,
        tile=tile,
        rounding=rounding,
        rht=bool(rht),
        orig_dtype=orig_dtype,
        nonfinite=bad.clone(),
    )

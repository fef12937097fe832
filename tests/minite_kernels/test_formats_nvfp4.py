"""NVFP4 reference quantizer: byte-exact goldens (notes §1.9), TE's association order, an independent scalar
reference, per-token independence, 16x16 tiles, shapes, and the documented bad-input rules."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite_kernels.formats import NVFP4Tensor, block_scales, global_encode_scale, quantize_nvfp4

# ----------------------------------------------------------------------------------------------------------
# Independent slow scalar reference: pure Python floats, fp32 rounding through struct, E4M3 rounding by
# frexp, E2M1 by nearest-grid search. Shares no code with minite_kernels.formats.
FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def f32(v: float) -> float:
    """Round a double to the nearest fp32 (ties to even); overflow -> ±inf."""
    if math.isnan(v) or math.isinf(v):
        return v
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _f32_step(v: float, up: bool) -> float:
    """The next fp32 above (up) or below a positive fp32 ``v``."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0] + (1 if up else -1)
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def largest_finite_multiplicand(k: float) -> float:
    """The largest fp32 a with f32(k * a) finite."""
    a = f32(FLT_MAX / k)
    while math.isfinite(f32(k * _f32_step(a, up=True))):
        a = _f32_step(a, up=True)
    while not math.isfinite(f32(k * a)):
        a = _f32_step(a, up=False)
    return a


TE_ORDER_LIMIT = largest_finite_multiplicand(448.0)  # above it f32(s_b * amax) can overflow
FACTOR_MAX = largest_finite_multiplicand(6.0)  # 6 * factor stays finite


def e4m3_rne(v: float) -> float:
    if v == 0:
        return 0.0
    _, e = math.frexp(v)
    q = 2.0 ** (max(e - 1, -6) - 3)
    return round(v / q) * q


def e2m1_code(v: float) -> int:
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda c: (abs(GRID[c] - a), c % 2))
    return best | (8 if v < 0 else 0)


def code_value(c: int) -> float:
    return (-1.0 if c & 8 else 1.0) * GRID[c & 7]


def scalar_quantize(rows: list[list[float]], per_token: bool = False, tile16: bool = False):
    """Return (codes, scales, amax, dequant) as nested lists, following notes §1.2 step by step."""
    m, k = len(rows), len(rows[0])
    inv6, inv2688 = f32(1.0 / 6.0), f32(1.0 / 2688.0)

    def s_enc_of(amax: float) -> float:
        s = min(f32(2688.0 / amax), FLT_MAX) if amax != 0 else FLT_MAX
        return 1.0 if (amax == 0 or s == 0) else s

    if per_token:
        amaxes = [max(abs(v) for v in r) for r in rows]
    else:
        amaxes = [max(abs(v) for r in rows for v in r)] * m
    codes = [[0] * k for _ in range(m)]
    scales = [[0.0] * (k // 16) for _ in range(m)]
    deq = [[0.0] * k for _ in range(m)]
    for i in range(m):
        s_enc = s_enc_of(amaxes[i])
        s_dec = f32(1.0 / s_enc)
        mult = f32(s_enc * inv6)
        for b in range(k // 16):
            cols = range(16 * b, 16 * b + 16)
            if tile16:
                r0 = (i // 16) * 16
                vmax = max(abs(rows[r][c]) for r in range(r0, min(r0 + 16, m)) for c in cols)
            else:
                vmax = max(abs(rows[i][c]) for c in cols)
            pre = f32(vmax * mult)
            sb = e4m3_rne(min(pre, 448.0))
            denom = f32(sb * s_dec)
            enc = FLT_MAX if denom == 0 else min(f32(1.0 / denom), FLT_MAX)
            if amaxes[i] <= TE_ORDER_LIMIT:  # TE's order
                factor = f32(f32(sb * amaxes[i]) * inv2688)
            else:  # where TE's order overflows: the same factor formed without overflow, capped
                factor = min(f32(sb * f32(amaxes[i] * inv2688)), FACTOR_MAX)
            scales[i][b] = sb
            for c in cols:
                code = e2m1_code(max(-6.0, min(6.0, f32(rows[i][c] * enc))))
                codes[i][c] = code
                deq[i][c] = f32(code_value(code) * factor)
    return codes, scales, (amaxes if per_token else amaxes[:1]), deq


def assert_matches_scalar(x: torch.Tensor, **kw) -> NVFP4Tensor:
    q = quantize_nvfp4(x, **kw)
    codes, scales, amax, deq = scalar_quantize(
        x.tolist(), per_token=kw.get("scaling") == "per_token", tile16=kw.get("tile") == (16, 16)
    )
    assert q.codes().tolist() == codes
    assert q.scales.to(torch.float32).tolist() == scales
    assert q.amax.tolist() == amax
    got = q.dequantize().view(torch.int32)
    want = torch.tensor(deq, dtype=torch.float32).view(torch.int32)
    nan = torch.isnan(q.dequantize())
    assert torch.equal(nan, torch.isnan(torch.tensor(deq))) and torch.equal(got[~nan], want[~nan])  # bitwise
    return q


# ----------------------------------------------------------------------------------------------------------
WORKED = [0.1, -0.25, 0.3, 0.75, 1.0, -1.3, 2.0, 2.5, -3.1, 3.5, 4.2, -5.0, 5.9, 0.0, -0.01, 6.3]
WORKED_CODES = [0, 8, 1, 1, 2, 10, 4, 4, 13, 5, 6, 14, 7, 0, 8, 7]
WORKED_DEQ = [
    0,
    -0.0,
    0.535714,
    0.535714,
    1.071429,
    -1.071429,
    2.142857,
    2.142857,
    -3.214286,
    3.214286,
    4.285714,
    -4.285714,
    6.428571,
    0,
    -0.0,
    6.428571,
]


def test_worked_example_byte_exact():
    # notes §1.9: tensor amax 10 (second block), block amax 6.3
    x = torch.tensor([WORKED + [10.0] + [0.0] * 15])
    q = quantize_nvfp4(x)
    assert q.data.shape == (1, 16) and q.data.dtype == torch.uint8
    assert q.scales.shape == (1, 2) and q.scales.dtype == torch.float8_e4m3fn
    assert q.amax.shape == (1,) and q.amax.dtype == torch.float32 and q.amax.item() == 10.0
    assert q.codes()[0, :16].tolist() == WORKED_CODES
    assert bytes(q.data[0, :8].tolist()).hex(" ") == "80 11 a2 44 5d e6 07 78"
    assert q.scales.view(torch.uint8)[0, 0].item() == 0x79 and q.scales[0, 0].float().item() == 288.0
    assert q.dequantize()[0, :16].tolist() == pytest.approx(WORKED_DEQ, abs=5e-7)
    # decode factor 288 * 10 * fl(1/2688) = 1.0714285
    assert q.dequantize()[0, 4].item() == pytest.approx(1.0714285, abs=1e-7)


def test_worked_example_intermediates():
    s_enc = global_encode_scale(torch.tensor([10.0]))
    assert s_enc.item() == 268.79998779296875
    assert (1.0 / s_enc).item() == pytest.approx(0.0037202383, rel=1e-7)
    s_b, enc = block_scales(torch.tensor([6.3]), s_enc)
    assert s_b.float().item() == 288.0
    assert enc.item() == pytest.approx(0.93333328, rel=1e-7)


def test_tie_cases_from_notes():
    # amax 2688 and block amax 6: S_enc = s_b = enc = 1, so x*enc = x exactly
    x = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 6.0] + [0.0] * 7 + [2688.0] + [0.0] * 15])
    q = quantize_nvfp4(x)
    assert q.scales[0, 0].float().item() == 1.0
    assert q.codes()[0, :8].tolist() == [0, 2, 2, 4, 4, 6, 6, 7]


def test_underflow_case_from_notes():
    # amax 2688, block amax 0.001: pre = 1.67e-4 < 2^-10 -> s_b = 0, enc = FLT_MAX; codes 7/15, x̂ = 0
    blk = [0.001, -0.0005, 0.0002, -0.001] + [0.0004] * 12
    x = torch.tensor([blk + [2688.0] + [0.0] * 15])
    q = quantize_nvfp4(x)
    assert q.scales[0, 0].float().item() == 0.0
    assert q.codes()[0, :16].tolist() == [7, 15, 7, 15] + [7] * 12
    assert torch.all(q.dequantize()[0, :16] == 0)
    # an all-zero block: code 0 with s_b = 0
    z = quantize_nvfp4(torch.tensor([[0.0] * 16 + [1.0] * 16]))
    assert z.codes()[0, :16].tolist() == [0] * 16 and z.scales[0, 0].float().item() == 0.0


def test_association_order_156_53248():
    # notes §1.2: pre = 1.3125 exactly in real arithmetic, an E4M3 tie. TE's order gives 1.375.
    s_b, _ = block_scales(torch.tensor([156.0]), global_encode_scale(torch.tensor([53248.0])))
    assert s_b.float().item() == 1.375
    # the docs'/torchao order (vmax/6)/(amax/2688) lands on the other side of the tie: 1.25
    other = f32(f32(156.0 / 6.0) / f32(53248.0 / 2688.0))
    assert e4m3_rne(other) == 1.25
    x = torch.tensor([[156.0] + [0.0] * 15 + [53248.0] + [0.0] * 15])
    assert quantize_nvfp4(x).scales[0, 0].float().item() == 1.375


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "kw", [{}, {"scaling": "per_token"}, {"tile": (16, 16)}], ids=["per_tensor", "per_token", "tile16x16"]
)
def test_random_tensors_match_scalar_reference(seed, kw):
    g = torch.Generator().manual_seed(seed)
    m, k = 20, 64
    kind = seed % 3
    if kind == 0:  # gaussian with a random overall magnitude
        x = torch.randn(m, k, generator=g) * 10 ** torch.empty(1).uniform_(-4, 4, generator=g)
    elif kind == 1:  # heavy-tailed bf16 data (E4M3 ties are common)
        x = (
            (torch.randn(m, k, generator=g) * torch.exp(2 * torch.randn(m, k, generator=g)))
            .bfloat16()
            .float()
        )
    else:  # rows of wildly different magnitude, some zero blocks
        x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-40, 40, (m, 1), generator=g).float())
        x[:, 16:32] = 0
    assert_matches_scalar(x, **kw)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.sampled_from([16, 32]),
    st.data(),
    st.sampled_from(["per_tensor", "per_token"]),
)
def test_hypothesis_values_match_scalar_reference(m, k, data, scaling):
    vals = data.draw(
        st.lists(
            st.floats(width=32, allow_nan=False, allow_infinity=False),
            min_size=m * k,
            max_size=m * k,
        )
    )
    assert_matches_scalar(torch.tensor(vals, dtype=torch.float32).view(m, k), scaling=scaling)


def test_finite_input_never_decodes_to_inf_or_nan():
    """TE's decode order fp32(float(s_b) * amax) overflows once amax > FLT_MAX / 448 (~7.6e35); above that amax
    the factor is formed without overflow. The values stay those of the same input scaled down (to fp32
    rounding), and the scalar reference agrees bit for bit."""
    from minite_kernels.formats.nvfp4 import DECODE_FACTOR_MAX, TE_ORDER_AMAX_MAX

    assert (TE_ORDER_AMAX_MAX, DECODE_FACTOR_MAX) == (TE_ORDER_LIMIT, FACTOR_MAX)
    g = torch.Generator().manual_seed(11)
    base = torch.randn(4, 32, generator=g, dtype=torch.float64) / 4
    base[0, 0], base[1, 7], base[3, 31] = 1.0, -1.0, 0.999
    for scale in (1e36, 3e38, FLT_MAX, float(TE_ORDER_LIMIT), float(_f32_step(TE_ORDER_LIMIT, up=True))):
        x = (base * scale).clamp(-FLT_MAX, FLT_MAX).float()
        small = (x.double() / scale).float()
        for kw in ({"scaling": "per_token"}, {"scaling": "per_tensor"}, {"tile": (16, 16)}):
            q = assert_matches_scalar(x, **kw)
            d = q.dequantize()
            assert torch.isfinite(d).all() and not q.nonfinite.any(), (scale, kw)
            want = quantize_nvfp4(small, **kw).dequantize().double() * scale
            assert ((d.double() - want).abs().max() / want.abs().max()).item() < 1e-6, (scale, kw)
    for dt in (torch.bfloat16, torch.float16):  # each dtype's extremes, decoded back to that dtype
        fi = torch.finfo(dt)
        x = torch.tensor([[fi.max, -fi.max, fi.tiny, fi.smallest_normal / 4] + [1.0] * 12], dtype=dt)
        assert torch.isfinite(quantize_nvfp4(x).dequantize(dt)).all(), dt


def test_input_dtypes_are_quantized_from_their_fp32_value():
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(3)) * 7
    for dt in (torch.bfloat16, torch.float16):
        xd = x.to(dt)
        a, b = quantize_nvfp4(xd), quantize_nvfp4(xd.float())
        assert torch.equal(a.data, b.data) and torch.equal(
            a.scales.view(torch.uint8), b.scales.view(torch.uint8)
        )
        assert a.orig_dtype == dt
    a, b = quantize_nvfp4(x.double()), quantize_nvfp4(x)
    assert torch.equal(a.data, b.data)
    assert quantize_nvfp4(x).dequantize(torch.bfloat16).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------- per token
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.sampled_from([16, 48]), st.integers(0, 2**31 - 1), st.data())
def test_per_token_row_alone_equals_row_in_batch(m, k, seed, data):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-30, 30, (m, 1), generator=g).float())
    i = data.draw(st.integers(0, m - 1))
    batch = quantize_nvfp4(x, scaling="per_token")
    alone = quantize_nvfp4(x[i : i + 1], scaling="per_token")
    assert torch.equal(batch.data[i], alone.data[0])
    assert torch.equal(batch.scales.view(torch.uint8)[i], alone.scales.view(torch.uint8)[0])
    assert torch.equal(batch.amax[i : i + 1], alone.amax)
    assert torch.equal(batch.dequantize()[i], alone.dequantize()[0])
    assert batch.amax.shape == (m,)


def test_per_tensor_depends_on_the_batch_but_per_token_does_not():
    # the motivation of report §2.3: a token's scale changes with its batch under a tensor-wide amax
    row = torch.linspace(-1, 1, 32).view(1, 32)
    big = torch.full((1, 32), 100.0)
    t_alone, t_batch = quantize_nvfp4(row), quantize_nvfp4(torch.cat([row, big]))
    assert not torch.equal(t_alone.dequantize()[0], t_batch.dequantize()[0])
    p_alone, p_batch = (
        quantize_nvfp4(row, scaling="per_token"),
        quantize_nvfp4(torch.cat([row, big]), scaling="per_token"),
    )
    assert torch.equal(p_alone.dequantize()[0], p_batch.dequantize()[0])


# ---------------------------------------------------------------------------------------------- 16x16 tiles
@pytest.mark.parametrize("shape", [(32, 64), (48, 16), (16, 128)])
def test_2d_tiles_transposed_copy_equals_transpose(shape):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).bfloat16().float()
    w = w * torch.exp(torch.randn(*shape, generator=torch.Generator().manual_seed(1)))
    q, qt = quantize_nvfp4(w, tile=(16, 16)), quantize_nvfp4(w.T.contiguous(), tile=(16, 16))
    assert torch.equal(qt.dequantize(), q.dequantize().T)
    assert torch.equal(qt.codes(), q.codes().T)
    # each tile's scale is repeated over its 16 rows
    s = q.scales.view(torch.uint8)
    assert torch.equal(s, s[::16].repeat_interleave(16, dim=0))


def test_2d_tiles_with_partial_last_tile():
    # M = 20: rows 16..19 form a partial tile, treated as zero-padded (documented); matches the scalar reference
    x = torch.randn(20, 32, generator=torch.Generator().manual_seed(5)) * 3
    q = assert_matches_scalar(x, tile=(16, 16))
    assert q.scales.shape == (20, 2)


# ---------------------------------------------------------------------------------------------- shapes
def test_one_dim_input_is_one_row_and_leading_dims_flatten():
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(0))
    q = quantize_nvfp4(x, scaling="per_token")
    assert q.data.shape == (6, 16) and q.scales.shape == (6, 2) and q.amax.shape == (6,)
    assert q.dequantize().shape == (2, 3, 32)
    assert torch.equal(
        q.dequantize().reshape(6, 32), quantize_nvfp4(x.reshape(6, 32), scaling="per_token").dequantize()
    )
    v = quantize_nvfp4(x[0, 0])
    assert v.data.shape == (1, 16) and v.dequantize().shape == (32,)
    assert torch.equal(v.dequantize(), quantize_nvfp4(x[0, 0].view(1, 32)).dequantize()[0])


def test_non_contiguous_input_equals_contiguous():
    w = torch.randn(64, 32, generator=torch.Generator().manual_seed(9))
    a, b = quantize_nvfp4(w.T), quantize_nvfp4(w.T.contiguous())
    assert torch.equal(a.data, b.data) and torch.equal(a.dequantize(), b.dequantize())


def test_empty_rows_are_allowed():
    q = quantize_nvfp4(torch.zeros(0, 32))
    assert q.data.shape == (0, 16) and q.scales.shape == (0, 2) and q.amax.tolist() == [0.0]
    assert q.dequantize().shape == (0, 32)
    assert quantize_nvfp4(torch.zeros(0, 32), scaling="per_token").amax.shape == (0,)


def test_all_zero_tensor():
    q = quantize_nvfp4(torch.zeros(4, 32))
    assert q.amax.item() == 0.0 and torch.all(q.data == 0) and torch.all(q.dequantize() == 0)


# ---------------------------------------------------------------------------------------------- bad input
def test_k_not_multiple_of_16():
    with pytest.raises(ValueError, match=r"K=24.*multiple of 16"):
        quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(ValueError, match=r"K=0"):
        quantize_nvfp4(torch.randn(4, 0))
    with pytest.raises(ValueError, match="scalar"):
        quantize_nvfp4(torch.tensor(1.0))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float8_e4m3fn])
def test_non_floating_dtype(dtype):
    with pytest.raises(TypeError, match=r"dtype .*Valid dtypes: float32, bfloat16, float16"):
        quantize_nvfp4(torch.zeros(2, 16).to(dtype))
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize_nvfp4([[0.0] * 16])


def test_unknown_and_contradictory_options():
    x = torch.randn(16, 32)
    with pytest.raises(ValueError, match=r"scaling='per_tokn'.*did you mean 'per_token'\?"):
        quantize_nvfp4(x, scaling="per_tokn")
    with pytest.raises(ValueError, match=r"tile=\(8, 8\)"):
        quantize_nvfp4(x, tile=(8, 8))
    with pytest.raises(ValueError, match=r"rounding='stocastic'.*did you mean 'stochastic'\?"):
        quantize_nvfp4(x, rounding="stocastic")
    with pytest.raises(ValueError, match=r"scaling='per_token' with tile=\(16, 16\)"):
        quantize_nvfp4(x, scaling="per_token", tile=(16, 16))
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        quantize_nvfp4(x, rounding="stochastic", generator=0)
    # with rounding="nearest" a generator is accepted but not consumed
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert torch.equal(quantize_nvfp4(x, generator=g).data, quantize_nvfp4(x).data)
    assert torch.equal(g.get_state(), state)
    assert quantize_nvfp4(x, tile=[16, 16]).tile == (16, 16)  # lists are accepted


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_poisons_its_scaling_domain(bad):
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))
    x[1, 5] = bad
    # per_tensor: the whole tensor is the domain
    q = quantize_nvfp4(x)
    assert math.isnan(q.amax.item()) and q.nonfinite.tolist() == [True]
    assert torch.isnan(q.dequantize()).all()
    assert torch.all(q.scales.view(torch.uint8) == 0x7F) and torch.all(q.data == 0)
    # per_token: only row 1; the other rows equal their quantization without row 1
    p = quantize_nvfp4(x, scaling="per_token")
    assert p.nonfinite.tolist() == [False, True, False]
    d = p.dequantize()
    assert torch.isnan(d[1]).all() and torch.isfinite(d[[0, 2]]).all()
    clean = quantize_nvfp4(x[[0, 2]], scaling="per_token")
    assert torch.equal(d[[0, 2]], clean.dequantize())
    # stochastic rounding follows the same rule
    s = quantize_nvfp4(
        x, scaling="per_token", rounding="stochastic", generator=torch.Generator().manual_seed(0)
    )
    assert torch.isnan(s.dequantize()[1]).all() and torch.isfinite(s.dequantize()[0]).all()


def test_nvfp4_tensor_metadata_and_repr():
    x = torch.randn(4, 32).bfloat16()
    q = quantize_nvfp4(x, scaling="per_token")
    assert (q.rows, q.cols, q.scaling, q.tile, q.rounding, q.rht, q.orig_dtype) == (
        4,
        32,
        "per_token",
        (1, 16),
        "nearest",
        False,
        torch.bfloat16,
    )
    assert "per_token" in repr(q) and q.nonfinite.tolist() == [False] * 4
    moved = q.to("cpu")
    assert moved is not q and torch.equal(moved.data, q.data) and moved.scaling == "per_token"
    # encode factors recomputed from (scales, amax) reproduce the codes
    enc = q.encode_factors()
    scaled = (x.float().view(4, 2, 16) * enc.unsqueeze(-1)).view(4, 32)
    from minite_kernels.formats import e2m1_encode

    assert torch.equal(e2m1_encode(scaled.clamp(-6, 6)), q.codes())


def test_tile_strings_and_meta_tensors():
    from minite_kernels.formats import quantize_nvfp4

    x = torch.randn(16, 32)
    assert torch.equal(quantize_nvfp4(x, tile="16x16").data, quantize_nvfp4(x, tile=(16, 16)).data)
    with pytest.raises(ValueError, match=r"tile=.* is not valid; choose one of \[\(1, 16\), \(16, 16\)\]"):
        quantize_nvfp4(x, tile="2x16")
    with pytest.raises(ValueError, match="a meta tensor has no values to quantize"):
        quantize_nvfp4(torch.empty(4, 16, device="meta"))

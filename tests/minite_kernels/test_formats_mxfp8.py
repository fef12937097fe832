"""MXFP8 (notes §7): RCEIL E8M0 worked values, E4M3 data, bounds, shapes, NaN/Inf poisoning."""

from __future__ import annotations

import math

import pytest
import torch

from minite_kernels.formats import MXFP8Tensor, e4m3_cast, quantize_mxfp8

WORKED = [
    (5.0, 121, 2.0**-6, 320.0),
    (448.0, 127, 1.0, 448.0),
    (448.5, 128, 2.0, 224.25),
    (1.0, 119, 2.0**-8, 256.0),
    (0.001, 109, 2.0**-18, 256.0),
    (0.0, 0, 2.0**-127, 0.0),
]


@pytest.mark.parametrize("amax,byte,scale,stored", WORKED)
def test_worked_values(amax, byte, scale, stored):
    x = torch.zeros(1, 32)
    x[0, 5] = amax
    q = quantize_mxfp8(x)
    assert isinstance(q, MXFP8Tensor)
    assert q.scales.dtype == torch.uint8 and q.scales.tolist() == [[byte]]
    assert q.scales_f32().item() == scale
    # 448.5 * 2^-1 = 224.25 is not an E4M3 value: it rounds to 224
    assert q.data[0, 5].float().item() == e4m3_cast(torch.tensor([stored])).float().item()
    if amax in (5.0, 0.001):
        assert q.data[0, 5].float().item() == stored  # notes: 5.0 stored as 320, 0.001 as 256


def test_layout_and_error_bounds():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 128, generator=g) * torch.exp(torch.randn(8, 128, generator=g) * 2)
    q = quantize_mxfp8(x)
    assert q.data.shape == (8, 128) and q.data.dtype == torch.float8_e4m3fn and q.scales.shape == (8, 4)
    d = q.dequantize()
    assert d.shape == x.shape and d.dtype == torch.float32
    assert q.data.float().abs().max().item() <= 448
    blocks = x.view(8, 4, 32)
    amax = blocks.abs().amax(-1)
    scale = q.scales_f32()
    # RCEIL: the smallest power of two with amax / scale <= 448
    assert bool((amax / scale <= 448).all()) and bool((amax / (scale / 2) > 448).all())
    # E4M3 RNE: relative error <= 2^-4 for elements in the normal range of their block
    xs = (blocks / scale[..., None]).view(8, 128)
    normal = xs.abs() >= 2**-6
    rel = ((d - x).abs() / x.abs())[normal]
    assert rel.max().item() <= 2**-4
    # exact reconstruction of values already on the grid
    grid = torch.tensor([[1.0, -2.0, 0.5, 448.0] * 8])
    assert torch.equal(quantize_mxfp8(grid).dequantize(), grid)


def test_backward_like_error_is_about_1e_2():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    d = quantize_mxfp8(x).dequantize()
    rel = ((d - x).norm() / x.norm()).item()
    assert 5e-3 < rel < 5e-2


def test_shapes_and_bad_input():
    x = torch.randn(2, 3, 64)
    q = quantize_mxfp8(x)
    assert q.data.shape == (6, 64) and q.dequantize().shape == (2, 3, 64)
    assert quantize_mxfp8(torch.randn(64)).dequantize().shape == (64,)
    with pytest.raises(ValueError, match=r"K=48.*multiple of 32"):
        quantize_mxfp8(torch.randn(2, 48))
    with pytest.raises(ValueError, match=r"block=16.*\[32\]"):
        quantize_mxfp8(torch.randn(2, 64), block=16)
    with pytest.raises(TypeError, match="int32"):
        quantize_mxfp8(torch.zeros(2, 32, dtype=torch.int32))
    b = quantize_mxfp8(torch.randn(4, 64).bfloat16())
    assert b.orig_dtype == torch.bfloat16 and b.dequantize(torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_poisons_only_its_block(bad):
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    x[1, 40] = bad
    q = quantize_mxfp8(x)
    assert q.nonfinite_blocks.tolist() == [[False, False], [False, True]]
    assert q.scales[1, 1].item() == 255 and math.isnan(q.scales_f32()[1, 1].item())
    d = q.dequantize()
    assert torch.isnan(d[1, 32:]).all() and torch.isfinite(d[0]).all() and torch.isfinite(d[1, :32]).all()
    assert torch.equal(d[0], quantize_mxfp8(x[:1]).dequantize()[0])

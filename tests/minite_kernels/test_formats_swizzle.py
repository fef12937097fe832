"""128x4 swizzled scale layout (notes §1.3): hand-checked indices, an independent scatter, round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite_kernels.formats import (
    quantize_nvfp4,
    swizzle_scales_128x4,
    swizzled_shape,
    unswizzle_scales_128x4,
)


def formula_swizzle(s: torch.Tensor) -> torch.Tensor:
    """Scatter each scale to idx(m, kb) from the notes' closed form (element by element)."""
    m, kb = s.shape
    mp, kbp = swizzled_shape(m, kb)
    out = torch.zeros(mp * kbp, dtype=torch.uint8)
    for i in range(m):
        for j in range(kb):
            idx = (
                (i // 128) * (kbp // 4) * 512 + (j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
            )
            out[idx] = s[i, j]
    return out.view(mp, kbp)


def test_hand_checked_indices():
    s = torch.zeros(130, 7, dtype=torch.uint8)
    s[33, 6] = 1
    s[129, 2] = 2
    s[0, 0] = 3
    z = swizzle_scales_128x4(s)
    assert z.shape == (256, 8)
    flat = z.reshape(-1)
    # (33, 6): 0*2*512 + 1*512 + 1*16 + 1*4 + 2 = 534 ; (129, 2): 1*2*512 + 0 + 1*16 + 0 + 2 = 1042
    assert flat[534].item() == 1 and flat[1042].item() == 2 and flat[0].item() == 3
    assert int((flat != 0).sum()) == 3


@pytest.mark.parametrize("shape", [(1, 1), (130, 7), (256, 8), (37, 12)])
def test_matches_independent_scatter(shape):
    s = torch.randint(1, 255, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(swizzle_scales_128x4(s), formula_swizzle(s))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_round_trip(m, kb, seed):
    s = torch.randint(0, 256, (m, kb), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    z = swizzle_scales_128x4(s)
    assert z.shape == swizzled_shape(m, kb)
    assert torch.equal(unswizzle_scales_128x4(z, m, kb), s)
    assert torch.equal(unswizzle_scales_128x4(z.reshape(-1), m, kb), s)  # flat input works too


def test_e4m3_scales_keep_their_dtype():
    q = quantize_nvfp4(torch.randn(200, 64))
    z = swizzle_scales_128x4(q.scales)
    assert z.dtype == torch.float8_e4m3fn
    back = unswizzle_scales_128x4(z, 200, 4)
    assert torch.equal(back.view(torch.uint8), q.scales.view(torch.uint8))


def test_bad_shapes():
    with pytest.raises(ValueError, match="2-D"):
        swizzle_scales_128x4(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="1-byte"):
        swizzle_scales_128x4(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="M=130, Kb=7 need 256x8"):
        unswizzle_scales_128x4(torch.zeros(100, dtype=torch.uint8), 130, 7)

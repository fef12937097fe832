"""Stochastic rounding (notes §1.5): exact distribution over all 256 random bytes, unbiasedness end to end."""

from __future__ import annotations

import math

import pytest
import torch

from minite_kernels.formats import (
    dequant_factor,
    e2m1_encode_stochastic,
    e2m1_round_stochastic,
    quantize_nvfp4,
)
from minite_kernels.metrics import rel_l2

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def neighbours(a: float) -> tuple[float, float]:
    lo = max(g for g in GRID if g <= a)
    hi = min(g for g in GRID if g >= a)
    return lo, hi


def test_worked_example_from_docstring():
    v = torch.full((256,), 1.2)
    q = e2m1_round_stochastic(v, torch.arange(256, dtype=torch.uint8))
    assert (q == 1.5).sum().item() == 102 and (q == 1.0).sum().item() == 154
    assert q.double().mean().item() == pytest.approx(1.19921875, abs=1e-7)


def test_distribution_over_all_random_bytes_is_exact_and_nearly_unbiased():
    # Enumerating every byte r8 = 0..255 gives the exact expectation of the rounding for each value.
    vals = torch.linspace(-6, 6, 601)
    vals = torch.cat([vals, torch.tensor(GRID), -torch.tensor(GRID), torch.tensor([0.3, 1.9, 3.99, 5.99])])
    r = torch.arange(256, dtype=torch.uint8)
    q = e2m1_round_stochastic(vals[:, None].expand(-1, 256), r[None, :].expand(vals.numel(), -1))
    for v, row in zip(vals.tolist(), q):
        a = abs(v)
        lo, hi = neighbours(a)
        mags = row.abs()
        assert bool(((mags == lo) | (mags == hi)).all()), v  # only the two neighbours occur
        if lo == hi:  # grid values are kept exactly
            assert bool((mags == lo).all())
            continue
        step = hi - lo
        p_up = math.floor(256 * (a - lo) / step) / 256  # floor(256 f) / 256 (module docstring)
        assert (mags == hi).double().mean().item() == pytest.approx(p_up, abs=1e-12)
        mean = row.double().mean().item()
        # unbiased up to the 8-bit resolution: |E[q] - v| <= step / 256
        assert abs(mean - v) <= step / 256 + 1e-7


def test_codes_keep_the_sign_and_match_values():
    v = torch.tensor([-0.1, -1.2, 0.1, 5.5, -0.0])
    r = torch.tensor([0, 255, 0, 255, 0], dtype=torch.uint8)
    assert e2m1_encode_stochastic(v, r).tolist() == [8, 11, 0, 7, 0]
    with pytest.raises(ValueError, match="rbits shape"):
        e2m1_round_stochastic(v, r[:3])


def test_quantize_sr_is_unbiased_and_beats_round_to_nearest_on_average():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(32, 256, generator=g) * torch.exp(torch.randn(32, 256, generator=g))
    rn = quantize_nvfp4(x)
    draws = 64
    deqs = torch.stack(
        [quantize_nvfp4(x, rounding="stochastic", generator=g).dequantize().double() for _ in range(draws)]
    )
    sr0 = quantize_nvfp4(x, rounding="stochastic", generator=torch.Generator().manual_seed(0))
    # scale math is unchanged by SR
    assert torch.equal(sr0.scales.view(torch.uint8), rn.scales.view(torch.uint8)) and torch.equal(
        sr0.amax, rn.amax
    )

    # Exact per-element expectation and variance of one draw, from the 256-byte enumeration.
    enc = rn.encode_factors().repeat_interleave(16, dim=1)
    scaled = (x * enc).clamp(-6, 6)
    all_bytes = torch.arange(256, dtype=torch.uint8).expand(32, 256, 256)
    allq = e2m1_round_stochastic(scaled[..., None].expand(-1, -1, 256), all_bytes)
    allq = allq.double() * block_factor(rn)[..., None]
    expect, var = allq.mean(-1), allq.var(-1, unbiased=False)
    # z statistic of the summed deviation of the 64-draw means: N(0, 1) if the draws follow the distribution;
    # |z| < 5 fails with probability < 1e-6 for a correct implementation.
    z = (deqs.mean(0) - expect).sum() / torch.sqrt(var.sum() / draws)
    assert abs(z.item()) < 5
    # averaged SR error is well below RN's (TE's test averages 50 draws)
    err_sr, err_rn = rel_l2(x, deqs.mean(0)), rel_l2(x, rn.dequantize())
    assert err_sr < 0.5 * err_rn, (err_sr, err_rn)


def block_factor(q) -> torch.Tensor:
    return dequant_factor(q.scales, q.amax.view(1, 1)).double().repeat_interleave(16, dim=1)


def test_generator_makes_sr_reproducible():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    a = quantize_nvfp4(x, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    b = quantize_nvfp4(x, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    c = quantize_nvfp4(x, rounding="stochastic", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.data, b.data) and not torch.equal(a.data, c.data)
    assert a.rounding == "stochastic"

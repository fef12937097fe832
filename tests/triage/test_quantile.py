"""``triage.quantile.masked_quantile`` against ``torch.quantile(values[valid], q)``: equal, both paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.quantile import masked_quantile


def expected(values: torch.Tensor, valid: torch.Tensor, q: float) -> torch.Tensor:
    v = values[valid].float()
    return torch.quantile(v, q) if v.numel() else torch.zeros(())


def test_worked_example():
    x = torch.tensor([[-1.0, 0.0, 2.0, -3.0]])
    m = torch.ones(1, 4, dtype=torch.bool)
    # sorted [-3, -1, 0, 2]; rank 0.05 * 3 = 0.15 -> lerp(-3, -1, 0.15) = -3 + 0.15 * 2 = -2.7
    for sf in (False, True):
        assert masked_quantile(x, m, 0.05, sync_free=sf).item() == pytest.approx(-2.7)


def test_masked_values_are_ignored_and_empty_is_zero():
    x = torch.tensor([[5.0, -100.0, 1.0], [float("nan"), 3.0, float("inf")]])
    m = torch.tensor([[True, False, True], [False, True, False]])
    # valid [5, 1, 3] -> sorted [1, 3, 5]; q = 0.5: rank 1 -> 3
    for sf in (False, True):
        assert masked_quantile(x, m, 0.5, sync_free=sf).item() == 3.0
        assert masked_quantile(x, torch.zeros_like(m), 0.05, sync_free=sf).item() == 0.0
        assert masked_quantile(x[:, :0], m[:, :0], 0.05, sync_free=sf).item() == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\]"):
        masked_quantile(torch.zeros(3), torch.ones(3, dtype=torch.bool), 1.5)
    with pytest.raises(ValueError, match=r"values has shape \(3,\) but valid has shape \(2,\)"):
        masked_quantile(torch.zeros(3), torch.ones(2, dtype=torch.bool), 0.5)


def test_large_input_and_sparse_mask():
    # far more entries than valid ones: the sync-free bound K comes from numel, not from n
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4096, generator=g)
    m = torch.rand(64, 4096, generator=g) < 0.01
    for q in (0.0, 0.05, 0.5, 1.0):
        want = expected(x, m, q)
        for sf in (False, True):
            assert torch.equal(masked_quantile(x, m, q, sync_free=sf), want), (q, sf)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 300),
    st.floats(0.0, 1.0) | st.just(0.05),
    st.floats(0.0, 1.0),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_property_equals_torch_quantile(b, t, q, keep, ties, seed):
    g = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(b, t, generator=g)
    if ties:  # many equal values (and +-0): order statistics of ties must still match
        x = torch.round(x) * torch.where(torch.rand(b, t, generator=g) < 0.5, -1.0, 1.0)
    m = torch.rand(b, t, generator=g) < keep
    x = torch.where(m, x, torch.full_like(x, float("nan")))  # masked-out values must not matter
    want = expected(x, m, q)
    for sf in (False, True):
        got = masked_quantile(x, m, q, sync_free=sf)
        assert got.shape == () and got.dtype == torch.float32
        assert torch.equal(got, want), (sf, got.item(), want.item())
    n = int(m.sum())
    assert torch.equal(masked_quantile(x, m, q, n=n, sync_free=False), want)


def test_bf16_values_are_read_in_fp32():
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    m = torch.ones(3, 50, dtype=torch.bool)
    for sf in (False, True):
        assert torch.equal(
            masked_quantile(x, m, 0.05, sync_free=sf), torch.quantile(x.float().view(-1), 0.05)
        )

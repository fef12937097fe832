"""Error metrics (report §2.3) on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from minite_kernels.metrics import cosine, mae, rel_l2, snr_db


def test_hand_computed_example():
    ref, x = torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0])
    # error [0, 1]; ||ref|| = 5; ||err|| = 1
    assert rel_l2(ref, x) == pytest.approx(0.2, abs=1e-15)
    assert snr_db(ref, x) == pytest.approx(20 * math.log10(5), abs=1e-12)  # 13.979400...
    assert mae(ref, x) == pytest.approx(0.5, abs=1e-15)
    # <ref, x> = 9 + 20 = 29; ||x|| = sqrt(34)
    assert cosine(ref, x) == pytest.approx(29 / (5 * math.sqrt(34)), abs=1e-15)
    for f in (rel_l2, snr_db, mae, cosine):
        assert isinstance(f(ref, x), float)


def test_second_example_matrix_and_dtypes():
    ref = torch.tensor([[1.0, -2.0], [2.0, 0.0]])  # ||ref|| = 3
    x = torch.tensor([[1.0, -2.0], [0.0, 0.0]], dtype=torch.bfloat16)  # err = [0, 0, -2, 0], ||err|| = 2
    assert rel_l2(ref, x) == pytest.approx(2 / 3)
    assert snr_db(ref, x) == pytest.approx(20 * math.log10(1.5))
    assert mae(ref, x) == pytest.approx(0.5)
    assert cosine(ref, x) == pytest.approx(5 / (3 * math.sqrt(5)))  # <ref,x> = 1 + 4 = 5, ||x|| = sqrt(5)


def test_fp64_accumulation():
    # 1e8 + 1 in fp32 loses the 1; the fp64 metric sees it
    ref = torch.tensor([1e8, 0.0], dtype=torch.float64)
    x = torch.tensor([1e8, 1.0], dtype=torch.float64)
    assert mae(ref, x) == 0.5
    big = torch.full((1_000_000,), 1.0)
    assert rel_l2(big, big + 2.0**-10) == 2.0**-10  # exact in fp64: sqrt(n)·2^-10 / sqrt(n)


def test_edge_conventions():
    z = torch.zeros(4)
    one = torch.ones(4)
    assert rel_l2(one, one) == 0.0 and snr_db(one, one) == math.inf
    assert rel_l2(z, z) == 0.0 and snr_db(z, z) == math.inf and cosine(z, z) == 1.0
    assert rel_l2(z, one) == math.inf and snr_db(z, one) == -math.inf
    assert cosine(z, one) == 0.0 and cosine(one, -one) == pytest.approx(-1.0)
    nan = torch.tensor([float("nan"), 1.0, 1.0, 1.0])
    assert all(math.isnan(f(one, nan)) for f in (rel_l2, snr_db, mae, cosine))


def test_bad_input():
    with pytest.raises(ValueError, match="shapes differ"):
        rel_l2(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="empty"):
        mae(torch.zeros(0), torch.zeros(0))
    with pytest.raises(TypeError, match="two tensors"):
        cosine([1.0], torch.ones(1))

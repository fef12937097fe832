"""Per-row counter streams: range, independence from batch layout, pinned values, the 32-bit arithmetic."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rollout.rng import _mul32, hash32, row_uniforms, seed_word


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_mul32_is_multiplication_mod_2_32(x, c):
    assert int(_mul32(torch.tensor([x]), c)) == (x * c) % 2**32


def test_hash32_matches_python_lowbias32():
    def ref(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) % 2**32
        x ^= x >> 15
        x = (x * 0x846CA68B) % 2**32
        return x ^ (x >> 16)

    xs = [0, 1, 2, 12345, 2**31, 2**32 - 1]
    assert hash32(torch.tensor(xs)).tolist() == [ref(x) for x in xs]


def test_uniforms_in_unit_interval_and_roughly_uniform():
    u = row_uniforms(0, torch.arange(200_000), 7)
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / u.numel()
    torch.testing.assert_close(hist, torch.full((10,), 0.1), atol=0.005, rtol=0)


def test_row_stream_does_not_depend_on_batch_layout():
    full = row_uniforms(5, torch.arange(8), 3)
    assert torch.equal(row_uniforms(5, torch.tensor([6, 2]), 3), full[[6, 2]])
    assert torch.equal(row_uniforms(torch.tensor(seed_word(5)), torch.arange(8), torch.tensor([3])), full)
    assert not torch.equal(row_uniforms(6, torch.arange(8), 3), full)  # another seed
    assert not torch.equal(row_uniforms(5, torch.arange(8), 4), full)  # another step
    assert len(set(full.tolist())) == 8


def test_large_and_negative_seeds_fold_to_32_bits():
    assert 0 <= seed_word(2**40 + 3) < 2**32 and 0 <= seed_word(-1) < 2**32
    assert seed_word(2**40 + 3) != seed_word(3)


def test_pinned_values():
    """The streams are part of a run's reproducibility: changing them changes every resumed run."""
    got = row_uniforms(0, torch.tensor([0, 1]), 0).tolist()
    assert [round(x, 6) for x in got] == [0.223234, 0.300969]

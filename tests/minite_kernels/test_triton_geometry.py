"""Launch geometry of the BF16 per-token quantizer (``backends/triton/quantize.py::_token_geometry``): a row is
held as one or two power-of-two segments that cover its K/16 blocks (the bytes are tested by
``test_triton_interpret.py`` on CPU and ``test_triton_kernels.py`` on the GPU)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
from hypothesis import given, settings
from hypothesis import strategies as st

from minite_kernels.backends.triton.quantize import _token_geometry


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize(
    "k,expected",
    [
        (2048, (1, 128, 0, 2)),  # 128 blocks: one segment, 2 warps of 16 words per thread
        (2560, (1, 128, 32, 2)),  # 160 blocks = 128 + 32 (one 256-block tile would leave 96 lanes idle)
        (6144, (1, 256, 128, 4)),  # 384 = 256 + 128
        (9728, (1, 512, 128, 8)),  # 608 -> 512 + 128 = 640 instead of 1024
        (8192, (1, 512, 0, 8)),
        (112, (16, 8, 0, 2)),  # 7 blocks: 4 + 4 would pad as much as 8, so one segment
        (80, (16, 4, 1, 1)),  # 5 = 4 + 1
    ],
)
def test_learner_shapes(k, expected):
    assert _token_geometry(k // 2, 1024, 16) == expected
    bm, nb, nb2, warps = _token_geometry(k // 2, 1024, 16, split=False)  # qs / deq outputs: one tile
    assert nb2 == 0 and nb == 1 << (k // 16 - 1).bit_length()


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 2048),
    st.sampled_from([1024, 2048, 4096, 8192]),
    st.sampled_from([8, 16, 32, 64]),
)
def test_segments_cover_the_row_with_less_padding(nbk, program_words, words_per_thread):
    bm, nb, nb2, warps = _token_geometry(nbk * 8, program_words, words_per_thread)
    assert _pow2(bm) and bm <= 16 and _pow2(nb) and 1 <= warps <= 16
    one_tile = 1 << (nbk - 1).bit_length()  # what a single tile pads the row to
    if nb2:  # segment 1 is whole, and the two pad less than one tile
        assert _pow2(nb2) and nb < nbk <= nb + nb2 < one_tile
    else:
        assert nb == one_tile

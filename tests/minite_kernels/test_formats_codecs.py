"""Low-level codecs: E2M1 (RNE ties, packing), E4M3 saturating cast, E8M0 RCEIL (notes §1.1, §1.2, §7)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite_kernels.formats import (
    E2M1_VALUES,
    e2m1_decode,
    e2m1_encode,
    e4m3_cast,
    e4m3_decode,
    e4m3_table,
    e8m0_decode,
    e8m0_encode_rceil,
    e8m0_inverse,
    pack_nibbles,
    unpack_nibbles,
)

GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def scalar_e2m1_code(v: float) -> int:
    """Nearest grid value; on a tie the even code (even mantissa) wins. Written independently of thresholds."""
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda c: (abs(GRID[c] - a), c % 2))
    return best | (8 if v < 0 else 0)


def scalar_e4m3(v: float) -> float:
    """RNE to E4M3 of 0 <= v <= 448 via frexp: quantum 2^(e-3), subnormal quantum 2^-9."""
    if v == 0:
        return 0.0
    _, e = math.frexp(v)  # v in [2^(e-1), 2^e)
    exp = max(e - 1, -6)
    q = 2.0 ** (exp - 3)
    return round(v / q) * q  # Python's round() on a float is round-half-even


# ---------------------------------------------------------------- E2M1
def test_e2m1_tie_table_from_notes():
    # notes §1.1: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 (values); codes 0,2,2,4,4,6,6
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_encode(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert e2m1_encode(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14]


def test_e2m1_interval_interiors_and_saturation():
    v = torch.tensor([0.2, 0.26, 0.74, 1.3, 1.74, 2.6, 3.4, 3.6, 5.01, 6.0, 7.5, float("inf"), -float("inf")])
    assert e2m1_encode(v).tolist() == [0, 1, 1, 3, 3, 5, 5, 6, 7, 7, 7, 7, 15]


def test_e2m1_signed_zero_rule():
    # -0.0 encodes to code 0 (TE reference: -0.0 >= 0); a negative value rounding to zero gets code 8.
    assert e2m1_encode(torch.tensor([-0.0, 0.0, -0.1, -0.25])).tolist() == [0, 0, 8, 8]


def test_e2m1_decode_table():
    codes = torch.arange(16, dtype=torch.uint8)
    dec = e2m1_decode(codes)
    assert dec.tolist() == list(E2M1_VALUES)
    assert torch.signbit(dec[8]) and not torch.signbit(dec[0])
    # every grid value encodes to its own code
    assert torch.equal(
        e2m1_encode(dec), torch.tensor([c if c != 8 else 0 for c in range(16)], dtype=torch.uint8)
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-8, max_value=8, width=32), min_size=1, max_size=64))
def test_e2m1_encode_matches_scalar_nearest_even(values):
    got = e2m1_encode(torch.tensor(values, dtype=torch.float32)).tolist()
    assert got == [scalar_e2m1_code(v) for v in values]


def test_pack_low_nibble_first_and_roundtrip():
    codes = torch.tensor([[0, 8, 1, 1, 2, 10, 4, 4]], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [[0x80, 0x11, 0xA2, 0x44]]
    rnd = torch.randint(0, 16, (5, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_nibbles(pack_nibbles(rnd)), rnd)
    with pytest.raises(ValueError, match="even"):
        pack_nibbles(torch.zeros(3, dtype=torch.uint8))


# ---------------------------------------------------------------- E4M3
def test_e4m3_saturating_cast_values_from_notes():
    v = torch.tensor([449.0, 500.0, 1e30, float("inf"), -500.0, 272.0, 304.0, 2**-10, 1.5 * 2**-9, 282.24])
    got = e4m3_decode(e4m3_cast(v)).tolist()
    assert got == [448.0, 448.0, 448.0, 448.0, -448.0, 256.0, 320.0, 0.0, 2**-8, 288.0]
    assert e4m3_cast(torch.tensor([282.24])).view(torch.uint8).item() == 0x79
    assert math.isnan(e4m3_decode(e4m3_cast(torch.tensor([float("nan")]))).item())


def test_e4m3_table_landmarks():
    t = e4m3_table()
    assert t[0x7E].item() == 448.0 and t[0x79].item() == 288.0 and t[0x01].item() == 2**-9
    assert t[0x08].item() == 2**-6 and t[0x38].item() == 1.0
    assert math.isnan(t[0x7F].item()) and math.isnan(t[0xFF].item())
    assert e4m3_decode(torch.tensor([0x79], dtype=torch.uint8)).item() == 288.0


def test_e4m3_cast_matches_scalar_rne_on_random_values():
    g = torch.Generator().manual_seed(1)
    v = torch.exp2(torch.empty(4000).uniform_(-12, 9.2, generator=g)).float()  # subnormal .. > 448
    v = torch.cat([v, torch.arange(0, 449, 0.125)])  # many exact ties
    got = e4m3_decode(e4m3_cast(v)).tolist()
    want = [scalar_e4m3(min(x, 448.0)) for x in v.tolist()]
    assert got == want


# ---------------------------------------------------------------- E8M0
def test_e8m0_worked_values_from_notes():
    amax = torch.tensor([5.0, 448.0, 448.5, 1.0, 0.001, 0.0])
    b = e8m0_encode_rceil(amax * torch.tensor(1.0 / 448.0))
    assert b.tolist() == [121, 127, 128, 119, 109, 0]
    assert e8m0_decode(b).tolist() == [2.0**-6, 1.0, 2.0, 2.0**-8, 2.0**-18, 2.0**-127]


def test_e8m0_specials_and_subnormals():
    v = torch.tensor(
        [float("nan"), float("inf"), 2.0**-127, 2.0**-127 * 1.5, 2.0**-130, 2.0**127, 2.0**127 * 1.5]
    )
    assert e8m0_encode_rceil(v).tolist() == [255, 254, 0, 1, 0, 254, 254]
    assert math.isnan(e8m0_decode(torch.tensor([255], dtype=torch.uint8)).item())
    assert e8m0_inverse(torch.tensor([254, 127, 0], dtype=torch.uint8)).tolist() == [2.0**-127, 1.0, 2.0**127]


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=2.0**-126, max_value=2.0**126, width=32))
def test_e8m0_rounds_up_to_the_next_power_of_two(v):
    b = int(e8m0_encode_rceil(torch.tensor([v])).item())
    # smallest power of two >= v
    assert 2.0 ** (b - 127) >= v > 2.0 ** (b - 128)

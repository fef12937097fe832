from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triage import TriageConfig, gate_weights
from triage.gate import segment_weights

C4 = TriageConfig(gate_segment_len=4)  # 4-token segments keep the hand arithmetic short


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def ones_mask(x):
    return torch.ones_like(x, dtype=torch.bool)


@pytest.mark.parametrize(
    ("delta", "w"),
    [
        ([-3.0, -1.0, -2.0, -0.04], 0.1),  # mu = -6.04 / 4 = -1.51 < -1.5                -> 0.1
        ([-3.0, -1.0, -1.0, -1.0], 0.3),  # mu = -6 / 4 = -1.5 (boundary, in [-1.5, -0.5)) -> 0.3
        ([-1.0, -1.0, -0.04, 0.0], 0.3),  # mu = -2.04 / 4 = -0.51 < -0.5                  -> 0.3
        ([-1.0, -0.5, -0.5, 0.0], 1.0),  # mu = -2 / 4 = -0.5 (boundary, not < -0.5)      -> 1.0
        ([-0.2, -0.2, -0.2, -0.2], 1.0),  # mu = -0.2                                      -> 1.0
    ],
)
def test_mean_tiers_and_boundaries(delta, w):
    d = t([delta])
    g = gate_weights(d, torch.tensor([-1.0]), ones_mask(d), C4)
    # every token with delta < 0 gets w; a zero-gap token (delta = 0) keeps 1
    expected = [w if x < 0 else 1.0 for x in delta]
    torch.testing.assert_close(g, t([expected]), rtol=0, atol=0)


def test_tail_weight_k0_to_k3():
    # segment_weights with mu = +1 (mean tier 1.0): w_tail = 1 - 0.9 * min(k / 2, 1)
    # k = 0 -> 1.0; k = 1 -> 1 - 0.45 = 0.55; k = 2 -> 0.1; k = 3 -> 0.1
    w = segment_weights(torch.ones(4), torch.tensor([0.0, 1.0, 2.0, 3.0]), TriageConfig())
    torch.testing.assert_close(w, t([1.0, 0.55, 0.1, 0.1]))
    # the same through gate_weights, 8-token segments, filler +5 keeps mu >= -0.5:
    c8 = TriageConfig(gate_segment_len=8)
    rows = [
        [-1.0] + [5.0] * 7,  # k = 0 (-1 is not < -6): mu = 34/8 -> w = 1.0
        [-7.0] + [5.0] * 7,  # k = 1: mu = 28/8 = 3.5 -> w = 0.55
        [-7.0] * 2 + [5.0] * 6,  # k = 2: mu = 16/8 = 2 -> w = 0.1
        [-7.0] * 3 + [5.0] * 5,  # k = 3: mu = 4/8 = 0.5 -> w = 0.1
    ]
    d = t(rows)
    g = gate_weights(d, -torch.ones(4), ones_mask(d), c8)
    torch.testing.assert_close(g[:, 0], t([1.0, 0.55, 0.1, 0.1]))
    assert torch.all(g[:, 3:] == 1.0)  # positive-gap tokens are never gated
    # delta == -6 exactly is not below the threshold: k = 0
    d6 = t([[-6.0] + [5.0] * 7])
    assert gate_weights(d6, -torch.ones(1), ones_mask(d6), c8)[0, 0] == 1.0


def test_min_rule_mean_tier_wins():
    # delta = [-7, 1, 1, 1]: mu = (-7 + 3) / 4 = -1 -> w_mean 0.3; k = 1 -> w_tail 0.55; min = 0.3
    d = t([[-7.0, 1.0, 1.0, 1.0]])
    g = gate_weights(d, torch.tensor([-1.0]), ones_mask(d), C4)
    torch.testing.assert_close(g, t([[0.3, 1.0, 1.0, 1.0]]))


def test_min_rule_tail_wins_and_mean_wins():
    d = t(
        [
            [-7.0, 3.0, 3.0, 1.0],  # mu = 0 -> w_mean 1.0; k = 1 -> w_tail 0.55; min = 0.55
            [-7.0, -1.0, 0.0, 0.0],  # mu = -8/4 = -2 -> w_mean 0.1; k = 1 -> 0.55; min = 0.1
        ]
    )
    g = gate_weights(d, -torch.ones(2), ones_mask(d), C4)
    torch.testing.assert_close(g, t([[0.55, 1.0, 1.0, 1.0], [0.1, 0.1, 1.0, 1.0]]))


def test_sign_conditions():
    # one segment with mu = (-2 - 2 - 2 + 0) / 4 = -1.5 -> w_seg = 0.3
    row = [-2.0, -2.0, -2.0, 0.0]
    d = t([row, row, row])
    adv = torch.tensor([1.0, 0.0, -1.0])  # A > 0, A = 0, A < 0
    g = gate_weights(d, adv, ones_mask(d), C4)
    # only A < 0 and delta < 0 is attenuated; gap = 0 counts as non-negative
    torch.testing.assert_close(g, t([[1, 1, 1, 1], [1, 1, 1, 1], [0.3, 0.3, 0.3, 1.0]]))
    # [B, T] advantages are read per token
    g2 = gate_weights(d[2:], adv[2:].expand(1, 4), ones_mask(d[2:]), C4)
    torch.testing.assert_close(g2, g[2:])


def test_partial_last_segment_and_masked_tokens():
    # T = 6, L = 4: segment 0 = t 0..3, segment 1 = t 4..5 (partial)
    d = t([[0.0, 0.0, 0.0, -1.0, -2.0, -1.0]])
    m = torch.tensor([[True, True, True, True, True, True]])
    g = gate_weights(d, torch.tensor([-1.0]), m, C4)
    # seg 0: mu = -1/4 = -0.25 -> 1.0; seg 1: mu = -3/2 = -1.5 -> 0.3 (mean over its 2 tokens only)
    torch.testing.assert_close(g, t([[1, 1, 1, 1, 0.3, 0.3]]))
    # mask t = 4: seg 1 has n = 1, mu = -1 -> 0.3 for t = 5; the masked token keeps 1
    m2 = torch.tensor([[True, True, True, True, False, True]])
    torch.testing.assert_close(gate_weights(d, torch.tensor([-1.0]), m2, C4), t([[1, 1, 1, 1, 1, 0.3]]))
    # masked values do not enter the mean: a -100 under the mask changes nothing
    d3 = d.clone()
    d3[0, 4] = -100.0
    torch.testing.assert_close(gate_weights(d3, torch.tensor([-1.0]), m2, C4), t([[1, 1, 1, 1, 1, 0.3]]))


def test_rows_without_valid_tokens_and_all_masked():
    d = t([[-9.0, -9.0, -9.0, -9.0], [-9.0, -9.0, -9.0, -9.0]])
    m = torch.tensor([[False] * 4, [True] * 4])
    g = gate_weights(d, -torch.ones(2), m, C4)
    # row 0: no valid token -> all 1; row 1: mu = -9 -> 0.1, k = 4 -> 0.1
    torch.testing.assert_close(g, t([[1, 1, 1, 1], [0.1, 0.1, 0.1, 0.1]]))
    assert torch.all(gate_weights(d, -torch.ones(2), torch.zeros_like(m), C4) == 1.0)


def test_default_64_token_segments():
    # T = 130: segments [0, 64), [64, 128), [128, 130)
    d = torch.zeros(1, 130)
    d[0, 64:128] = -1.0  # segment 1: mu = -1 -> 0.3
    d[0, 128:] = -2.0  # segment 2 (2 tokens): mu = -2 -> 0.1
    g = gate_weights(d, torch.tensor([-1.0]), torch.ones(1, 130, dtype=torch.bool))
    assert torch.all(g[0, :64] == 1.0)
    assert torch.allclose(g[0, 64:128], torch.full((64,), 0.3))
    assert torch.allclose(g[0, 128:], torch.full((2,), 0.1))


def test_gate_switch_off_and_detached_and_dtype():
    d = t([[-3.0, -3.0, -3.0, -3.0]]).to(torch.bfloat16).requires_grad_()
    g = gate_weights(d, torch.tensor([-1.0]), ones_mask(d))
    assert g.dtype == torch.float32 and not g.requires_grad
    assert torch.all(gate_weights(d, torch.tensor([-1.0]), ones_mask(d), TriageConfig(gate=False)) == 1.0)


def test_nonfinite_delta_is_masked():
    d = t([[float("nan"), -2.0, -2.0, float("-inf")]])
    g = gate_weights(d, torch.tensor([-1.0]), ones_mask(d), C4)
    # the two finite tokens form the segment: mu = -2 -> 0.1; non-finite tokens are invalid -> 1
    torch.testing.assert_close(g, t([[1.0, 0.1, 0.1, 1.0]]))


def test_shape_mismatch_names_both_shapes():
    d = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 5\)"):
        gate_weights(d, torch.zeros(2), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(3,\).*\(2, 5\)"):
        gate_weights(d, torch.zeros(3), torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="floating"):
        gate_weights(torch.zeros(2, 5, dtype=torch.int64), torch.zeros(2), torch.ones(2, 5))


ALLOWED = {0.1, 0.3, 1.0, 0.55}  # tiers, and tail values 1 - 0.9 * min(k/2, 1) for k = 0, 1, >= 2


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 150),
    st.integers(0, 2**31 - 1),
)
def test_property_gate_weights_in_allowed_set(b, tt, seed):
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(b, tt, generator=gen) * 4.0
    adv = torch.randn(b, generator=gen)
    m = torch.rand(b, tt, generator=gen) > 0.3
    g = gate_weights(d, adv, m)
    values = {round(v, 6) for v in g.unique().tolist()}
    assert values <= {round(v, 6) for v in ALLOWED}

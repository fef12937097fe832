from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triage import TriageConfig, mismatch_metrics
from triage.diagnostics import MISMATCH_KEYS, quantile_linear


def test_worked_example():
    delta = torch.tensor([[-1.0, 0.0, 2.0, -3.0]])
    adv = torch.tensor([[1.0, 1.0, -2.0, -2.0]])
    m = mismatch_metrics(delta, adv, torch.ones(1, 4, dtype=torch.bool), TriageConfig(gate_segment_len=4))
    assert set(MISMATCH_KEYS) | {"triage/nonfinite_tokens"} == set(m)
    assert all(isinstance(v, float) for v in m.values())
    assert m["mismatch/abs_gap_mean"] == pytest.approx(1.5)  # (1 + 0 + 2 + 3) / 4
    assert m["mismatch/gap_mean"] == pytest.approx(-0.5)  # (-1 + 0 + 2 - 3) / 4
    # sorted [-3, -1, 0, 2]; position 0.05 * 3 = 0.15 -> -3 + 0.15 * 2 = -2.7
    assert m["mismatch/gap_q05"] == pytest.approx(-2.7)
    assert m["mismatch/neg_tail_depth"] == pytest.approx(2.7)
    k3 = [math.exp(x) - 1 - x for x in (-1.0, 0.0, 2.0, -3.0)]
    assert m["mismatch/k3_kl"] == pytest.approx(sum(k3) / 4, rel=1e-6)
    # sum |A| = 6: (A>0, d<0) = 1; (A>0, d>=0) = 1 (d = 0 counts as >= 0); (A<0, d<0) = 2; (A<0, d>=0) = 2
    assert m["mismatch/share/pos_adv_neg_gap"] == pytest.approx(1 / 6)
    assert m["mismatch/share/pos_adv_pos_gap"] == pytest.approx(1 / 6)
    assert m["mismatch/share/neg_adv_neg_gap"] == pytest.approx(2 / 6)
    assert m["mismatch/share/neg_adv_pos_gap"] == pytest.approx(2 / 6)
    # one 4-token segment: mu = -0.5 -> w_mean 1.0, k = 0 -> not gated; nothing tail-dense
    assert m["triage/gated_token_frac"] == 0.0 and m["triage/gated_segment_frac"] == 0.0
    assert m["triage/mean_gate_weight"] == 1.0 and m["triage/tail_dense_segment_frac"] == 0.0
    # TIS weights: exp(-1), 1, min(e^2, 2) = 2 (clipped), exp(-3)
    assert m["tis/clip_frac"] == pytest.approx(0.25)
    assert m["tis/weight_mean"] == pytest.approx((math.exp(-1) + 1 + 2 + math.exp(-3)) / 4, rel=1e-6)


def test_segment_fractions():
    cfg = TriageConfig(gate_segment_len=2)
    # segments: [-7, -7] (k = 2, tail dense, gated 0.1), [-1, 1] (mu = 0, not gated), [pad, masked]
    delta = torch.tensor([[-7.0, -7.0, -1.0, 1.0, 0.0, 0.0]])
    m = torch.tensor([[True, True, True, True, False, False]])
    out = mismatch_metrics(delta, torch.tensor([-1.0]), m, cfg)
    assert out["triage/tail_dense_segment_frac"] == pytest.approx(0.5)  # 1 of 2 non-empty segments
    assert out["triage/gated_segment_frac"] == pytest.approx(0.5)
    assert out["triage/gated_token_frac"] == pytest.approx(0.5)  # 2 of 4 valid tokens
    assert out["triage/mean_gate_weight"] == pytest.approx((0.1 + 0.1 + 1 + 1) / 4)
    # gate off: nothing gated, but tail density is still reported
    off = mismatch_metrics(delta, torch.tensor([-1.0]), m, TriageConfig(gate_segment_len=2, gate=False))
    assert off["triage/gated_token_frac"] == 0.0 and off["triage/tail_dense_segment_frac"] == pytest.approx(
        0.5
    )


def test_empty_and_nonfinite():
    out = mismatch_metrics(torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))
    assert all(v == 0.0 for v in out.values())
    d = torch.tensor([[float("nan"), -1.0, float("inf")]])
    out = mismatch_metrics(d, torch.ones(1), torch.ones(1, 3, dtype=torch.bool))
    assert out["triage/nonfinite_tokens"] == 2.0
    assert out["mismatch/gap_mean"] == pytest.approx(-1.0)
    assert all(math.isfinite(v) for v in out.values())


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 400), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_quantile_matches_torch(n, q, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(quantile_linear(x, q), torch.quantile(x, q))

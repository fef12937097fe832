"""The fused fast path (triage.loss / triage.fused) against the plain-autograd reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triage_cases import CONFIGS, inputs

from triage import TriageConfig, triage_policy_loss
from triage.reference import triage_policy_loss_reference


def compare(cfg, logp0, old, sampler, adv, mask, rtol=1e-5):
    a = logp0.clone().requires_grad_()
    la, ma = triage_policy_loss(a, old, sampler, adv, mask, cfg)
    la.backward()
    b = logp0.clone().requires_grad_()
    lb, mb = triage_policy_loss_reference(b, old, sampler, adv, mask, cfg)
    lb.backward()
    torch.testing.assert_close(la, lb, rtol=rtol, atol=1e-6)
    # bf16 gradients: both are fp32 values rounded to bf16, so they may differ by one bf16 ulp (2^-8)
    grad_rtol = 8e-3 if logp0.dtype == torch.bfloat16 else rtol
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=grad_rtol, atol=1e-7)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("adv_2d", [False, True])
def test_fused_matches_reference(cfg, adv_2d):
    compare(cfg, *inputs(0, 7, 301, adv_2d=adv_2d))


def test_fused_matches_reference_nonfinite_and_bf16():
    compare(TriageConfig(), *inputs(1, 5, 200, nonfinite=True))
    compare(TriageConfig(), *inputs(2, 4, 256, dtype=torch.bfloat16))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 5),
    st.integers(1, 300),
    st.floats(0.01, 8.0),
    st.booleans(),
    st.sampled_from(range(len(CONFIGS))),
)
def test_property_fused_matches_reference(seed, b, t, scale, adv_2d, ci):
    compare(CONFIGS[ci], *inputs(seed, b, t, scale, adv_2d))


# --- the GPU path (no host read-back until the final .tolist()), exercised on the CPU ---------------------


def _run(cfg, logp0, old, sampler, adv, mask):
    lg = logp0.clone().requires_grad_()
    loss, metrics = triage_policy_loss(lg, old, sampler, adv, mask, cfg)
    loss.backward()
    return loss.detach(), lg.grad, metrics


def _all_masked():
    logp, old, sampler, adv, mask = inputs(4, 3, 70)
    return logp, old, sampler, adv, torch.zeros_like(mask)


CASES = [
    lambda: inputs(0, 7, 301),
    lambda: inputs(0, 7, 301, adv_2d=True),
    lambda: inputs(1, 5, 200, nonfinite=True),
    lambda: inputs(2, 4, 256, dtype=torch.bfloat16),
    _all_masked,
]


@pytest.mark.parametrize("ci", range(len(CASES)))
@pytest.mark.parametrize("cfg", CONFIGS)
def test_sync_free_path_equals_host_path_exactly(cfg, ci, monkeypatch):
    host = _run(cfg, *CASES[ci]())
    import triage.fused
    import triage.quantile

    monkeypatch.setattr(triage.fused, "avoid_host_sync", lambda device: True)
    monkeypatch.setattr(triage.quantile, "avoid_host_sync", lambda device: True)
    free = _run(cfg, *CASES[ci]())
    assert torch.equal(host[0], free[0]) and torch.equal(host[1], free[1])
    assert host[2] == free[2]  # every metric, exactly


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize(
    "cfg", [TriageConfig(), TriageConfig(gate=False, tis=False), TriageConfig(diagnostics=False)]
)
def test_one_host_read_back_per_call(cfg, nonfinite, force_sync_free, read_backs, monkeypatch):
    logp0, old, sampler, adv, mask = inputs(5, 6, 333, nonfinite=nonfinite)
    lg = logp0.clone().requires_grad_()
    counter = read_backs()
    loss, metrics = triage_policy_loss(lg, old, sampler, adv, mask, cfg)
    loss.backward()
    calls = list(counter.calls)
    monkeypatch.undo()
    assert calls == ["tolist"], calls
    assert all(isinstance(v, float) for v in metrics.values())


def test_read_back_counter_sees_the_cpu_path_reads(read_backs, monkeypatch):
    # the CPU path reads the finiteness check and the token count back mid-pass: the counter must see it
    logp0, old, sampler, adv, mask = inputs(5, 6, 333, nonfinite=True)
    counter = read_backs()
    triage_policy_loss(logp0.clone().requires_grad_(), old, sampler, adv, mask)
    calls = list(counter.calls)
    monkeypatch.undo()
    # finiteness check + count, the count of finite tokens (slow path), the final metrics
    assert calls == ["tolist", "__int__", "tolist"], calls


def test_mismatch_metrics_one_host_read_back(force_sync_free, read_backs, monkeypatch):
    from triage import mismatch_metrics

    _, old, sampler, adv, mask = inputs(6, 4, 129, nonfinite=True)
    delta = old - sampler
    free = mismatch_metrics(delta, adv, mask)
    monkeypatch.undo()
    assert free == mismatch_metrics(delta, adv, mask)  # CPU path (count read on the host): same floats
    import triage.quantile

    monkeypatch.setattr(triage.quantile, "avoid_host_sync", lambda device: True)
    counter = read_backs()
    mismatch_metrics(delta, adv, mask)
    calls = list(counter.calls)
    monkeypatch.undo()
    assert calls == ["tolist"], calls


def test_gate_grad_shift_hand_computed():
    from triage.fused import gate_grad_shift

    # 4 tokens, 2 gated at g = 0.5: weights [1/6, 1/6, 1/3, 1/3] vs [1/4] * 4 -> TV = 1/2 * 4/12 = 1/6
    half = gate_grad_shift(torch.tensor([[2]], dtype=torch.int32), torch.tensor([[0.5]]), torch.tensor([3.0]),
                           torch.tensor([4], dtype=torch.int32))
    assert half.item() == pytest.approx(1 / 6)
    # every token gated alike: the response normalisation gives the gradient back -> 0
    alike = gate_grad_shift(torch.tensor([[4]], dtype=torch.int32), torch.tensor([[0.5]]), torch.tensor([2.0]),
                            torch.tensor([4], dtype=torch.int32))
    assert alike.item() == pytest.approx(0.0, abs=1e-7)
    # an empty response does not count: mean over the one non-empty response
    two = gate_grad_shift(torch.tensor([[2], [0]], dtype=torch.int32), torch.tensor([[0.5], [1.0]]),
                          torch.tensor([3.0, 0.0]), torch.tensor([4, 0], dtype=torch.int32))
    assert two.item() == pytest.approx(1 / 6)

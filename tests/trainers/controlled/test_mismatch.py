"""The injected mismatches have the structure they claim: the gap's sign where theory fixes it, zero where there
is no mismatch, bursts confined to their 64-token windows, and sampling that follows the sampler's distribution."""
from __future__ import annotations

import pytest
import torch

from trainers.controlled.config import MismatchConfig
from trainers.controlled.mismatch import ON_POLICY, Mismatch, draw, sample, sampler_table
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.task import ChainTask
from triage.tis import tis_weights

TASK = ChainTask(8, 128)
X = TASK.features()


@pytest.fixture(scope="module")
def policy():
    """A peaked, non-uniform policy: the init with its output layer scaled up (logits of a few nats)."""
    pol = EnsembleMLP.init([0, 1], 8, 32, base_seed=0)
    with torch.no_grad():
        pol.params["w3"].mul_(8.0)
    return pol


def _batch(policy, mismatch, seeds=(0, 1)):
    d = draw(TASK, list(seeds), 4, 8, mismatch, 0, "test", 0)
    table = sampler_table(policy, X, mismatch)
    tokens, logq = sample(TASK, table, d, mismatch)
    states = TASK.state_index(tokens, d.start, d.stride)
    learner = policy.logp_table(X).detach()
    logp = learner.reshape(len(seeds), -1).gather(1, (states * 8 + tokens).view(len(seeds), -1)).view_as(logq)
    return d, tokens, states, logq, logp


def test_no_mismatch_is_the_learner_bit_for_bit(policy):
    _, tokens, _, logq, logp = _batch(policy, ON_POLICY)
    assert torch.equal(logq, logp)
    # the same prompts and uniforms under a mismatch of size 0 draw the same tokens
    _, tokens0, _, logq0, logp0 = _batch(policy, Mismatch(kind="noise", noise_sigma=0.0))
    assert torch.equal(tokens0, tokens)
    torch.testing.assert_close(logq0, logp0)


@pytest.mark.parametrize("kind", ["noise", "temperature", "burst", "nvfp4"])
def test_sampled_gap_is_negative_on_average(policy, kind):
    """E_q[log pi - log q] = -KL(q || pi) <= 0: the sampled tokens' mean gap is negative for every kind."""
    _, _, _, logq, logp = _batch(policy, Mismatch.of(kind, MismatchConfig()))
    delta = logp - logq
    assert delta.abs().mean() > 1e-3
    assert delta.mean() < 0


@pytest.mark.parametrize("tau", [0.7, 1.5])
def test_temperature_gap_has_the_predicted_sign(policy, tau):
    """delta(y) = (1 - 1/tau) * z_y + c(state): on the sampled tokens the residual is one constant per state, so
    with tau > 1 the learner's likelier token of a state has the larger gap (its most likely token delta > 0,
    the least likely delta < 0); with tau < 1 the reverse."""
    _, tokens, states, logq, logp = _batch(policy, Mismatch.of("temperature", MismatchConfig(), tau))
    delta = (logp - logq).flatten()
    z = policy.logits(X).detach().reshape(-1)
    flat_state = (states + torch.arange(2).view(2, 1, 1) * TASK.states).flatten()
    resid = delta - (1 - 1 / tau) * z[flat_state * 8 + tokens.flatten()]
    per_state = torch.zeros(2 * TASK.states).scatter_reduce(0, flat_state, resid, "amax", include_self=False)
    torch.testing.assert_close(resid, per_state[flat_state], atol=2e-5, rtol=0)
    learner = policy.logp_table(X).detach()
    sampler = sampler_table(policy, X, Mismatch.of("temperature", MismatchConfig(), tau))
    gap = learner - sampler  # every token of every state
    top, bottom = learner.argmax(-1, keepdim=True), learner.argmin(-1, keepdim=True)
    assert bool((gap.gather(-1, top) > 0).all()) == (tau > 1)
    assert bool((gap.gather(-1, bottom) < 0).all()) == (tau > 1)
    assert bool((gap.gather(-1, top) < 0).all()) == (tau < 1)


def test_bursts_stay_in_their_windows_and_tis_weights_are_one_elsewhere(policy):
    m = Mismatch.of("burst", MismatchConfig(burst_prob=0.25))
    d, _, _, logq, logp = _batch(policy, m)
    delta = logp - logq
    assert d.burst.any() and (~d.burst).any()
    windows = d.burst.view(2, 32, 2, 64)
    assert torch.equal(windows, windows[..., :1].expand_as(windows))  # whole 64-token windows
    assert torch.equal(delta[~d.burst], torch.zeros_like(delta[~d.burst]))
    assert torch.equal(tis_weights(delta, 2.0)[~d.burst], torch.ones_like(delta[~d.burst]))
    assert delta[d.burst].mean() < -1.0  # deep negative gaps inside


def test_inverse_cdf_sampling_follows_the_sampler_distribution():
    table = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(1, 16, 4).contiguous()
    task = ChainTask(4, 4000)
    d = draw(task, [0], 1, 2, ON_POLICY, 0, "cdf", 0)
    tokens, logq = sample(task, table, d, ON_POLICY)
    freq = torch.bincount(tokens.flatten(), minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.015, rtol=0)
    torch.testing.assert_close(logq, table[0, 0][tokens])

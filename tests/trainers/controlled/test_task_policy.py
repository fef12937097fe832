"""The chain task's reward and exact expected reward, and the ensemble policy: table lookup = per-token forward,
members independent, NVFP4 logits through the project's own quantizer."""
from __future__ import annotations

import math

import pytest
import torch

from minite_kernels.formats.nvfp4 import quantize_nvfp4
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.rng import generator
from trainers.controlled.task import ChainTask


def test_worked_example():
    task = ChainTask(4, 4)
    tokens, start, stride = torch.tensor([[3, 1, 0, 2]]), torch.tensor([1]), torch.tensor([2])
    assert task.reward(tokens, start, stride).tolist() == [0.75]
    assert task.state_index(tokens, start, stride).tolist() == [[6, 14, 6, 2]]


def test_expected_reward_exact_cases_and_monte_carlo():
    task = ChainTask(4, 16)
    uniform = torch.full((1, task.states, 4), -math.log(4))
    assert task.expected_reward(uniform).item() == pytest.approx(0.25, abs=1e-7)
    v = torch.arange(task.states)
    perfect = torch.full((1, task.states, 4), -30.0)
    perfect[0, v, (v // 4 + v % 4) % 4] = 0.0
    assert task.expected_reward(perfect.log_softmax(-1)).item() == pytest.approx(1.0, abs=1e-6)
    # a random policy: the exact value against 20,000 sampled responses
    logp = torch.randn(1, task.states, 4, generator=generator(0, "t", 0)).mul(2).log_softmax(-1)
    g = generator(0, "mc", 0)
    n = 20_000
    start, stride = task.draw_prompts(n, g)
    prev, hits = start, torch.zeros(n)
    for _ in range(task.length):
        tok = torch.multinomial(logp[0, prev * 4 + stride].exp(), 1, generator=g).squeeze(1)
        hits += (tok == (prev + stride) % 4).float()
        prev = tok
    mc = hits / task.length
    exact = task.expected_reward(logp).item()
    assert abs(mc.mean().item() - exact) < 4 * mc.std().item() / math.sqrt(n)


def _mlp(p, s, x):
    h = torch.tanh(x @ p["w1"][s].T + p["b1"][s])
    h = torch.tanh(h @ p["w2"][s].T + p["b2"][s])
    return h @ p["w3"][s].T + p["b3"][s]


def test_table_equals_the_network_run_on_every_token_and_members_are_independent():
    task = ChainTask(8, 32)
    x = task.features()
    pol = EnsembleMLP.init([3, 5], 8, 16, base_seed=0)
    assert pol.num_params() == 16 * 16 + 16 + 16 * 16 + 16 + 16 * 8 + 8
    states = torch.randint(0, task.states, (2, 50))
    tokens = torch.randint(0, 8, (2, 50))
    table = pol.logp_table(x)
    gathered = table.reshape(2, -1).gather(1, states * 8 + tokens)
    direct = torch.stack([_mlp(pol.params, s, x[states[s]]).log_softmax(-1).gather(1, tokens[s, :, None])[:, 0]
                          for s in range(2)])
    torch.testing.assert_close(gathered, direct)
    # seed 5 starts from the same parameters with or without seed 3 beside it
    alone = EnsembleMLP.init([5], 8, 16, base_seed=0)
    assert all(torch.equal(alone.params[n][0], pol.params[n][1]) for n in alone.params)
    # the gradient of the summed losses w.r.t. member 1 is member 1's own gradient
    (gathered * torch.tensor([[1.0], [2.0]])).sum().backward()
    g_both = pol.flat_grads()
    alone_table = alone.logp_table(x).reshape(1, -1).gather(1, states[1:] * 8 + tokens[1:])
    (2.0 * alone_table).sum().backward()
    torch.testing.assert_close(g_both[1], alone.flat_grads()[0])


def test_nvfp4_logits_are_the_reference_quantizer_per_recipe():
    task = ChainTask(8, 8)
    x = task.features()
    pol = EnsembleMLP.init([0], 8, 32, base_seed=1)
    got = pol.nvfp4_logits(x, "nvfp4_per_token_w1x16_bf16_bwd")
    p = {n: t[0].detach() for n, t in pol.params.items()}

    def lin(a, w, b):  # activations per token, weights per tensor, 1x16 blocks: the recipe's forward GEMM
        return (quantize_nvfp4(a, scaling="per_token").dequantize() @ quantize_nvfp4(w).dequantize().T) + b

    h = torch.tanh(lin(x, p["w1"], p["b1"]))
    h = torch.tanh(lin(h, p["w2"], p["b2"]))
    torch.testing.assert_close(got[0], lin(h, p["w3"], p["b3"]))
    fp32 = pol.logits(x).detach()
    assert not torch.equal(got, fp32) and (got - fp32).abs().max() < 0.5
    head_fp32 = pol.nvfp4_logits(x, "nvfp4_per_token_w1x16_bf16_bwd", head=False)
    assert not torch.equal(head_fp32, got)

"""Sampler: processed log-probs, truncation, stop tokens, determinism, left padding."""
from __future__ import annotations

import math

import pytest
import torch

from rollout.local import LocalSampler, SamplingParams
from rollout.rng import row_uniforms
from rollout.sampling import inverse_cdf_sample, process_logits, sample_tokens


def test_process_logits_hand_computed():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    # T=2: z = [1, 0.5, 0]; logsumexp = log(e + e^0.5 + 1) = log(5.3670) = 1.6802 -> logp = z - 1.6802
    lp = torch.log_softmax(process_logits(logits, 2.0), -1)
    torch.testing.assert_close(lp, torch.tensor([[-0.6802, -1.1802, -1.6802]]), atol=1e-4, rtol=0)
    # top_k=1 keeps only the argmax
    assert torch.isinf(process_logits(logits, 1.0, top_k=1)[0, 1:]).all()
    # softmax([2,1,0]) = [0.665, 0.245, 0.090]: top_p=0.7 keeps the first two (mass before #2 is 0.665 < 0.7)
    z = process_logits(logits, 1.0, top_p=0.7)
    assert torch.isfinite(z[0, :2]).all() and torch.isinf(z[0, 2])


def test_inverse_cdf_matches_distribution_and_skips_zeros():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2]]).repeat(20000, 1)
    idx = inverse_cdf_sample(probs, row_uniforms(0, torch.arange(20000), 0))
    freq = torch.bincount(idx, minlength=4).float() / idx.numel()
    assert freq[1] == 0
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)


def test_sample_tokens_returns_logprob_of_drawn_token():
    z = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
    tok, lp = sample_tokens(z, greedy=True)
    assert tok.tolist() == [0, 2]
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.7, 0.8])))
    # u = 0.75 lands in row 0's second bin (cdf 0.7, 0.9) and row 1's third (cdf 0.1, 0.2, 1.0)
    tok, lp = sample_tokens(z, torch.tensor([0.75, 0.75], dtype=torch.float64))
    assert tok.tolist() == [1, 2]
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.2, 0.8])))
    with pytest.raises(ValueError, match="one uniform per row"):
        sample_tokens(z)


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=0)


def test_generate_deterministic_and_stops(tiny_model):
    model, tok = tiny_model
    s = LocalSampler(model, tok)
    prompts = [tok.encode("a b c"), tok.encode("one")]
    a = s.generate(prompts, SamplingParams(max_new_tokens=6, seed=7))
    b = s.generate(prompts, SamplingParams(max_new_tokens=6, seed=7))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in a)
    assert all(len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs) for c in a)
    # make the first sampled token a stop token: the row finishes with reason "stop", token included
    first = a[0].token_ids[0]
    c = s.generate(prompts[:1], SamplingParams(max_new_tokens=6, seed=7, stop_token_ids=(first,)))[0]
    assert c.token_ids == [first] and c.finish_reason == "stop"


def test_batched_equals_single_with_left_padding(tiny_model):
    """Greedy decode of a short prompt is the same alone and left-padded next to a long prompt."""
    model, tok = tiny_model
    s = LocalSampler(model, tok)
    short, long = tok.encode("hi"), tok.encode("a much longer prompt with many more tokens in it")
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    alone = s.generate([short], greedy)[0]
    batched = s.generate([long, short], greedy)[1]
    assert alone.token_ids == batched.token_ids
    assert max(abs(x - y) for x, y in zip(alone.logprobs, batched.logprobs)) < 1e-5
    assert math.isfinite(sum(alone.logprobs))


def test_two_level_draw_equals_the_full_scan_on_exact_sums():
    """Dyadic probabilities sum exactly in fp64 in any order: the block draw is then the full-vocabulary
    inverse CDF, index for index, also across block borders and with a vocabulary that is no multiple of it."""
    from rollout.sampling import CDF_BLOCK

    g = torch.Generator().manual_seed(0)
    v = 2 * CDF_BLOCK + 77
    w = torch.randint(0, 4, (64, v), generator=g).double()  # zeros included
    probs = w / 2.0**12
    u = row_uniforms(3, torch.arange(64), 0)
    cdf = probs.cumsum(-1)
    full = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    got = inverse_cdf_sample(probs.float(), u)
    assert torch.equal(got, full)
    assert bool((probs.gather(-1, got.unsqueeze(-1)) > 0).all())


@pytest.mark.parametrize("u", [0.0, 0.5, 1.0 - 2.0**-53])
def test_draw_never_picks_a_zero_probability_token(u):
    probs = torch.zeros(1, 3000)
    probs[0, [5, 1500, 2047]] = torch.tensor([0.2, 0.3, 0.5])
    tok = inverse_cdf_sample(probs, torch.tensor([u], dtype=torch.float64))
    assert int(tok) in (5, 1500, 2047)

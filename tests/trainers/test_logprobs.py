"""Learner log-probs: the chunked gather equals the naive full-logits path; sampler == learner on the same weights."""
from __future__ import annotations

import pytest
import torch

from rollout.local import LocalSampler, SamplingParams
from trainers.learner.batch import collate
from trainers.learner.logprobs import naive_response_logprobs, response_logprobs


def _rollout(model, tok, temperature=1.0, max_new_tokens=12):
    sampler = LocalSampler(model, tok)
    prompts = [tok.encode("hello there"), tok.encode("What is 2+2? Answer quickly please, now."), tok.encode("x")]
    comps = sampler.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=3))
    return sampler, comps, collate(comps, sampler.pad_id)


@pytest.fixture(scope="module")
def rollouts(tiny_model):
    model, tok = tiny_model
    return {t: _rollout(model, tok, t, max_new_tokens=16) for t in (1.0, 0.7)}


@pytest.mark.parametrize("chunk,temperature", [(1, 1.0), (5, 0.7), (4096, 1.0)])
def test_chunked_equals_naive(tiny_model, rollouts, chunk, temperature):
    model, tok = tiny_model
    _, _, b = rollouts[temperature]
    with torch.no_grad():
        lp, ent = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, prompt_len=b.prompt_len,
                                    temperature=temperature, chunk_size=chunk)
        nlp, nent = naive_response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask,
                                            prompt_len=b.prompt_len, temperature=temperature)
    assert lp.shape == b.response_mask.shape
    torch.testing.assert_close(lp, nlp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, nent, atol=1e-4, rtol=1e-5)
    # entropy of a random 151k-vocab model is close to log(V) = 11.93
    assert 10.0 < float(ent[b.response_mask.bool()].mean()) < 11.94


def test_chunked_gradients_equal_naive(tiny_model, rollouts):
    model, tok = tiny_model
    _, _, b = rollouts[1.0]
    grads = []
    for fn in (lambda: response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask,
                                         prompt_len=b.prompt_len, chunk_size=4)[0],
               lambda: naive_response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask,
                                               prompt_len=b.prompt_len)[0]):
        model.zero_grad(set_to_none=True)
        (fn() * b.response_mask).sum().backward()
        grads.append(model.model.layers[0].mlp.down_proj.weight.grad.clone())
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_and_learner_agree_fp32(tiny_model, rollouts, temperature):
    """bf16 recipe in fp32: KV-cache decode (left-padded batch) vs one full forward differ only by fp32 rounding."""
    model, tok = tiny_model
    _, comps, b = rollouts[temperature]
    with torch.no_grad():
        lp, _ = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, prompt_len=b.prompt_len,
                                  temperature=temperature)
    gap = ((lp - b.sampler_logp) * b.response_mask).abs().max().item()
    assert gap < 1e-5, gap
    assert b.response_mask.sum() == sum(len(c.token_ids) for c in comps)

"""Learner log-probs: the chunked gather equals the naive full-logits path; sampler == learner on the same weights."""
from __future__ import annotations

import pytest
import torch
from minite_test_support import interp_only

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


# --- the fused Triton kernel on the learner path ----------------------------------------------------------------
class _HeadOnly(torch.nn.Module):
    """A model whose decoder returns fixed hidden states: only the head, the softmax statistics and their
    backward run, in ``dtype``."""

    base_model_prefix = "model"

    def __init__(self, tokens: int, hidden: int, vocab: int, dtype, device, bias: bool = False, softcap=None):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.h = torch.nn.Parameter(torch.randn(1, tokens + 1, hidden, generator=g).to(dtype).to(device))
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=bias, dtype=dtype, device=device)
        with torch.no_grad():
            self.lm_head.weight.copy_((torch.randn(vocab, hidden, generator=g) * 0.5).to(dtype))
        self.config = type("Cfg", (), {"final_logit_softcapping": softcap})()
        self.ids = torch.randint(0, vocab, (1, tokens + 1), generator=g).to(device)

    def model(self, **_):
        return type("Out", (), {"last_hidden_state": self.h})()

    def get_output_embeddings(self):
        return self.lm_head


def _both_paths(m: _HeadOnly, temperature: float):
    """(logp, entropy, dh, dW) from ``kernel='auto'`` and from ``kernel='torch'``."""
    am = torch.ones_like(m.ids)
    rm = torch.ones((1, m.ids.shape[1] - 1), device=m.ids.device)
    out = []
    for kernel in ("auto", "torch"):
        lp, ent = response_logprobs(m, m.ids, am, rm, prompt_len=1, temperature=temperature, chunk_size=3,
                                    kernel=kernel)
        g = torch.linspace(-1, 1, lp.numel(), device=lp.device).view_as(lp)
        ((lp * g).sum() + 0.1 * ent.sum()).backward()
        out.append((lp.detach(), ent.detach(), m.h.grad.clone(), m.lm_head.weight.grad.clone()))
        m.h.grad = m.lm_head.weight.grad = None
    return out


def _fused_matches_chunked(device, tol: float) -> None:
    from trainers.learner import logprobs as L

    m = _HeadOnly(13, 32, 300, torch.bfloat16, device)
    assert L._fused(m.lm_head, m.h, 0.7, None) is not None  # the fused kernel runs here
    (lp, ent, dh, dw), (lp_r, ent_r, dh_r, dw_r) = _both_paths(m, 0.7)
    torch.testing.assert_close(lp, lp_r, atol=tol, rtol=0)
    torch.testing.assert_close(ent, ent_r, atol=10 * tol, rtol=0)
    torch.testing.assert_close(dh.float(), dh_r.float(), atol=0.02, rtol=0.02)  # BF16 gradients
    torch.testing.assert_close(dw.float(), dw_r.float(), atol=0.02, rtol=0.02)


def test_fused_kernel_applies_only_where_it_computes_the_same_function():
    from trainers.learner import logprobs as L

    h = torch.zeros(4, 8, dtype=torch.bfloat16)
    plain = torch.nn.Linear(8, 16, bias=False, dtype=torch.bfloat16)
    assert L._fused(plain, h, 1.0, None) is None  # a CPU tensor outside the interpreter
    assert L._fused(torch.nn.Linear(8, 16, dtype=torch.bfloat16), h, 1.0, None) is None  # a bias
    assert L._fused(plain, h, 1.0, 30.0) is None  # soft-capped logits
    assert L._fused(plain, h, 0.0, None) is None  # greedy: no temperature to divide by
    assert L._fused(torch.nn.Linear(8, 16, bias=False), h.float(), 1.0, None) is None  # an FP32 head
    m = _HeadOnly(3, 8, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="kernel must be one of auto, torch; got 'triton'"):
        response_logprobs(m, m.ids, torch.ones_like(m.ids), torch.ones(1, 3), prompt_len=1, kernel="triton")


def test_logprobs_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
def test_interp_fused_matches_chunked():
    _fused_matches_chunked("cpu", 2e-3)


@pytest.mark.gpu
def test_gpu_fused_matches_chunked():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _fused_matches_chunked("cuda", 1e-4)

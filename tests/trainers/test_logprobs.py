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


def _facts_batch(tok, prompt_lens, response_lens, vocab):
    from rollout.local import Completion

    g = torch.Generator().manual_seed(sum(prompt_lens) * 31 + sum(response_lens))
    comps = [Completion(prompt_ids=torch.randint(3, vocab, (p,), generator=g).tolist(),
                        token_ids=torch.randint(3, vocab, (r,), generator=g).tolist(), logprobs=[-1.0] * r,
                        finish_reason="length") for p, r in zip(prompt_lens, response_lens)]
    return collate(comps, pad_id=0)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("lens", [((3, 5, 1), (4, 0, 6)), ((4, 4), (3, 3)), ((2,), (5,))])
def test_host_facts_give_the_same_bits(tiny_model, arch, lens):
    """With the batch's host facts (response count, padding) the pass makes transformers' mask itself and gathers
    by count: the same log-probs, entropies and gradients, bit for bit, as letting the model check the mask; a
    batch without padding takes sdpa's ``is_causal`` both ways. The mask it makes is transformers' own."""
    model = tiny_model[0] if arch == "qwen3" else _tiny_llama()
    assert model.config._attn_implementation == "sdpa"
    b = _facts_batch(tiny_model[1], *lens, vocab=min(model.config.vocab_size, 96))
    assert b.padded() == (len(set(lens[0])) > 1)  # equal prompts and equal responses: no padding
    outs = []
    for facts in ({}, {"response_tokens": b.num_tokens, "padded": b.padded()}):
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, prompt_len=b.prompt_len,
                                    chunk_size=3, **facts)
        (lp.sum() + ent.sum()).backward()
        outs.append((lp.detach(), ent.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    model.zero_grad(set_to_none=True)
    for a, c in zip(*outs):
        assert torch.equal(a, c)
    assert b.num_tokens == int(b.response_mask.sum())
    from transformers.masking_utils import create_causal_mask

    from trainers.learner.logprobs import causal_mask

    emb = model.get_input_embeddings()(b.input_ids)
    pos = torch.arange(b.input_ids.shape[1])
    try:  # transformers' own mask for this batch (keyword names of 5.x)
        want = create_causal_mask(config=model.config, inputs_embeds=emb, attention_mask=b.attention_mask,
                                  past_key_values=None, position_ids=pos[None])
    except TypeError:
        want = create_causal_mask(config=model.config, input_embeds=emb, attention_mask=b.attention_mask,
                                  cache_position=pos, past_key_values=None, position_ids=pos[None])
    got = causal_mask(model, b.attention_mask, b.padded())
    if isinstance(got, dict):  # the ready-made mapping Qwen3's forward takes
        assert arch == "qwen3" and set(got) == {"full_attention"}
        got = got["full_attention"]
    assert (got is None and want is None) or torch.equal(got, want)


@pytest.mark.parametrize("lens", [((4, 4), (3, 3)), ((3, 5, 1), (4, 0, 6))])
def test_host_facts_spare_qwen3_its_mask_checks(tiny_model, monkeypatch, lens):
    """With the host facts a Qwen3 forward makes no mask of its own, padded or not: transformers' mask builder,
    which checks an unpadded batch's position ids for packed sequences by reading them back, is never called.
    Without the facts it is (the check this replaces)."""
    import transformers.models.qwen3.modeling_qwen3 as mq

    model = tiny_model[0]
    b = _facts_batch(tiny_model[1], *lens, vocab=96)
    calls = []
    real = mq.create_causal_mask
    monkeypatch.setattr(mq, "create_causal_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, prompt_len=b.prompt_len,
                          response_tokens=b.num_tokens, padded=b.padded())
        assert not calls
        response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, prompt_len=b.prompt_len)
    assert calls == [1]


def test_other_models_keep_their_mask(tiny_model):
    """Eager attention, or a model with a sliding-window layer, gets the 2D mask: transformers makes theirs."""
    from trainers.learner.logprobs import causal_mask

    model = _tiny_llama()
    am = torch.tensor([[0, 1, 1], [1, 1, 1]])
    model.config._attn_implementation = "eager"
    assert causal_mask(model, am, True) is am
    model.config._attn_implementation = "sdpa"
    model.config.layer_types = ["full_attention", "sliding_attention"]
    assert causal_mask(model, am, True) is am
    with pytest.raises(ValueError, match="give both response_tokens and padded"):
        response_logprobs(model, am, am, am[:, 1:], prompt_len=2, response_tokens=2)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "torch"])
@pytest.mark.parametrize("lens", [((3, 9, 1, 6), (4, 0, 12, 7)), ((5, 5, 5), (6, 6, 6))])
def test_gpu_host_facts_give_the_same_bits(kernel, lens, qwen3_tokenizer_dir):
    """On CUDA in BF16 (sdpa's GPU kernels; ``auto``: the fused Triton log-prob kernel): the same bits with the
    host facts as without, and no read-back before the loss with them, for a padded batch and an unpadded one
    (where transformers would check the position ids for packed sequences)."""
    import copy
    import warnings

    from rollout.models import tiny_random_qwen3

    model, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)
    model = copy.deepcopy(model).to("cuda", torch.bfloat16)
    b = _facts_batch(tok, *lens, vocab=2000)
    b = type(b)(*(t.cuda() for t in (b.input_ids, b.attention_mask, b.response_mask, b.sampler_logp)), b.prompt_len,
                b.row_layout)
    outs = []
    for facts in ({}, {"response_tokens": b.num_tokens, "padded": b.padded()}):
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                lp, ent = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask,
                                            prompt_len=b.prompt_len, kernel=kernel, **facts)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in seen if "synchronizing" in str(w.message)]
        (lp.float().sum() + ent.float().sum()).backward()
        outs.append((lp.detach(), ent.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone(), syncs))
    model.zero_grad(set_to_none=True)
    for a, c in zip(outs[0][:3], outs[1][:3]):
        assert torch.equal(a, c)
    assert outs[0][3] and not outs[1][3], [str(w.message) for w in outs[1][3]]

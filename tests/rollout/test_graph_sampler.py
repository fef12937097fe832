"""The CUDA-graph sampler engine against the reference loop (eager on CPU; captured graphs on the GPU)."""
from __future__ import annotations

import types

import pytest
import torch
from minite_test_support import interp_only

from rollout import GraphSampler, LocalSampler, SamplingParams, make_sampler
from rollout.decoder import UnsupportedModel, decoder_view
from rollout.graph_sampler import bucket_of

gpu = pytest.mark.gpu


def _prompts(vocab: int, lengths=(3, 1, 11, 2, 7, 5, 4, 9), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


def _tiny(kind: str, *, tied: bool = True, dtype=torch.float32, device="cpu"):
    """A tiny random llama / qwen2 / qwen3 with a 512-token vocabulary and a stand-in tokenizer (pad 0, eos 1)."""
    import transformers as tf

    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=tied, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
           "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[kind]
    extra = {"head_dim": 16} if kind == "qwen3" else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = cls[1](cls[0](**common, **extra))
    model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = 1
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)
    return model, tok


def _compare(ref, got, atol: float) -> None:
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in ref]
    for r, g in zip(ref, got):
        assert len(g.logprobs) == len(g.token_ids)
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(r.logprobs), atol=atol, rtol=0)


def _agree_up_to_first_difference(ref, got, atol: float = 0.05, min_share: float = 0.5) -> None:
    """bf16 paths that reduce in other orders may part after a near-tie: up to each row's first differing token
    the log-probs agree within ``atol``, and at least ``min_share`` of all tokens come before such a parting."""
    worst, same = 0.0, 0
    for r, g in zip(ref, got):
        n = next((i for i, (x, y) in enumerate(zip(r.token_ids, g.token_ids)) if x != y), len(r.token_ids))
        same += n
        if n:
            worst = max(worst, max(abs(x - y) for x, y in zip(r.logprobs[:n], g.logprobs[:n])))
    assert worst < atol and same >= min_share * sum(len(r.token_ids) for r in ref), (worst, same)


PARAMS = [
    SamplingParams(max_new_tokens=12, temperature=0.0),
    SamplingParams(max_new_tokens=12, seed=3),
    SamplingParams(max_new_tokens=12, seed=4, temperature=0.7, top_k=20, top_p=0.9),
]


@pytest.mark.parametrize("kind,tied", [("qwen3", True), ("qwen3", False), ("qwen2", False), ("llama", True)])
def test_engine_matches_reference_loop_fp32(kind, tied):
    model, tok = _tiny(kind, tied=tied)
    prompts = _prompts(512)
    for p in PARAMS:
        ref = LocalSampler(model, tok).generate(prompts, p)
        _compare(ref, GraphSampler(model, tok).generate(prompts, p), atol=1e-5)


def test_engine_qwen3_real_tokenizer(tiny_model):
    model, tok = tiny_model
    prompts = [tok.encode("a b c"), tok.encode("one"), tok.encode("a much longer prompt with many more tokens")]
    p = SamplingParams(max_new_tokens=10, seed=1)
    _compare(LocalSampler(model, tok).generate(prompts, p), GraphSampler(model, tok).generate(prompts, p), 1e-5)


def test_completions_carry_their_log_probs_as_rows_of_their_own():
    """Each completion's ``logprob_row`` holds its ``logprobs`` as fp32 (the learner's batch reads it), in memory
    of its own: the next call, which reuses the engine's buffers, leaves it unchanged."""
    model, tok = _tiny("qwen3")
    eng = GraphSampler(model, tok)
    first = eng.generate(_prompts(512), SamplingParams(max_new_tokens=8, seed=1))
    kept = [c.logprob_row.clone() for c in first]
    eng.generate(_prompts(512), SamplingParams(max_new_tokens=8, seed=2))
    for c, k in zip(first, kept):
        assert c.logprob_row.dtype == torch.float32 and c.logprob_row.tolist() == c.logprobs
        assert torch.equal(c.logprob_row, k)


def test_early_stops_compact_through_every_bucket():
    """Rows stop at different tokens; checking every token compacts 8 -> 4 -> 2 -> 1 and the results still
    equal the loop's (which drops finished rows at once)."""
    model, tok = _tiny("qwen3")
    prompts = _prompts(512)
    base = SamplingParams(max_new_tokens=16, seed=11)
    free = LocalSampler(model, tok).generate(prompts, base)
    # stop row i at its token 2 * i (rows 0..6), row 7 runs to the length limit unless a stop token recurs
    stops = tuple(sorted({free[i].token_ids[2 * i] for i in range(7)} - set(free[7].token_ids)))
    p = SamplingParams(max_new_tokens=16, seed=11, stop_token_ids=stops)
    ref = LocalSampler(model, tok).generate(prompts, p)
    eng = GraphSampler(model, tok, check_every=1)
    got = eng.generate(prompts, p)
    _compare(ref, got, atol=1e-5)
    assert sum(c.finish_reason == "stop" for c in got) >= 5 and got[7].finish_reason == "length"
    assert eng.stats["compactions"] >= 2
    assert sorted({len(c.token_ids) for c in got}) == sorted({len(c.token_ids) for c in ref})


def test_batch_size_and_draws_do_not_depend_on_layout():
    model, tok = _tiny("qwen3")
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=8, seed=5)
    whole = GraphSampler(model, tok).generate(prompts, p)
    split = GraphSampler(model, tok, batch_size=3).generate(prompts, p)  # batches of 3, 3, 2: buckets 4 and 2
    _compare(whole, split, atol=1e-5)
    loop_split = LocalSampler(model, tok, batch_size=3).generate(prompts, p)
    _compare(whole, loop_split, atol=1e-5)


def test_same_seed_same_tokens_new_seed_new_tokens_and_restart():
    model, tok = _tiny("qwen3")
    prompts = _prompts(512)
    eng = GraphSampler(model, tok)
    a = eng.generate(prompts, SamplingParams(max_new_tokens=8, seed=9))
    b = eng.generate(prompts, SamplingParams(max_new_tokens=8, seed=9))
    c = eng.generate(prompts, SamplingParams(max_new_tokens=8, seed=10))
    restarted = GraphSampler(model, tok).generate(prompts, SamplingParams(max_new_tokens=8, seed=9))
    assert [x.token_ids for x in a] == [x.token_ids for x in b] == [x.token_ids for x in restarted]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_longer_call_reallocates_the_cache():
    model, tok = _tiny("qwen3")
    eng = GraphSampler(model, tok)
    eng.generate(_prompts(512, (2, 3)), SamplingParams(max_new_tokens=4, temperature=0.0))
    seq = eng._state.seq
    long = _prompts(512, (3, 150))
    p = SamplingParams(max_new_tokens=40, temperature=0.0)
    _compare(LocalSampler(model, tok).generate(long, p), eng.generate(long, p), atol=1e-5)
    assert eng._state.seq > seq


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_fused_functions_are_the_modules_bit_for_bit_eagerly(kind):
    model, tok = _tiny(kind)
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=10, seed=2)
    fused = GraphSampler(model, tok, fused=True, pack=False)
    assert fused.describe()["fused"] == "eager"
    _compare(GraphSampler(model, tok, fused=False).generate(prompts, p), fused.generate(prompts, p), atol=0.0)


@pytest.mark.parametrize("kind,tied", [("qwen3", True), ("qwen2", False)])
def test_packed_projections_follow_in_place_weight_updates(kind, tied):
    """q/k/v and gate/up as one GEMM each (qwen2: with biases) over copies refreshed before every decode."""
    model, tok = _tiny(kind, tied=tied)
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=10, seed=2)
    eng = GraphSampler(model, tok, fused=True, pack=True)
    assert eng.describe()["packed_bytes"] == 2 * (64 + 2 * 32 + 2 * 128) * 64 * 4 + (
        2 * (64 + 2 * 32) * 4 if kind == "qwen2" else 0)
    _compare(LocalSampler(model, tok).generate(prompts, p), eng.generate(prompts, p), atol=1e-5)
    with torch.no_grad():
        for prm in model.parameters():
            prm.mul_(1.5)
    _compare(LocalSampler(model, tok).generate(prompts, p), eng.generate(prompts, p), atol=1e-5)


def test_quantized_projections_are_packed_only_on_the_fast_lane():
    """On the CPU (emulated backend: no fast lane) NVFP4 projections stay module calls, and the engine still
    equals the reference loop; plain projections beside them are packed as usual."""
    from minite_kernels import quantize_model

    model, tok = _tiny("qwen3")
    quantize_model(model, "nvfp4_per_token_bf16_bwd", exclude=["*mlp*"])
    eng = GraphSampler(model, tok, fused=True, pack=True)
    assert eng.describe()["packed_quantized_groups"] == 0
    assert [q is None and g is not None for q, g in eng._packed.layers] == [True, True]
    p = SamplingParams(max_new_tokens=8, seed=2)
    _compare(LocalSampler(model, tok).generate(_prompts(512), p), eng.generate(_prompts(512), p), atol=1e-5)


def test_fused_refuses_models_it_does_not_cover():
    model, tok = _tiny("qwen3")
    model.model.layers[0].mlp.act_fn = torch.nn.GELU()
    assert GraphSampler(model, tok).describe()["fused_off_reason"] == "layer 0's MLP activation is GELU, not SiLU"
    with pytest.raises(ValueError, match="fused=True: layer 0's MLP activation is GELU"):
        GraphSampler(model, tok, fused=True)


def test_bucket_of():
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]


def test_unsupported_models_are_refused_with_the_reason():
    model, tok = _tiny("qwen3")
    model.model.layers[1].self_attn.sliding_window = 16
    with pytest.raises(UnsupportedModel, match="layer 1 uses sliding-window attention"):
        decoder_view(model)
    model, tok = _tiny("qwen3")
    model.config.model_type = "gemma3"
    with pytest.raises(UnsupportedModel, match="model_type 'gemma3' is not one of llama, qwen2, qwen3"):
        decoder_view(model)
    model, tok = _tiny("qwen3")
    model.model.rotary_emb.rope_type = "dynamic"
    with pytest.raises(UnsupportedModel, match="rope_type 'dynamic'"):
        GraphSampler(model, tok)


def test_make_sampler_choices():
    model, tok = _tiny("qwen3")
    assert isinstance(make_sampler(model, tok), LocalSampler)  # auto on CPU: the loop
    assert isinstance(make_sampler(model, tok, engine="graph"), GraphSampler)
    assert isinstance(make_sampler(model, tok, engine="loop"), LocalSampler)
    with pytest.raises(ValueError, match="unknown sampler engine 'cuda'; valid: auto, graph, loop"):
        make_sampler(model, tok, engine="cuda")
    d = GraphSampler(model, tok).describe()
    assert d["decode"] == "eager" and d["eager_reason"] == "not a CUDA device"
    model.config.model_type = "gemma3"
    with pytest.raises(UnsupportedModel, match="engine 'graph' cannot run this model: model_type 'gemma3'.*'auto' or"):
        make_sampler(model, tok, engine="graph")
    assert isinstance(make_sampler(model, tok), LocalSampler)


# ----------------------------------------------------------------------------------------------- GPU
def _cuda_model(kind="qwen3", dtype=torch.float32, **kw):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return _tiny(kind, dtype=dtype, device="cuda", **kw)


@gpu
@pytest.mark.parametrize("kind,tied", [("qwen3", True), ("qwen2", False), ("llama", True)])
def test_gpu_graphs_match_reference_fp32(kind, tied):
    model, tok = _cuda_model(kind, tied=tied)
    prompts = _prompts(512)
    eng = GraphSampler(model, tok, graphs=True)
    for p in PARAMS:
        _compare(LocalSampler(model, tok).generate(prompts, p), eng.generate(prompts, p), atol=1e-5)
    d = eng.describe()
    assert d["decode"] == "cuda_graph" and d["captures"] >= 1 and d["replays"] > 0 and d["capture_s"] > 0


def _compaction_params(model, tok, prompts) -> SamplingParams:
    """24 sampled tokens with stop tokens that end row i (< 7) at its token 3i and never end row 7 (from a free run
    with the same seed), so that an engine checking every token compacts the 8 rows through every bucket."""
    free = GraphSampler(model, tok, graphs=False).generate(prompts, SamplingParams(max_new_tokens=24, seed=2))
    stops = tuple(sorted({free[i].token_ids[3 * i] for i in range(7)} - set(free[7].token_ids)))
    return SamplingParams(max_new_tokens=24, seed=2, stop_token_ids=stops)


@gpu
def test_gpu_graph_replay_equals_eager_bf16_every_bucket():
    """Replayed graphs compute exactly what the same step computes eagerly (same kernels, same inputs)."""
    model, tok = _cuda_model(dtype=torch.bfloat16)
    prompts = _prompts(512)
    p = _compaction_params(model, tok, prompts)
    eager = GraphSampler(model, tok, graphs=False, check_every=1).generate(prompts, p)
    eng = GraphSampler(model, tok, graphs=True, check_every=1)
    got = eng.generate(prompts, p)
    _compare(eager, got, atol=0.0)
    assert {k[0] for k in eng._graphs} >= {8, 1} and eng.stats["compactions"] >= 2


@gpu
def test_gpu_bf16_against_reference_loop_measured_tolerance():
    """bf16: the engine's attention reduces in another order than HF's, so greedy paths may part after a
    near-tie; up to the first differing token the log-probs agree within 0.05 (bf16 logits' resolution)."""
    model, tok = _cuda_model(dtype=torch.bfloat16)
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=32, temperature=0.0)
    ref = LocalSampler(model, tok).generate(prompts, p)
    got = GraphSampler(model, tok, graphs=True).generate(prompts, p)
    _agree_up_to_first_difference(ref, got)


def _replayed(eng, generate):
    """``generate()``, checking that its decode replayed captured graphs (a failed capture falls back to eager
    steps, which would satisfy every check on outputs and capture counts)."""
    before = dict(eng.stats)
    out = generate()
    d = eng.describe()
    assert d["decode"] == "cuda_graph" and d["eager_reason"] is None, d
    new = {k: eng.stats[k] - before[k] for k in ("replays", "eager_steps", "captures")}
    assert new["replays"] > 0 and new["eager_steps"] == new["captures"], (new, d)  # one warm-up step per capture
    return out


@gpu
def test_gpu_recapture_after_the_weights_move():
    """Weights at new addresses (as after the first grouped weight sync) drop the graphs; the next call captures
    again, into a new memory pool, and replays. Twice, so the second drop releases a pool whose graphs were
    all re-made."""
    model, tok = _cuda_model(dtype=torch.bfloat16, tied=False)
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=12, seed=1)
    eng = GraphSampler(model, tok, graphs=True)
    _replayed(eng, lambda: eng.generate(prompts, p))
    for _ in range(2):
        captures = eng.stats["captures"]
        with torch.no_grad():
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        got = _replayed(eng, lambda: eng.generate(prompts, p))
        assert eng.stats["captures"] > captures
        _compare(GraphSampler(model, tok, graphs=False).generate(prompts, p), got, atol=0.0)


def test_dropping_the_graphs_drops_their_pool():
    """CPU: the bookkeeping of the test above (a new pool handle for the graphs captured after a drop)."""
    model, tok = _tiny("qwen3")
    eng = GraphSampler(model, tok, graphs=False)
    eng._pool = object()
    eng._drop_graphs()
    assert eng._pool is None and not eng._graphs


@gpu
def test_gpu_weight_update_changes_graph_output_without_recapture():
    model, tok = _cuda_model(dtype=torch.bfloat16)
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=12, seed=1)
    eng = GraphSampler(model, tok, graphs=True)
    before = eng.generate(prompts, p)
    captures = eng.stats["captures"]
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn_like(prm) * 0.05)
    after = _replayed(eng, lambda: eng.generate(prompts, p))
    assert eng.stats["captures"] == captures  # same graphs, new weights
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    _compare(GraphSampler(model, tok, graphs=False).generate(prompts, p), after, atol=0.0)


def _nvfp4_model():
    pytest.importorskip("triton")
    import transformers as tf

    from minite_kernels import quantize_model

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = tf.Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    model = tf.Qwen3ForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = 1
    report = quantize_model(model, "nvfp4_per_token_bf16_bwd")
    return model, types.SimpleNamespace(pad_token_id=0, eos_token_id=1), report


@gpu
def test_gpu_nvfp4_linears_inside_the_graph_and_weight_sync_keeps_graphs():
    """minite-patched linears (Triton backend) are captured: the decode kernels at 1-4 rows and the
    dequantized-weight GEMM above; ModelWeightSync re-quantizes into the buffers the graphs read."""
    from minite_kernels.modules.weight_sync import ModelWeightSync

    model, tok, report = _nvfp4_model()
    prompts = _prompts(512)
    base = SamplingParams(max_new_tokens=20, seed=6)
    free = GraphSampler(model, tok, graphs=False).generate(prompts, base)
    stops = tuple(sorted({free[i].token_ids[2 * i + 1] for i in range(7)} - set(free[7].token_ids)))
    p = SamplingParams(max_new_tokens=20, seed=6, stop_token_ids=stops)
    eng = GraphSampler(model, tok, graphs=True, check_every=1)
    got = eng.generate(prompts, p)
    assert eng.describe()["decode"] == "cuda_graph", eng.describe()
    _compare(GraphSampler(model, tok, graphs=False, check_every=1).generate(prompts, p), got, atol=0.0)
    assert eng.stats["compactions"] >= 1  # smaller buckets ran through the packed decode kernel (<= 4 rows)

    sync = ModelWeightSync(model)
    sync.sync()
    captures = eng.stats["captures"]
    _replayed(eng, lambda: eng.generate(prompts, p))  # graphs captured again, now reading the sync's buffers
    assert eng.stats["captures"] > captures
    _weights_move_without_recapture(model, eng, sync, prompts, p, got,
                                    lambda: GraphSampler(model, tok, graphs=False, check_every=1))


def _weights_move_without_recapture(model, eng, sync, prompts, p, got, fresh) -> None:
    """Every parameter moved and synced: the graphs replay without a new capture, draw other tokens than
    ``got``, and equal a fresh eager engine (``fresh()``) on the new weights bit for bit."""
    captures = eng.stats["captures"]
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn_like(prm) * 0.05)
    sync.sync()
    after = _replayed(eng, lambda: eng.generate(prompts, p))
    assert eng.stats["captures"] == captures
    assert [c.token_ids for c in after] != [c.token_ids for c in got]
    _compare(fresh().generate(prompts, p), after, atol=0.0)


@gpu
def test_gpu_norm_quant_inside_the_graph():
    """``norm_quant=True`` captured: the fused norm + quantizer kernel replays inside the graph, equal to the
    same engine run eagerly, and the engine samples close to what it samples without it.

    Not equal: the fused norm's activation may differ from PyTorch's in the last BF16 bit (another summation
    order), and NVFP4 turns such a bit into a whole E2M1 step of that element when it crosses a rounding
    boundary. On this random 2-layer model, greedy, the log-probs before each row's first parting differed by up
    to 0.097 on the H200, and 57 of the 128 tokens came before a parting (bf16 paths stay within 0.05); the
    bounds below leave room for that and still fail on a wrong X̂ (``test_gpu_matches_reference`` checks X̂
    itself bit for bit)."""
    model, tok, _ = _nvfp4_model()
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=16, temperature=0.0)
    want = GraphSampler(model, tok, graphs=True).generate(prompts, p)
    eng = GraphSampler(model, tok, graphs=True, norm_quant=True)
    got = _replayed(eng, lambda: eng.generate(prompts, p))
    _compare(GraphSampler(model, tok, graphs=False, norm_quant=True).generate(prompts, p), got, atol=0.0)
    _agree_up_to_first_difference(want, got, atol=0.2, min_share=0.25)


def _prefill(model, prompts):
    from rollout.local import left_pad

    ids, mask, pos = left_pad(prompts, 0, next(model.parameters()).device)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)


def test_refill_copies_fresh_forward_weights_into_the_held_buffers():
    """Without grouped weight sync every module re-quantizes its weight on the prefill after an update; the
    engine copies the new values into the buffers its graphs read (CPU: the bookkeeping alone)."""
    from minite_kernels import quantize_model
    from minite_kernels.formats.nvfp4 import NVFP4Tensor

    model, tok = _tiny("qwen3", tied=False)
    quantize_model(model, "nvfp4_per_token_w1x16_bf16_bwd", backend="emulated")
    prompts = _prompts(512)
    eng = GraphSampler(model, tok, graphs=False)
    _prefill(model, prompts)
    eng._fingerprint, eng._held = eng._weights_fingerprint()
    eng._held_keys = [key for _, _, key, _, _ in eng._fprop_entries()]
    held_ids = [id(h) for h in eng._held]
    assert held_ids and all(isinstance(h, NVFP4Tensor) for h in eng._held)
    with torch.no_grad():
        for prm in model.parameters():
            prm.mul_(1.5)
    assert not eng._refill_held()  # nothing re-made yet: the entries are stale, so re-capture
    _prefill(model, prompts)  # every module re-quantizes: new objects at new addresses
    fresh = [(value.data.clone(), value.scales.clone()) for *_, value in eng._fprop_entries()]
    assert [id(v) for *_, v in eng._fprop_entries()] != held_ids
    assert eng._refill_held() and eng.stats["refills"] == 1
    entries = eng._fprop_entries()
    assert [id(v) for *_, v in entries] == held_ids  # the caches hold the graphs' buffers again
    for (data, scales), (*_, value) in zip(fresh, entries):
        assert torch.equal(value.data, data) and torch.equal(value.scales.view(torch.uint8), scales.view(torch.uint8))
    assert eng._weights_fingerprint()[0] == eng._fingerprint  # the addresses the graphs read, unchanged


@gpu
def test_gpu_fp32_nvfp4_weight_updates_refill_instead_of_recapture():
    """An fp32 model's NVFP4 linears are outside ModelWeightSync (BF16 only): after an update, the prefill
    re-quantizes them afresh, and the engine refills the graphs' buffers instead of capturing again."""
    pytest.importorskip("triton")
    from minite_kernels import quantize_model

    model, tok = _tiny("llama", tied=True, device="cuda")
    quantize_model(model, "nvfp4_per_token_w1x16_bf16_bwd")
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=16, seed=2)
    eng = GraphSampler(model, tok, graphs=True)
    before = eng.generate(prompts, p)
    captures = eng.stats["captures"]
    assert captures >= 1 and eng.describe()["decode"] == "cuda_graph"
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn_like(prm) * 0.05)
    after = eng.generate(prompts, p)
    assert eng.stats["refills"] >= 1, eng.describe()
    assert eng.stats["captures"] == captures, eng.describe()
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    _compare(GraphSampler(model, tok, graphs=False).generate(prompts, p), after, atol=0.0)


@gpu
def test_gpu_nvfp4_packed_groups_are_the_modules_forward():
    """A packed NVFP4 q/k/v (gate/up) group computes the modules' lane forward in one GEMM: the same X̂ and Ŵ
    values, so each column block equals its module's output up to the GEMM's reduction order; at <= 4 rows
    it defers to the modules (their packed-FP4 decode kernel)."""
    from minite_kernels.backends.triton.backend import DECODE_MAX_ROWS
    from rollout.packed import PackedLinears

    model, tok, _ = _nvfp4_model()
    packed = PackedLinears(decoder_view(model), fp4=False)
    assert packed.quantized_groups == 2 * model.config.num_hidden_layers
    packed.refresh()
    layer = model.model.layers[1]
    qkv, gu = packed.layers[1]
    x = torch.randn(16, 1, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for group, mods in ((qkv, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                            (gu, [layer.mlp.gate_proj, layer.mlp.up_proj])):
            want = torch.cat([m(x) for m in mods], dim=-1)
            got = group(x)
            assert got.shape == want.shape
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
            assert (got == want).float().mean() > 0.95  # the same operands: nearly every output bit-equal
            assert group(x[:DECODE_MAX_ROWS]) is None


@gpu
def test_gpu_nvfp4_engine_with_and_without_packing():
    """The engine with packed NVFP4 groups draws what it draws with the modules, up to bf16 reduction-order
    near-ties (same measured tolerance as the bf16 engine against the loop); and graph replay equals eager."""
    model, tok, _ = _nvfp4_model()
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=24, seed=3)
    eng = GraphSampler(model, tok, graphs=True, pack=True, fp4_weights=False)
    got = eng.generate(prompts, p)
    assert eng.describe()["packed_quantized_groups"] == 4 and eng.describe()["decode"] == "cuda_graph"
    _compare(GraphSampler(model, tok, graphs=False, pack=True, fp4_weights=False).generate(prompts, p), got,
             atol=0.0)
    _agree_up_to_first_difference(GraphSampler(model, tok, graphs=True, pack=False).generate(prompts, p), got)


# ------------------------------------------------------------------------------------------ FP4-weight groups
def _fp4_group_checks(model, eng, device) -> None:
    """Every packed group of ``eng`` runs on FP4 weights: each group's output is the FP4-weight GEMM's
    reference on the lane's own X̂ and the modules' current NVFP4 bytes, bit for bit (``group(x)`` for q/k/v,
    gate/up, o and down); the decode step reads at most 0.35x the BF16 weight bytes."""
    from minite_kernels.backends.triton.fp4w import fp4w_linear_reference

    d = eng.describe()
    layers = model.config.num_hidden_layers
    assert d["fp4_weight_groups"] == 4 * layers and d["packed_quantized_groups"] == 4 * layers, d
    assert d["quantized_weight_bytes_vs_bf16"] <= 0.35, d
    packed = eng._packed
    packed.refresh()
    for i in range(layers):
        (qkv, gu), o, dn = packed.layers[i], packed.o[i], packed.down[i]
        for g in (qkv, gu, o, dn):
            assert g.weight is None and g.fp4 is not None  # no BF16 copy of a quantized weight
            k = g.in_features
            x = torch.randn(8, 1, k, device=device).to(torch.bfloat16)
            recipe, _, quantizer = g.lane
            x_hat = quantizer.quantize_token_deq(x.reshape(-1, k), recipe.fprop.a).deq
            want = fp4w_linear_reference(x_hat.cpu(), _cpu(g.fp4), None if g.bias is None else g.bias.cpu())
            got = g(x).reshape(8, -1).cpu()
            if device == "cpu":  # the interpreter sums in the reference's order
                assert torch.equal(got, want)
            else:  # compiled: the same up to the order of the fp32 sum (one BF16 step either side of a tie)
                torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=2**-7)


def _cpu(w):
    from minite_kernels.backends.triton.fp4w import FP4Weight

    return FP4Weight(w.codes.cpu(), w.scales.cpu(), w.gain.cpu())


#: the interp_ tests' prompts: 8 rows of mixed lengths (left padding), as ``_prompts(512)``, but short. The
#: interpreter runs each kernel program in Python, and the prefill quantizes 8 x (longest prompt) activation rows
#: in 16-row programs: ``_prompts(512)``'s 11 tokens cost 6 programs per quantization, these 1
INTERP_LENGTHS = (2, 1, 2, 2, 1, 2, 1, 2)


@pytest.fixture(scope="module")
def interp_nvfp4_model():
    """The interp_ tests' model, made and quantized once (Triton backend): the tiny bf16 Qwen3 with untied
    weights. Its modules cache their quantized weights, so only the first test pays for quantizing them (~20 s in
    the interpreter); the tests leave the weights as they found them (the FP4 test flips a weight's sign and back,
    bit for bit)."""
    from minite_kernels import quantize_model
    from minite_kernels.backends.triton import TritonBackend

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TritonBackend, "availability", classmethod(lambda cls, device=None: (True, "")))
        model, tok = _tiny("qwen3", tied=False, dtype=torch.bfloat16)
        quantize_model(model, "nvfp4_per_token_w1x16_bf16_bwd", backend="triton")
    return model, tok


@interp_only
def test_interp_fp4_weight_groups_follow_the_weights(monkeypatch, interp_nvfp4_model):
    """``fp4_weights=True``: q/k/v, gate/up, o and down hold the NVFP4 bytes (no BF16 Ŵ copy) and run the
    FP4-weight GEMM; a weight change reaches the same buffers on refresh; the engine samples close to the
    dequantized-weight engine (the two differ by Ŵ's BF16 rounding, ``fp4w``'s docstring)."""
    from minite_kernels.backends.triton import TritonBackend

    monkeypatch.setattr(TritonBackend, "availability", classmethod(lambda cls, device=None: (True, "")))
    model, tok = interp_nvfp4_model
    eng = GraphSampler(model, tok, graphs=False, fused=True, fp4_weights=True)
    _fp4_group_checks(model, eng, "cpu")
    g = eng._packed.layers[0][0]
    ptr, before = g.fp4.codes.data_ptr(), g.fp4.codes.clone()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(-1.0)
    eng._packed.refresh()
    assert g.fp4.codes.data_ptr() == ptr and not torch.equal(g.fp4.codes, before)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(-1.0)
    prompts = _prompts(512, INTERP_LENGTHS)
    p = SamplingParams(max_new_tokens=3, temperature=0.0)
    deq = GraphSampler(model, tok, graphs=False, fused=True, fp4_weights=False)
    assert deq.describe()["fp4_weight_groups"] == 0 and deq.describe()["quantized_weight_bytes_vs_bf16"] == 1.0
    _agree_up_to_first_difference(deq.generate(prompts, p), eng.generate(prompts, p), atol=0.2, min_share=0.25)


def test_fp4_weights_option_is_checked():
    model, tok = _tiny("qwen3")
    with pytest.raises(ValueError, match="fp4 must be 'auto', True or False"):
        GraphSampler(model, tok, graphs=False, fused=True, fp4_weights="yes")
    with pytest.raises(ValueError, match="unknown fp4_weights 'yes'; valid: auto, on, off"):
        make_sampler(model, tok, engine="graph", fp4_weights="yes")
    eng = GraphSampler(model, tok, graphs=False, fused=True)  # bf16 model: nothing quantized, nothing in FP4
    assert eng.describe()["fp4_weight_groups"] == 0


@gpu
def test_gpu_fp4_weight_groups_inside_the_graph_and_weight_sync():
    """On the GPU: the FP4 groups compute the FP4-weight GEMM on the modules' bytes; graph replay equals eager
    bit for bit; ModelWeightSync plus the engine's refresh keep the graphs valid and follow the new weights; and
    the engine samples close to the dequantized-weight engine (measured tolerance, as norm_quant's test)."""
    from minite_kernels.modules.weight_sync import ModelWeightSync

    model, tok, _ = _nvfp4_model()
    prompts = _prompts(512)
    p = SamplingParams(max_new_tokens=20, seed=6)
    eng = GraphSampler(model, tok, graphs=True, fp4_weights=True)
    _fp4_group_checks(model, eng, "cuda")
    got = eng.generate(prompts, p)
    assert eng.describe()["decode"] == "cuda_graph"
    _compare(GraphSampler(model, tok, graphs=False, fp4_weights=True).generate(prompts, p), got, atol=0.0)
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    # the FP4 and dequantized-weight GEMMs differ by Ŵ's BF16 rounding (relative 3e-3), more than a reduction order:
    # measured on an H100, 23 of 128 greedy tokens before a row's first parting, log-probs within 0.069 up to it
    _agree_up_to_first_difference(GraphSampler(model, tok, graphs=True, fp4_weights=False).generate(prompts, greedy),
                                  eng.generate(prompts, greedy), atol=0.2, min_share=0.1)
    sync = ModelWeightSync(model)
    sync.sync()
    _replayed(eng, lambda: eng.generate(prompts, p))
    _weights_move_without_recapture(model, eng, sync, prompts, p, got,
                                    lambda: GraphSampler(model, tok, graphs=False, fp4_weights=True))


# ----------------------------------------------------------------------------------- Triton interpreter (CPU)


def test_graph_sampler_kernels_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
def test_interp_norm_quant_feeds_the_packed_groups(monkeypatch, interp_nvfp4_model):
    """``norm_quant=True``: the packed NVFP4 groups and the down projections take X̂ from the fused kernels (once
    per group and step at more than 4 rows), and the engine samples what it samples without them, up to the
    last-bit differences of the norm (another summation order)."""
    from minite_kernels.backends.triton import TritonBackend
    from minite_kernels.backends.triton import norm_quant as nq

    monkeypatch.setattr(TritonBackend, "availability", classmethod(lambda cls, device=None: (True, "")))
    model, tok = interp_nvfp4_model
    calls = []
    for name in ("add_rms_norm_deq", "silu_mul_deq"):
        real = getattr(nq, name)
        monkeypatch.setattr(nq, name, lambda *a, _f=real, _n=name, **k: calls.append(_n) or _f(*a, **k))
    prompts = _prompts(512, INTERP_LENGTHS)  # 8 rows: the lane's GEMM, not the <= 4-row decode kernel
    p = SamplingParams(max_new_tokens=3, temperature=0.0)
    plain = GraphSampler(model, tok, graphs=False, fused=True, fp4_weights=False)
    fused = GraphSampler(model, tok, graphs=False, fused=True, norm_quant=True, fp4_weights=False)
    assert fused.describe()["norm_quant"] is True and plain.describe()["packed_quantized_groups"] == 4
    want, got = plain.generate(prompts, p), fused.generate(prompts, p)
    steps = 2  # decode steps after the prefill's token
    # per layer and step: the norms before q/k/v and gate/up, and the SiLU product before down
    assert calls.count("add_rms_norm_deq") == steps * 4 and calls.count("silu_mul_deq") == steps * 2, calls
    assert fused.describe()["packed_bytes"] > plain.describe()["packed_bytes"]  # the down projections' Ŵ
    _agree_up_to_first_difference(want, got, atol=0.05)
    assert sum(a.token_ids == b.token_ids for a, b in zip(want, got)) >= 6  # most rows sample the same tokens


def test_norm_quant_needs_packed_nvfp4_groups():
    model, tok = _tiny("qwen3")
    with pytest.raises(ValueError, match="norm_quant=True quantizes the input of packed NVFP4 groups"):
        GraphSampler(model, tok, graphs=False, fused=True, norm_quant=True)
    with pytest.raises(ValueError, match="norm_quant must be 'auto', True or False"):
        GraphSampler(model, tok, graphs=False, fused=True, norm_quant="yes")
    with pytest.raises(ValueError, match="unknown norm_quant 'yes'; valid: auto, on, off"):
        make_sampler(model, tok, engine="graph", norm_quant="yes")
    # auto on a bf16 model: nothing to quantize, so off (and no error)
    assert GraphSampler(model, tok, graphs=False, fused=True, norm_quant="auto").describe()["norm_quant"] is False
    assert make_sampler(model, tok, engine="graph").describe()["norm_quant"] is False


@interp_only
def test_interp_norm_quant_auto_follows_the_fp4_groups(monkeypatch, interp_nvfp4_model):
    """``norm_quant="auto"``: on where the engine holds FP4-weight groups, with no extra weight copy (their down
    projections are one-module FP4 groups already), and sampling as the engine without it up to the norm's last
    bit; off where the groups hold BF16 Ŵ copies."""
    from minite_kernels.backends.triton import TritonBackend

    monkeypatch.setattr(TritonBackend, "availability", classmethod(lambda cls, device=None: (True, "")))
    model, tok = interp_nvfp4_model
    auto = GraphSampler(model, tok, graphs=False, fused=True, norm_quant="auto", fp4_weights=True)
    off = GraphSampler(model, tok, graphs=False, fused=True, norm_quant=False, fp4_weights=True)
    deq = GraphSampler(model, tok, graphs=False, fused=True, norm_quant="auto", fp4_weights=False)
    assert auto.describe()["norm_quant"] is True and deq.describe()["norm_quant"] is False
    assert auto.describe()["packed_bytes"] == off.describe()["packed_bytes"]
    prompts = _prompts(512, INTERP_LENGTHS)
    p = SamplingParams(max_new_tokens=3, temperature=0.0)
    _agree_up_to_first_difference(off.generate(prompts, p), auto.generate(prompts, p), atol=0.05)


def _stop_scenario() -> list[dict]:
    """The bf16 compaction scenario of ``test_gpu_graph_replay_equals_eager_bf16_every_bucket`` with graphs, as
    plain data (tokens and log-probs per row)."""
    model, tok = _cuda_model(dtype=torch.bfloat16)
    prompts = _prompts(512)
    out = GraphSampler(model, tok, check_every=1).generate(prompts, _compaction_params(model, tok, prompts))
    return [{"tokens": c.token_ids, "logprobs": c.logprobs} for c in out]


@gpu
def test_gpu_new_process_draws_what_this_process_draws():
    """A resumed run is a new process: it must draw the tokens (and log-probs, bit for bit) that a process with
    another history of batch sizes, compiles and captures draws. This process first meets other batch sizes and
    sampling settings; the child process meets only the scenario."""
    import json
    import pathlib
    import subprocess
    import sys

    model, tok = _cuda_model(dtype=torch.bfloat16)
    for n, seed in ((3, 5), (5, 6), (1, 7)):
        GraphSampler(model, tok, check_every=2).generate(_prompts(512)[:n], SamplingParams(max_new_tokens=9, seed=seed))
    here = _stop_scenario()
    root = pathlib.Path(__file__).resolve().parents[2]
    code = ("import json, sys; sys.path[:0] = sys.argv[1:]; import test_graph_sampler as t; "
            "print(json.dumps(t._stop_scenario()))")
    paths = [root, root / "tests" / "rollout", root / "tests" / "support"]
    child = subprocess.run([sys.executable, "-c", code, *map(str, paths)],
                           capture_output=True, text=True, timeout=600, check=True)
    assert json.loads(child.stdout.strip().splitlines()[-1]) == here

"""precision.alignment=strict: the sampler's log-probs equal the learner's bit for bit.

CPU: fp64 reductions (``StrictMode``'s CPU way). The batch-invariant kernels (CUDA's way): on CPU under Triton's
interpreter (``interp_``), on a GPU compiled (``-m gpu``), in both sampler engines.
"""
from __future__ import annotations

import json

import pytest
import torch
from minite_test_support import interp_only

from minite_kernels import quantize_model
from minite_kernels.strict import StrictMode
from rollout import LocalSampler, SamplingParams
from trainers.learner.batch import collate
from trainers.learner.logprobs import response_logprobs

TEXTS = ["What is 3+4?", "Compute 12 * 7, please, and show the steps", "hi", "Tell me a story about a cat"]


def _gap(model, tok, prompts, strict: bool, new_tokens: int = 12, engine: str = "loop", kernels: str = "auto"):
    """(delta [B, R] learner - sampler, completions) for one rollout of the prompts (mixed lengths, one batch)."""
    from rollout import make_sampler

    ctx = StrictMode(kernels) if strict else torch.no_grad()
    with ctx, torch.no_grad():
        sampler = make_sampler(model, tok, engine=engine, alignment="strict" if strict else "default")
        comps = sampler.generate(prompts, SamplingParams(max_new_tokens=new_tokens, seed=1))
        b = collate(comps, tok.pad_token_id, model.device)
        lp, _ = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, prompt_len=b.prompt_len,
                                  with_entropy=False)
    return (lp - b.sampler_logp) * b.response_mask, comps


def _tiny(qwen3_tokenizer_dir, recipe, device="cpu", dtype="float32", backend="auto", **overrides):
    from rollout.models import tiny_random_qwen3

    shape = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3} | overrides
    m, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0, dtype=dtype, **shape)
    m.to(device)
    if recipe != "bf16":
        quantize_model(m, recipe, backend=backend)
    return m, tok


@pytest.mark.parametrize("recipe", ["nvfp4_per_token_bf16_bwd", "bf16", "mxfp8"])
def test_strict_sampler_equals_learner_and_is_batch_invariant(qwen3_tokenizer_dir, recipe):
    m, tok = _tiny(qwen3_tokenizer_dir, recipe)
    prompts = [tok.encode(t) for t in TEXTS]
    delta, _ = _gap(m, tok, prompts, strict=True)
    assert bool((delta == 0).all())
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    with StrictMode(), torch.no_grad():  # a prompt alone decodes to the same tokens and log-prob bits as batched
        batched = LocalSampler(m, tok).generate(prompts, greedy)
        alone = [LocalSampler(m, tok).generate([p], greedy)[0] for p in prompts]
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
    assert [c.logprobs for c in alone] == [c.logprobs for c in batched]


@pytest.mark.parametrize("recipe", ["nvfp4_per_token_bf16_bwd", "mxfp8"])
def test_strict_graph_decode_step_makes_no_host_trip_while_capturing(qwen3_tokenizer_dir, monkeypatch, recipe):
    """What a CUDA graph capture of the strict decode step refuses, checked on CPU: with capture simulated, the
    step (the model's modules, the emulated quantizers, strict attention, sampling) neither makes a tensor from
    host data nor reads one on the host. The step after a warm-up generate, as the engine captures it."""
    from minite_kernels import capture, strict
    from minite_kernels.capture import HostTrips
    from rollout.graph_sampler import GraphSampler

    m, tok = _tiny(qwen3_tokenizer_dir, recipe, backend="emulated")
    prompts = [tok.encode(t) for t in TEXTS]
    sampler = GraphSampler(m, tok, alignment="strict")
    params = SamplingParams(max_new_tokens=4, seed=1)
    with torch.no_grad():
        sampler.generate(prompts, params)
    seen: list[str] = []
    step = GraphSampler._step

    def traced(self, *a, **k):
        with HostTrips() as trips:
            step(self, *a, **k)
        seen.extend(trips.seen)

    monkeypatch.setattr(GraphSampler, "_step", traced)
    for module in (capture, strict):
        monkeypatch.setattr(module, "capturing", lambda: True)
    with torch.no_grad():
        sampler.generate(prompts, params)
    assert sampler.stats["eager_steps"] > 0 and seen == []


def test_default_mode_shows_the_gap_strict_removes(qwen3_tokenizer_dir):
    m, tok = _tiny(qwen3_tokenizer_dir, "nvfp4_per_token_bf16_bwd")
    delta, _ = _gap(m, tok, [tok.encode(t) for t in TEXTS], strict=False)
    assert float(delta.abs().max()) > 0  # strict mode is not a no-op by accident


def test_embedded_smollm2_nvfp4_gap_is_exactly_zero_in_strict_mode():
    """The report's setting: SmolLM2-135M under nvfp4_per_token_bf16_bwd, where the default gap is ~0.4 nats."""
    pytest.importorskip("gguf")
    from rollout.models import load_model_and_tokenizer

    m, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    quantize_model(m, "nvfp4_per_token_bf16_bwd")
    prompts = [tok.encode(t) for t in TEXTS[:3]]
    default, _ = _gap(m, tok, prompts, strict=False, new_tokens=8)
    strict, _ = _gap(m, tok, prompts, strict=True, new_tokens=8)
    assert float(default.abs().max()) > 1e-3
    assert bool((strict == 0).all())


def _strict_trainer_run(model_dir, out, device: str, steps: int) -> None:
    """A short strict ``tis_nvfp4`` run: every step logs a zero gap, and the TIS weights are exactly 1."""
    from trainers.config import load_config
    from trainers.engines.local import run_local
    from trainers.tracking import read_metrics

    cfg = load_config([f"model.path={model_dir}", f"trainer.output_dir={out}", "recipe=tis_nvfp4",
                       "precision.alignment=strict", f"model.device={device}", "rollout.prompts_per_step=2",
                       "rollout.n=2", "rollout.max_new_tokens=6", f"trainer.max_steps={steps}",
                       "logger.progress=false", "logger.wandb.mode=disabled", "algorithm.micro_batch_size=2",
                       "data.arithmetic.size=8"])
    run_local(cfg)
    rows = read_metrics(out)
    assert [r["mismatch/abs_gap_mean"] for r in rows] == [0.0] * steps
    for row in rows:  # TIS weights exp(old - sampler) are exactly 1 on every token
        assert row["rollout_corr/rollout_is_min"] == row["rollout_corr/rollout_is_max"] == 1.0
        assert row["rollout_corr/rollout_is_std"] == 0.0
    assert json.loads((out / "run_meta.json").read_text())["alignment"] == "strict"


def test_trainer_strict_run_logs_zero_gap_and_unit_tis(tiny_model_dir, tmp_path):
    _strict_trainer_run(tiny_model_dir, tmp_path / "run", "cpu", steps=1)


def test_strict_is_refused_with_verl_and_other_backends():
    from trainers.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="precision.alignment=strict runs with engine=local"):
        load_config(["precision.alignment=strict", "engine=verl"])
    with pytest.raises(ConfigError, match="Valid with strict: auto, strict, emulated"):
        load_config(["precision.alignment=strict", "precision.backend=triton"])
    with pytest.raises(ConfigError, match="valid choices"):
        load_config(["precision.alignment=exact"])
    load_config(["precision.alignment=strict", "model.device=cuda"])  # CUDA runs the batch-invariant kernels


# ---------------------------------------------------------------------- the batch-invariant kernels (CUDA's way)
def _small_vocab(tok_dir, recipe, device, backend):
    """The tiny model with one block, a 256-token vocabulary and a stand-in tokenizer (pad 0, EOS 1), and prompts
    of mixed lengths as ids: Triton's interpreter runs a 151k-row lm_head too slowly for the test suite. Narrow too
    (hidden 64, MLP 128, 2 query heads on 1 KV head): the interpreter's cost grows with the linears' k-steps and
    the attention's (row, head) programs, and every linear still reduces over k in at least 2 steps of
    ``LINEAR_BLOCKS["BLOCK_K"]`` (32), the query heads still share a KV head."""
    from types import SimpleNamespace

    m, _ = _tiny(tok_dir, "bf16", device, vocab_size=256, pad_token_id=0, eos_token_id=1, num_hidden_layers=1,
                 hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    m.generation_config.eos_token_id = 1
    if recipe != "bf16":
        quantize_model(m, recipe, backend=backend)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 256, (n,), generator=g).tolist() for n in (5, 11, 2, 8)]
    return m, SimpleNamespace(pad_token_id=0, eos_token_id=1), prompts


def _check_kernels_strict(tok_dir, device, recipe, engine, kernels, dtype="float32", small_vocab=False,
                          backend="strict"):
    """Sampler == learner bit for bit, and a prompt alone == batched, with the linears on ``backend`` (``strict``:
    the Triton quantizer where it runs; ``emulated``: pure PyTorch)."""
    if small_vocab:
        m, tok, prompts = _small_vocab(tok_dir, recipe, device, backend)
    else:
        m, tok = _tiny(tok_dir, recipe, device, dtype, backend=backend)
        prompts = [tok.encode(t) for t in TEXTS]
    delta, comps = _gap(m, tok, prompts, strict=True, new_tokens=6, engine=engine, kernels=kernels)
    assert sum(len(c.token_ids) for c in comps) > len(prompts)
    assert bool((delta == 0).all()), float(delta.abs().max())
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    from rollout import make_sampler

    with StrictMode(kernels), torch.no_grad():  # a prompt alone: the same tokens and log-prob bits as batched
        s = make_sampler(m, tok, engine=engine, alignment="strict")
        batched = s.generate(prompts, greedy)
        alone = [s.generate([p], greedy)[0] for p in prompts]
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
    assert [c.logprobs for c in alone] == [c.logprobs for c in batched]
    if engine == "graph" and device == "cuda":  # strict decode steps replay as CUDA graphs, not eagerly
        info = s.describe()
        assert info["decode"] == "cuda_graph" and info["replays"] > 0, info["eager_reason"]
    return m, tok


@interp_only
@pytest.mark.parametrize("engine", ["loop", "graph"])
def test_interp_kernels_sampler_equals_learner(qwen3_tokenizer_dir, engine):
    # the emulated quantizer: the strict backend's Triton one costs minutes in the interpreter here; its bytes and
    # batch-invariant rows are checked there by tests/minite_kernels/test_strict_backend.py, the whole sampler on GPU
    _check_kernels_strict(qwen3_tokenizer_dir, "cpu", "nvfp4_per_token_bf16_bwd", engine, "triton", small_vocab=True,
                          backend="emulated")


def test_kernels_strict_under_interpreter(run_interp_tests):
    run_interp_tests(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["graph", "loop"])
@pytest.mark.parametrize("recipe,dtype", [("nvfp4_per_token_bf16_bwd", "float32"), ("nvfp4_per_token_bf16_bwd",
                                          "bfloat16"), ("bf16", "bfloat16"), ("mxfp8", "bfloat16")])
def test_gpu_strict_sampler_equals_learner(qwen3_tokenizer_dir, engine, recipe, dtype):
    _check_kernels_strict(qwen3_tokenizer_dir, "cuda", recipe, engine, "auto", dtype)


@pytest.mark.gpu
def test_gpu_strict_on_the_emulated_backend(qwen3_tokenizer_dir):
    """precision.backend=emulated under strict alignment: the pure-PyTorch quantizer, the same guarantee."""
    _check_kernels_strict(qwen3_tokenizer_dir, "cuda", "nvfp4_per_token_bf16_bwd", "graph", "auto", "float32",
                          backend="emulated")


@pytest.mark.gpu
def test_gpu_default_mode_shows_the_gap(qwen3_tokenizer_dir):
    m, tok = _tiny(qwen3_tokenizer_dir, "nvfp4_per_token_bf16_bwd", "cuda", "bfloat16")
    delta, _ = _gap(m, tok, [tok.encode(t) for t in TEXTS], strict=False, engine="graph")
    assert float(delta.abs().max()) > 0


@pytest.mark.gpu
def test_gpu_trainer_strict_run_logs_zero_gap(tiny_model_dir, tmp_path):
    _strict_trainer_run(tiny_model_dir, tmp_path / "run", "cuda", steps=2)

"""Learner-vs-sampler alignment tools (report §4.4, §4.5)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from minite_kernels.alignment import (
    align_rows,
    compare_logprobs,
    compare_quantized,
    compare_tensor_dicts,
    compare_tensors,
)
from minite_kernels.formats import quantize_mxfp8, quantize_nvfp4


def test_compare_nvfp4_identical_and_perturbed():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    w[5, 17] = w[5, 16:32].abs().max()  # the block max: flipping its sign keeps every scale and the amax
    a, b = quantize_nvfp4(w), quantize_nvfp4(w.clone())
    c = compare_quantized(a, b)
    assert c.bit_exact and c.first_code_mismatch is None and c.max_abs_dequant_diff == 0.0
    assert c.metrics()["align/quant/bit_exact"] == 1.0
    # flip one element's sign: exactly one code differs, at (5, 17)
    w2 = w.clone()
    w2[5, 17] = -w2[5, 17]
    d = compare_quantized(a, quantize_nvfp4(w2))
    assert d.first_code_mismatch == (5, 17) and d.code_match_rate == 1 - 1 / (32 * 64)
    assert d.amax_equal and not d.bit_exact and d.max_abs_dequant_diff > 0
    # change the tensor amax: amax differs and many scales differ
    w3 = w.clone()
    w3[0, 0] = 100.0
    e = compare_quantized(a, quantize_nvfp4(w3))
    assert not e.amax_equal and e.scale_match_rate < 0.5 and e.first_scale_mismatch == (0, 0)


def test_compare_quantized_errors_and_mxfp8():
    w = torch.randn(4, 64)
    with pytest.raises(ValueError, match="scaling differs"):
        compare_quantized(quantize_nvfp4(w), quantize_nvfp4(w, scaling="per_token"))
    with pytest.raises(ValueError, match="shapes differ"):
        compare_quantized(quantize_nvfp4(w), quantize_nvfp4(w[:2]))
    with pytest.raises(TypeError, match="one format"):
        compare_quantized(quantize_nvfp4(w), quantize_mxfp8(w))
    m = compare_quantized(quantize_mxfp8(w), quantize_mxfp8(w))
    assert m.bit_exact and m.n_elements == 256


def test_compare_logprobs_worked_example():
    learner = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.0, -2.5, -0.4]])
    mask = torch.tensor([[1, 1, 0]])
    r = compare_logprobs(learner, sampler, mask)
    # delta over masked tokens = [0, 0.5]
    assert r.n_tokens == 2 and r.n_nonfinite == 0
    assert r.mean_gap == 0.25 and r.mean_abs_gap == 0.25 and r.max_abs_gap == 0.5
    assert r.frac_exact == 0.5 and r.first_mismatch == (0, 1)
    assert r.k3_kl == pytest.approx((math.exp(0.5) - 1.5) / 2, abs=1e-12)  # 0.0743606
    assert r.p50_abs_gap == pytest.approx(0.25)
    x = torch.rand(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    big = compare_logprobs(x, torch.zeros_like(x))
    qs = torch.quantile(x, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    assert [big.p50_abs_gap, big.p90_abs_gap, big.p99_abs_gap] == pytest.approx(qs, abs=1e-15)
    m = r.metrics()
    assert m["align/logp/mean_abs_gap"] == 0.25 and "align/logp/first_mismatch" not in m


def test_compare_logprobs_nonfinite_and_errors():
    learner = torch.tensor([-float("inf"), -1.0, -2.0])
    sampler = torch.tensor([-float("inf"), -1.0, -1.0])
    r = compare_logprobs(learner, sampler)
    assert r.n_tokens == 3 and r.n_nonfinite == 1 and r.frac_exact == pytest.approx(2 / 3)
    assert r.max_abs_gap == 1.0
    with pytest.raises(ValueError, match="shapes differ"):
        compare_logprobs(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="no tokens"):
        compare_logprobs(torch.zeros(3), torch.zeros(3), torch.zeros(3))


def test_learner_vs_sampler_linear_models_layerwise():
    # two copies of a small model; the "sampler" quantizes its weights through a different path (bf16 cast
    # first) -> compare captured outputs layer by layer and find the first divergent layer
    torch.manual_seed(0)
    learner = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    x = torch.randn(4, 32)
    w0 = learner[0].weight.detach()
    ql = quantize_nvfp4(w0)
    qs = quantize_nvfp4(w0.bfloat16())
    cmp = compare_quantized(ql, qs)
    # rounding the weight to bf16 first changes the amax (its bf16 value) and 3 of 1024 codes (seed 0)
    assert not cmp.amax_equal and cmp.code_match_rate == 1 - 3 / 1024 and cmp.scale_match_rate == 1.0
    with torch.no_grad():
        h_l = x @ ql.dequantize().T
        h_s = x @ qs.dequantize().T
        y_l, y_s = learner[1](h_l), learner[1](h_s)
    res = compare_tensor_dicts({"0": h_l, "1": y_l, "only_l": x}, {"0": h_s, "1": y_s})
    assert res["first_divergent"] == "0" and not res["per_name"]["1"].bit_exact
    assert res["missing"] == ["only_l"]
    lp_l = torch.log_softmax(y_l, -1).gather(1, torch.zeros(4, 1, dtype=torch.long)).squeeze(1)
    lp_s = torch.log_softmax(y_s, -1).gather(1, torch.zeros(4, 1, dtype=torch.long)).squeeze(1)
    r = compare_logprobs(lp_l, lp_s)
    assert r.n_tokens == 4 and r.max_abs_gap >= r.mean_abs_gap >= 0


def test_compare_tensors_bitwise():
    a = torch.tensor([1.0, float("nan"), -0.0])
    assert compare_tensors(a, a.clone()).bit_exact
    b = torch.tensor([1.0, float("nan"), 0.0])  # -0.0 vs 0.0 differ in bits
    c = compare_tensors(a, b)
    assert not c.bit_exact and c.first_mismatch == (2,) and c.max_abs_diff == 0.0
    with pytest.raises(ValueError, match="same shape and dtype"):
        compare_tensors(a, a.double())


def test_align_rows():
    x = torch.arange(12.0).view(4, 3)
    ids = torch.tensor([7, 3, 9, 1])
    ref = torch.tensor([1, 3, 7, 9])
    out = align_rows(x, ids, ref)
    assert torch.equal(out, x[[3, 1, 0, 2]])
    with pytest.raises(ValueError, match="permutations"):
        align_rows(x, ids, torch.tensor([1, 3, 7, 8]))
    with pytest.raises(ValueError, match="permutations"):
        align_rows(x, torch.tensor([1, 1, 3, 7]), torch.tensor([1, 1, 3, 7]))


# --- execution_gap and `python -m minite_kernels align` ----------------------------------------------------------
def _tiny_nvfp4(qwen3_tokenizer_dir):
    from minite_kernels import quantize_model
    from rollout.models import tiny_random_qwen3

    m, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0, hidden_size=128, intermediate_size=256,
                               num_hidden_layers=3)
    quantize_model(m, "nvfp4_per_token_bf16_bwd")
    return m, tok


def test_execution_gap_default_vs_strict(qwen3_tokenizer_dir):
    from minite_kernels.alignment import execution_gap
    from minite_kernels.strict import StrictMode

    m, tok = _tiny_nvfp4(qwen3_tokenizer_dir)
    seqs = [tok.encode("What is 3+4? The answer is seven, because"), tok.encode("hi there my friend")]
    default = execution_gap(m, seqs, [5, 2])
    assert [g.layer for g in default.layers] == [0, 1, 2, 3]
    assert default.layers[0].max_abs == 0  # the embeddings are a lookup: the same in both shapes
    assert default.first_diff_layer == 1 and default.logprob.n_tokens == sum(len(s) - p for s, p in zip(seqs, [5, 2]))
    with StrictMode():
        strict = execution_gap(m, seqs, [5, 2])
    assert strict.first_diff_layer is None and strict.first_code_diff_layer is None
    assert strict.logprob.max_abs_gap == 0 and all(g.max_abs == 0 for g in strict.layers)
    with pytest.raises(ValueError, match="prompt length 9 must be in"):
        execution_gap(m, seqs[1:], [9])


def test_align_cli_json(qwen3_tokenizer_dir, tmp_path, capsys):
    from minite_kernels.cli import main
    from rollout.models import tiny_random_qwen3

    m, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)
    m.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    assert main(["align", "--model", str(tmp_path / "m"), "--new-tokens", "4", "--prompt", "hello there",
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["recipe"] == "nvfp4_per_token_bf16_bwd"
    assert rep["strict"]["first_diff_layer"] is None and rep["strict"]["logprob"]["max_abs_gap"] == 0
    assert len(rep["default"]["layers"]) == m.config.num_hidden_layers + 1
    assert main(["align", "--model", str(tmp_path / "m"), "--recipe", "nvfp4_pertoken"]) == 2

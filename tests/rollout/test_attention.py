"""Decode attention: the Triton split-K kernel against SDPA with a mask (interpreter on CPU, compiled on GPU)."""
from __future__ import annotations

import pytest
import torch
from minite_test_support import interp_only

from rollout.attention import decode_attention_ref, num_splits, valid_mask

CASES = [  # B, Hkv, rep, D, S, splits
    (3, 2, 2, 16, 40, None),
    (2, 3, 3, 64, 130, 3),  # SmolLM2's rep 3, a split boundary inside a tile
    (1, 1, 1, 16, 5, 1),
    (2, 2, 4, 32, 200, 7),  # more splits than the valid range needs: empty splits combine to nothing
]


def _check(device: str, dtype: torch.dtype, atol: float) -> None:
    from rollout.attention import decode_attention

    g = torch.Generator().manual_seed(0)
    for b, h, rep, d, s, splits in CASES:
        q = torch.randn(b, h, rep, d, generator=g).to(device, dtype)
        kc = torch.randn(b, h, s + 9, d, generator=g).to(device, dtype)  # a cache longer than the view
        vc = torch.randn(b, h, s + 9, d, generator=g).to(device, dtype)
        k, v = kc[:, :, :s], vc[:, :, :s]
        start = torch.randint(0, s // 2, (b,), generator=g).to(device)
        end = torch.tensor([s - 1], device=device)
        ref = decode_attention_ref(q.float(), k.float(), v.float(), valid_mask(start, end, s), d ** -0.5)
        got = decode_attention(q, k, v, start, end, d ** -0.5, splits=splits)
        assert got.dtype == dtype and got.shape == q.shape
        torch.testing.assert_close(got.float(), ref, atol=atol, rtol=0)


def test_valid_mask_and_splits():
    m = valid_mask(torch.tensor([0, 2]), torch.tensor([4]), 5)
    assert m.tolist() == [[True, True, True, True, False], [False, False, True, True, False]]
    assert num_splits(64, 8, 384) == 1 and num_splits(1, 8, 384) == 6 and num_splits(1, 1, 64) == 1


@interp_only
def test_interp_kernel_matches_sdpa_fp32():
    pytest.importorskip("triton")
    _check("cpu", torch.float32, atol=1e-5)


@interp_only
def test_interp_engine_with_triton_attention_matches_the_loop(tiny_model):
    pytest.importorskip("triton")
    from rollout import GraphSampler, LocalSampler, SamplingParams

    model, tok = tiny_model
    prompts = [tok.encode("a b c"), tok.encode("one"), tok.encode("a much longer prompt with many more tokens")]
    p = SamplingParams(max_new_tokens=6, seed=1)
    ref = LocalSampler(model, tok).generate(prompts, p)
    got = GraphSampler(model, tok, attention="triton").generate(prompts, p)
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    for r, c in zip(ref, got):
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)


def test_attention_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_gpu_kernel_matches_sdpa(dtype, atol):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("triton")
    _check("cuda", dtype, atol)

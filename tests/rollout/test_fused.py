"""The decode step's fused functions (``rollout/fused.py``): compiled (inductor's C++ on the CPU, Triton on CUDA:
``-m gpu`` on the H200), they compute what they compute eagerly."""
from __future__ import annotations

import pytest
import torch

from rollout.fused import FUNCTIONS, compiled

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_rope_store_writes_the_cache_slot_in_place(device):
    """``qk_norm_rope_store`` under ``torch.compile`` (inductor, here for the CPU) writes k and v into the slot of
    the cache views it is given, the caller's own storage (two views of one cache tensor, as the engine's), and
    leaves every other slot as it was; q and the written values equal the eager function's (fp32: reduction
    order only)."""
    g = torch.Generator().manual_seed(0)
    b, hq, hkv, d, s = 3, 4, 2, 16, 7
    q, k, v = (torch.randn(b, 1, h, d, generator=g).to(device) for h in (hq, hkv, hkv))
    wq, wk = torch.randn(d, generator=g).to(device), torch.randn(d, generator=g).to(device)
    cos, sin = torch.randn(b, 1, d, generator=g).to(device), torch.randn(b, 1, d, generator=g).to(device)
    slot = torch.tensor([4], device=device)
    outs = []
    for fn in (FUNCTIONS["qk_norm_rope_store"], compiled("qk_norm_rope_store")):
        cache = torch.full((2, b, hkv, s, d), -7.0, device=device)
        q_out = fn(q, k, v, wq, wk, 1e-6, cos, sin, cache[0], cache[1], slot)
        outs.append((q_out, cache))
    (q_eager, want), (q_comp, got) = outs
    torch.testing.assert_close(q_comp, q_eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1, :, :, 4], v.transpose(1, 2)[:, :, 0])  # v is copied, not computed
    others = torch.ones(s, dtype=torch.bool, device=device)
    others[4] = False
    assert (got[:, :, :, others] == -7.0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 50, 0.9), (0.0, -1, 1.0)])
def test_compiled_draw_matches_eager(temperature, top_k, top_p, device):
    """The draw compiled (inductor, here for the CPU) takes the tokens the eager draw takes and their log-probs
    within a few fp32 ulps (its softmax reduces in another order)."""
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(6, 3000, generator=g) * 4).to(device=device, dtype=torch.bfloat16)
    key, rows, step = (torch.tensor(x, device=device) for x in (0x2545F491, [0, 5, 2, 9, 4, 1], 7))
    want = FUNCTIONS["draw"](logits, temperature, top_k, top_p, key, rows, step)
    got = compiled("draw")(logits, temperature, top_k, top_p, key, rows, step)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-5)


def test_compiled_functions_take_more_variants_than_dynamos_default():
    """More than Dynamo's default of 8 variants of one function in one process (dtypes x sampling settings)
    compile instead of failing the ``fullgraph`` call."""
    from rollout.fused import RECOMPILE_LIMIT

    fn = compiled("silu_mul")
    assert RECOMPILE_LIMIT > 8
    for i in range(10):  # one variant per dtype x rank
        dt = (torch.float32, torch.float64)[i % 2]
        x = torch.ones((2,) * (1 + i // 2), dtype=dt)
        torch.testing.assert_close(fn(x, x), FUNCTIONS["silu_mul"](x, x))


@pytest.mark.gpu
def test_gpu_compiled_bits_do_not_depend_on_the_batches_met_before():
    """A compiled function gives an input the same bits whatever the process called it with before. The engine's
    pattern: bf16 cache views of an 8-row cache at batch 8, then 4, 2 and 1 as rows finish, then 8 again in the
    next call. With overlapping dynamic-shape entries the second batch-8 call ran another kernel than the first
    and wrote other bf16 keys on the H200."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    rows, hq, hkv, d, s = 8, 4, 2, 16, 128
    dt, dev = torch.bfloat16, "cuda"
    q, k, v = (torch.randn(rows, 1, h, d, generator=g).to(dev, dt) for h in (hq, hkv, hkv))
    wq, wk = (torch.randn(d, generator=g).to(dev, dt) for _ in range(2))
    cos, sin = (torch.randn(rows, 1, d, generator=g).to(dev, dt) for _ in range(2))
    slot = torch.tensor([4], device=dev)
    fn = compiled("qk_norm_rope_store")

    def call(b):
        cache = torch.zeros(2, rows, hkv, s, d, dtype=dt, device=dev)
        return fn(q[:b], k[:b], v[:b], wq, wk, 1e-6, cos[:b], sin[:b], cache[0, :b], cache[1, :b], slot), cache

    first = call(8)
    for b in (4, 2, 1):
        call(b)
    again = call(8)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])

"""minite's quantized linears under FSDP2 (``fully_shard``), as verl's FSDP engine runs them (engine=verl): the
model is patched before it is sharded, FSDP2 swaps each parameter for a DTensor shard and, in every forward,
for a freshly all-gathered (and, with mixed precision, freshly cast) tensor. The quantized-weight caches must
follow those tensors: after each optimizer step the sharded model computes exactly what a fresh patched model
with the same full weights computes. One process, world size 1, gloo on CPU."""
from __future__ import annotations

import copy
import pathlib

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "qwen3_tokenizer"


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("param_dtype", [None, torch.bfloat16], ids=["fp32", "mixed_bf16"])
def test_fsdp2_sharded_patched_model_follows_its_weights_through_optimizer_steps(process_group, param_dtype):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from minite_kernels import quantize_model
    from rollout.models import tiny_random_qwen3

    base, _ = tiny_random_qwen3(ASSETS, seed=0, dtype="float32")
    recipe = "nvfp4_per_token_bf16_bwd"
    model = copy.deepcopy(base)
    assert len(quantize_model(model, recipe).swapped) > 0  # patched first, then sharded (verl_patch's order)
    mesh = init_device_mesh("cpu", (1,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    assert type(next(model.parameters())).__name__ == "DTensor"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, base.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))

    seen = []
    for step in range(3):
        logits = model(x).logits
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        fresh = copy.deepcopy(base)
        fresh.load_state_dict(full)
        if param_dtype is not None:  # what FSDP2's mixed precision computes with: the parameters cast (buffers,
            for p in fresh.parameters():  # e.g. the rotary frequencies, stay fp32)
                p.data = p.data.to(param_dtype)
        quantize_model(fresh, recipe)
        with torch.no_grad():
            expected = fresh(x).logits
        assert torch.equal(logits.detach(), expected), f"step {step}: {(logits - expected).abs().max().item()}"
        seen.append(expected)
        logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    # the steps changed the weights, so a cache that kept the first step's weights would have failed above
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])

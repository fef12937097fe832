"""``ModelWeightSync``: grouped re-quantization of a model's linear weights after the optimizer step.

After a sync, every eligible module must compute exactly what it would have computed by re-quantizing its own
weight (same bytes, so same outputs), without re-quantizing on its forward; ineligible modules are listed
with a reason and keep their own path. Kernels run under Triton's interpreter (subprocess) and on a GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from minite_test_support import interp_only

from minite_kernels.modules import Linear
from minite_kernels.optim import AdamW
from minite_kernels.recipes import get_qlinear_params

LANE = "nvfp4_per_token_bf16_bwd"


def _model(device, backend):
    torch.manual_seed(0)
    r = get_qlinear_params(LANE, env={})
    layers = torch.nn.ModuleDict(
        {
            "q": Linear(32, 48, qlinear_params=r, backend=backend, device=device, dtype=torch.bfloat16),
            "k": Linear(
                32, 16, bias=False, qlinear_params=r, backend=backend, device=device, dtype=torch.bfloat16
            ),
            "o": Linear(48, 32, qlinear_params=r, backend=backend, device=device, dtype=torch.bfloat16),
            "bf16": Linear(
                32, 16, qlinear_params=get_qlinear_params("bf16", env={}), device=device, dtype=torch.bfloat16
            ),
            "fp32": Linear(32, 16, qlinear_params=r, backend=backend, device=device, dtype=torch.float32),
        }
    )
    return layers


def _forward(layers, x):
    return [layers[n](x if n != "o" else layers["q"](x)) for n in ("q", "k", "o")]


def _sync_matches_own_requantization(device, backend, cuda_graph):
    from minite_kernels.modules.weight_sync import ModelWeightSync

    layers = _model(device, backend)
    x = torch.randn(20, 32, device=device, dtype=torch.bfloat16)
    opt = AdamW(layers.parameters(), lr=1e-2)
    sync = ModelWeightSync(layers, opt, cuda_graph=cuda_graph)
    assert sync.num_weights == 3
    assert dict(sync.skipped).keys() == {"bf16", "fp32"}
    assert "keeps the fprop weight in BF16" in dict(sync.skipped)["bf16"]
    assert "torch.float32" in dict(sync.skipped)["fp32"]
    assert sync.unsynced == ["fp32"]  # the BF16 recipe's weight needs no quantization at all
    for _step in range(1 if device == "cpu" else 3):
        layers.zero_grad()
        sum(y.float().square().sum() for y in _forward(layers, x)).backward()
        opt.step()
        own = copy.deepcopy(
            layers
        )  # fresh weight caches: each module quantizes its own weight on the forward
        metrics = sync.sync()
        assert metrics == {"perf/grouped_sync_weights": 3.0, "perf/sync_amax_from_optimizer": 3.0}
        misses = {n: layers[n]._weight_cache.misses for n in ("q", "k", "o")}
        with torch.no_grad():
            ours, theirs = _forward(layers, x), _forward(own, x)
        for a, b in zip(ours, theirs):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert {n: layers[n]._weight_cache.misses for n in ("q", "k", "o")} == misses  # nothing re-quantized
        assert all(own[n]._weight_cache.misses > 0 for n in ("q", "k", "o"))


def test_weight_sync_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
def test_interp_sync_matches_own_requantization():
    from minite_kernels.backends.triton import TritonBackend

    _sync_matches_own_requantization("cpu", TritonBackend("cpu"), cuda_graph=False)


def test_emulated_backend_modules_are_skipped_with_the_reason():
    from minite_kernels.modules.weight_sync import ModelWeightSync

    layers = torch.nn.ModuleDict(
        {"q": Linear(32, 16, qlinear_params=LANE, backend="emulated", dtype=torch.bfloat16)}
    )
    sync = ModelWeightSync(layers)
    assert sync.num_weights == 0 and sync.sync()["perf/grouped_sync_weights"] == 0.0
    ((name, why),) = sync.skipped
    assert name == "q" and "the emulated backend has no grouped weight re-quantizer" in why


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_gpu_sync_matches_own_requantization(cuda_graph):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _sync_matches_own_requantization("cuda", "triton", cuda_graph)

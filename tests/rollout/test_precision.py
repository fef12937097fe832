"""``rollout.precision``: one way to patch a model with a recipe and to re-make its quantized weights after an
in-place update, shared by the local engine and the minite rollout of ``engine=verl``."""
from __future__ import annotations

import types

import pytest
import torch

from rollout.precision import Requantizer, patch_precision, weight_cache_misses


class _Model(torch.nn.Module):
    def __init__(self, calls):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls = calls

    def forward(self, **kw):
        self.calls.append(kw)


@pytest.mark.parametrize("unsynced", [[], ["model.layers.0.mlp.down_proj"]])
def test_the_one_token_forward_runs_only_for_weights_the_grouped_sync_left(unsynced):
    """After the grouped weight sync, the 1-token forward (which makes modules re-quantize their own weights)
    runs only if some quantized weight was left out of the grouped sync."""
    calls = []
    req = Requantizer(_Model(calls), pad_id=0)
    req.triton_ok = True
    req._grouped = types.SimpleNamespace(unsynced=unsynced, sync=lambda: {"perf/grouped_sync_weights": 3.0})
    metrics = req()
    assert metrics["perf/grouped_sync_weights"] == 3.0
    assert len(calls) == (1 if unsynced else 0)
    assert metrics["perf/requantized_weights"] == 0.0  # the stand-in model has no quantized weight cache
    if unsynced:
        assert calls[0]["input_ids"].tolist() == [[0]] and calls[0]["use_cache"] is False


def test_without_the_triton_kernels_the_forward_requantizes_and_is_counted(tiny_model_dir):
    """On the CPU the grouped sync does not run: the forward re-quantizes every quantized weight whose parameter
    changed, and the count is the caches' misses."""
    from rollout.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir, dtype="float32", device="cpu")
    rep = patch_precision(model, "nvfp4_per_token_w1x16_bf16_bwd", exclude=("lm_head",))
    assert rep["patched"] and rep["quantized_layers"] > 0
    req = Requantizer(model, pad_id=tok.pad_token_id or 0)
    assert not req.triton_ok
    req()  # the first forward quantizes every weight once
    assert req()["perf/requantized_weights"] == 0.0  # nothing changed: nothing re-quantized
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
    before = weight_cache_misses(model)
    assert req()["perf/requantized_weights"] == 1.0
    assert weight_cache_misses(model) == before + 1


def test_bf16_leaves_the_model_alone():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    assert patch_precision(model, "bf16") == {"recipe": "bf16", "patched": False,
                                              "note": "plain torch linears in the model's dtype"}
    assert type(model[0]) is torch.nn.Linear


def test_a_recipes_fields_patch_with_that_exact_recipe():
    """What ``engine=verl`` sends its rollout workers: the fields of a recipe the worker never registered."""
    import dataclasses

    from minite_kernels.recipes import PrecisionRecipe, get_qlinear_params

    custom = dataclasses.replace(get_qlinear_params("nvfp4_per_token_w1x16_bf16_bwd"), name="only_in_the_driver")
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
    rep = patch_precision(model, custom.to_dict())
    assert rep["patched"] and rep["recipe"] == "only_in_the_driver" and rep["quantized_layers"] == 2
    assert all(m.qlinear_params == custom for m in model)
    with pytest.raises(ValueError, match="nvfp5"):
        patch_precision(torch.nn.Sequential(torch.nn.Linear(32, 32)),
                        {**custom.to_dict(), "fprop": {**custom.to_dict()["fprop"],
                                                       "a": {**custom.to_dict()["fprop"]["a"], "format": "nvfp5"}}})
    assert PrecisionRecipe.from_dict(custom.to_dict()) == custom

"""Linear: nn.Linear compatibility, recipe-controlled backward semantics, weight cache, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minite_kernels.formats import quantize_nvfp4
from minite_kernels.modules import Linear
from minite_kernels.recipes import get_qlinear_params, recipe_names

ENV: dict[str, str] = {}  # recipes resolved without the caller's environment


def recipe(name: str, **env: str):
    return get_qlinear_params(name, env=env)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def grads(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 5, 64, generator=g), torch.randn(6, 5, 96, generator=g)


@pytest.mark.parametrize("name", ["bf16", "nvfp4_per_token", "mxfp8"])
def test_state_dict_equals_nn_linear(name):
    torch.manual_seed(0)
    ref = nn.Linear(64, 96)
    layer = Linear(64, 96, qlinear_params=recipe(name))
    assert list(layer.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(3, 64)
    layer(x)  # fills the quantized-weight cache (when quantized) ...
    sd = layer.state_dict()  # ... which must not leak into the state dict
    assert list(sd) == ["weight", "bias"] and all(torch.equal(sd[k], ref.state_dict()[k]) for k in sd)
    assert not list(layer.buffers())


def test_meta_device_construction_then_materialize():
    layer = Linear(
        64,
        96,
        bias=False,
        device="meta",
        params_dtype=torch.bfloat16,
        qlinear_params=recipe("nvfp4_per_token"),
    )
    assert layer.weight.is_meta and layer.weight.dtype == torch.bfloat16
    layer.to_empty(device="cpu")
    src = nn.Linear(64, 96, bias=False, dtype=torch.bfloat16)
    layer.load_state_dict(src.state_dict())
    assert layer(torch.randn(2, 64, dtype=torch.bfloat16)).shape == (2, 96)
    on_meta = Linear.from_linear(nn.Linear(64, 96, device="meta"), "mxfp8")
    assert on_meta.weight.is_meta


def test_report_example_signature():
    # report §7.1: Linear(1024, 1024, bias=False, params_dtype=..., device=..., qlinear_params=params)
    params = recipe("nvfp4_per_token")
    layer = Linear(32, 32, bias=False, params_dtype=torch.float32, device="cpu", qlinear_params=params)
    assert layer.qlinear_params is params and layer.bias is None


def test_from_linear_shares_parameters():
    ref = nn.Linear(32, 16)
    layer = Linear.from_linear(ref, "nvfp4_per_tensor")
    assert layer.weight is ref.weight and layer.bias is ref.bias
    assert isinstance(layer, nn.Linear)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_recipe_is_exactly_nn_linear(data, dtype):
    x, dy = (t.to(dtype) for t in data)
    ref = nn.Linear(64, 96, dtype=dtype)
    layer = Linear.from_linear(ref, recipe("bf16"))
    ours = grads(layer, x, dy)
    theirs = grads(ref, x, dy)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


# "BF16 backward equals the unquantized backward given the same forward", made precise:
#   (1) DISABLE_BACKWARD_QUANT=1 (backward_operands="original"): for the same dY, dX = dY·W and dW = dYᵀ·X
#       bit-for-bit equal to autograd of F.linear(X, W) (the unquantized layer);
#   (2) nvfp4_per_token_bf16_bwd (backward_operands="dequantized_forward"): dX = dY·Ŵ and dW = dYᵀ·X̂, bit-for-bit
#       equal to autograd of F.linear(X̂, Ŵ) with X̂, Ŵ the dequantized forward operands (STE).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_bypass_equals_unquantized_backward(data, dtype):
    x, dy = (t.to(dtype) for t in data)
    r = recipe("nvfp4_per_token", DISABLE_BACKWARD_QUANT="1")
    assert r.backward_bypass
    ref = nn.Linear(64, 96, dtype=dtype)
    layer = Linear.from_linear(ref, r)
    y, dx, dw, db = grads(layer, x, dy)
    xr = x.clone().requires_grad_()
    yr = F.linear(xr, ref.weight, ref.bias)
    dx_ref, dw_ref, db_ref = torch.autograd.grad(yr, (xr, ref.weight, ref.bias), dy)
    assert torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref) and torch.equal(db, db_ref)
    assert rel(y, yr) > 1e-3  # ... while the forward really is NVFP4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_bwd_recipe_is_ste_gradient_of_quantized_forward(data, dtype):
    x, dy = (t.to(dtype) for t in data)
    ref = nn.Linear(64, 96, bias=False, dtype=dtype)
    layer = Linear.from_linear(ref, recipe("nvfp4_per_token_bf16_bwd"))
    y, dx, dw, _ = grads(layer, x, dy)
    x_hat = quantize_nvfp4(x.reshape(-1, 64), scaling="per_token").dequantize(dtype).reshape(x.shape)
    w_hat = quantize_nvfp4(ref.weight.detach(), tile=(16, 16)).dequantize(dtype)
    xh, wh = x_hat.clone().requires_grad_(), w_hat.clone().requires_grad_()
    yh = F.linear(xh, wh)
    dx_ref, dw_ref = torch.autograd.grad(yh, (xh, wh), dy)
    assert torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref)
    # forward: the emulated GEMM multiplies the fp32 dequantized operands, then casts to the activation dtype
    x32 = quantize_nvfp4(x.reshape(-1, 64), scaling="per_token").dequantize().reshape(x.shape)
    w32 = quantize_nvfp4(ref.weight.detach(), tile=(16, 16)).dequantize()
    torch.testing.assert_close(y, F.linear(x32, w32).to(dtype), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4_per_token_mxfp8_bwd"])
def test_mxfp8_backward_error(name):
    # Measured here: rel-L2 of dX and dW vs the exact fp32 gradients ≈ 3e-2 (E4M3 has 3 mantissa bits; both
    # operands rounded), an order of magnitude below NVFP4's ≈ 0.15-0.2.
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(128, 256, generator=g), torch.randn(128, 128, generator=g)
    ref = nn.Linear(256, 128, bias=False)
    layer = Linear.from_linear(ref, recipe(name))
    _, dx, dw, _ = grads(layer, x, dy)
    dx_ref, dw_ref = dy @ ref.weight.detach(), dy.t() @ x
    for got, want in ((dx, dx_ref), (dw, dw_ref)):
        assert 5e-3 < rel(got, want) < 5e-2
    _, dx4, _, _ = grads(Linear.from_linear(ref, recipe("nvfp4_per_token")), x, dy)
    assert rel(dx4, dx_ref) > 3 * rel(dx, dx_ref)


@pytest.mark.parametrize("name", sorted(set(recipe_names())))
def test_every_recipe_runs_forward_backward_any_leading_dims(name, data):
    x, dy = data
    layer = Linear(64, 96, qlinear_params=recipe(name))
    y, dx, dw, db = grads(layer, x, dy)
    assert y.shape == (6, 5, 96) and dx.shape == x.shape and dw.shape == (96, 64) and db.shape == (96,)
    assert all(torch.isfinite(t).all() for t in (y, dx, dw, db))
    flat = layer(x.reshape(30, 64)).reshape(6, 5, 96)
    assert torch.equal(flat, y)
    with torch.no_grad():
        assert torch.equal(layer(x), y)


def test_per_token_row_independence():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, generator=g) * torch.logspace(-3, 3, 8).unsqueeze(1)
    # rows span 6 decades: per-token scaling quantizes each row as if alone (only GEMM summation order may
    # differ between M=1 and M=8); per-tensor scaling lets the largest row crush the small ones
    tok = Linear(64, 32, bias=False, qlinear_params=recipe("nvfp4_per_token"))
    ten = Linear.from_linear(tok, recipe("nvfp4_per_tensor"))
    with torch.no_grad():
        batch, batch_ten = tok(x), ten(x)
        for i in range(8):
            scale = batch[i].abs().max().item()
            torch.testing.assert_close(tok(x[i : i + 1]), batch[i : i + 1], rtol=1e-5, atol=1e-6 * scale)
        assert rel(ten(x[:1]), batch_ten[:1]) > 0.5  # row 0 (scale 1e-3) underflows inside the batch


def test_stochastic_rounding_backward_reproducible_with_generator(data):
    x, dy = data
    layer = Linear(64, 96, qlinear_params=recipe("nvfp4_per_token"))
    layer.generator = torch.Generator().manual_seed(7)
    first = grads(layer, x, dy)
    layer.generator = torch.Generator().manual_seed(7)
    again = grads(layer, x, dy)
    layer.generator = torch.Generator().manual_seed(8)
    other = grads(layer, x, dy)
    assert torch.equal(first[1], again[1]) and torch.equal(first[2], again[2])
    assert not torch.equal(first[1], other[1])  # SR draws differ with another seed


def test_weight_cache_requantizes_after_optimizer_step(data):
    x, dy = data
    layer = Linear(64, 96, qlinear_params=recipe("nvfp4_per_token"))
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    cache = layer._weight_cache
    y0 = layer(x.clone().requires_grad_())
    y0.backward(dy)
    misses = cache.misses
    assert misses == 2  # fprop W and dgrad Wᵀ, quantized once each
    with torch.no_grad():
        assert torch.equal(layer(x), y0.detach())
    assert cache.misses == misses  # no re-quantization without a weight change
    opt.step()
    with torch.no_grad():
        y1 = layer(x)
    assert cache.misses == misses + 1 and not torch.equal(y1, y0.detach())
    fresh = Linear.from_linear(nn.Linear(64, 96), recipe("nvfp4_per_token"))
    fresh.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(x), y1)  # the cache held exactly the quantization of the new weight


def test_weight_cache_follows_a_rewrite_that_keeps_the_version_once_an_optimizer_steps():
    """FSDP2's pattern: the weight's storage is rewritten at the same address with its version counter
    preserved, so (pointer, version) cannot tell; the optimizer step in between does (any optimizer, minite's
    AdamW included), and the next call quantizes the new values."""
    from minite_kernels.modules.weight_cache import optimizer_epoch
    from minite_kernels.optim import AdamW

    layer = Linear(32, 16, qlinear_params=recipe("nvfp4_per_token"))
    x = torch.randn(4, 32)
    new = torch.randn(16, 32)
    with torch.no_grad():
        before = layer(x)
        with torch.autograd._unsafe_preserve_version_counter(layer.weight):
            layer.weight.copy_(new)
        assert torch.equal(layer(x), before)  # no step yet: the cache cannot see the rewrite (documented)
    epoch = optimizer_epoch()
    AdamW(layer.parameters(), lr=0.0).step()  # no gradients: the weights stay, the step still counts
    assert optimizer_epoch() == epoch + 1
    fresh = Linear(32, 16, qlinear_params=recipe("nvfp4_per_token"))
    with torch.no_grad():
        fresh.weight.copy_(new)
        fresh.bias.copy_(layer.bias)
        assert torch.equal(layer(x), fresh(x))


def test_load_state_dict_invalidates_cache():
    layer = Linear(32, 16, qlinear_params=recipe("nvfp4_per_tensor"))
    x = torch.randn(4, 32)
    with torch.no_grad():
        before = layer(x)
        layer.load_state_dict(nn.Linear(32, 16).state_dict())
        assert not torch.equal(layer(x), before)


@pytest.mark.parametrize("in_f, out_f, match", [(40, 32, "in_features=40"), (32, 20, "out_features=20")])
def test_unaligned_features_raise(in_f, out_f, match):
    with pytest.raises(ValueError, match=match):
        Linear(in_f, out_f, qlinear_params=recipe("nvfp4_per_token"))
    Linear(in_f, out_f, qlinear_params=recipe("bf16"))  # BF16 has no block constraint


def test_bad_input_shape_and_recipe():
    layer = Linear(32, 16, qlinear_params=recipe("nvfp4_per_token"))
    with pytest.raises(ValueError, match="32"):
        layer(torch.randn(4, 96))
    with pytest.raises(ValueError, match="did you mean 'mxfp8'\\?"):
        Linear(32, 32, qlinear_params="mxfp9")
    with pytest.raises(ValueError, match="disagree"):
        Linear(32, 32, dtype=torch.float32, params_dtype=torch.bfloat16)


def test_env_selection(monkeypatch):
    monkeypatch.setenv("MINITE_RECIPE", "mxfp8")
    monkeypatch.delenv("DISABLE_BACKWARD_QUANT", raising=False)
    assert Linear(32, 32).qlinear_params.name == "mxfp8"
    assert Linear(32, 32, qlinear_params="bf16").qlinear_params.name == "bf16"  # explicit wins


def test_bf16_backward_caches_no_high_precision_weight(data):
    x, dy = data
    layer = Linear(64, 96, qlinear_params=recipe("nvfp4_per_token_bf16_bwd"))
    grads(layer, x, dy)
    assert len(layer._weight_cache) == 1  # only the NVFP4 fprop weight; Ŵ is rebuilt from it in backward


def test_set_quantized_weight_is_used_until_the_weight_changes(data):
    x, _ = data
    layer = Linear(64, 96, qlinear_params=recipe("nvfp4_per_token"))
    with torch.no_grad():
        y = layer(x)
    other = quantize_nvfp4(torch.randn(96, 64), tile=(16, 16))
    layer.set_quantized_weight(other)
    with torch.no_grad():
        y_other = layer(x)
        assert not torch.equal(y_other, y)
        layer.invalidate_quantized_weights()
        assert torch.equal(layer(x), y)
    with pytest.raises(ValueError, match="not made with"):
        layer.set_quantized_weight(quantize_nvfp4(torch.randn(96, 64)))


@pytest.mark.parametrize("recipe", ["bf16", "nvfp4_per_token_w1x16_bf16_bwd"])
def test_integer_input_is_refused_like_nn_linear(recipe):
    from minite_kernels.modules import Linear

    lin = Linear(32, 16, qlinear_params=recipe)
    with pytest.raises(TypeError, match="input dtype torch.int64 is not a floating type"):
        lin(torch.ones(2, 32, dtype=torch.int64))


def test_huge_finite_input_gives_finite_output():
    """An NVFP4 Linear fed activations near 1e36 (amax above FLT_MAX / 448, where TE's decode order overflows)
    returns finite outputs, close to the same layer on the input scaled down."""
    torch.manual_seed(0)
    layer = Linear(64, 128, bias=False, qlinear_params="nvfp4_per_token_bf16_bwd", backend="emulated")
    x = torch.randn(4, 64)
    with torch.no_grad():
        y = layer(x * 1e36)
        small = layer(x) * 1e36  # per-token scaling: the same codes and block scales
    assert torch.isfinite(y).all()
    assert ((y.double() - small.double()).norm() / small.double().norm()).item() < 1e-5

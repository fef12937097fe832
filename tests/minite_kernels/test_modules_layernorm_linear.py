"""LayerNormLinear: TE parameter names, LayerNorm/RMSNorm math, consistency with Linear under a recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minite_kernels.modules import LayerNormLinear, Linear
from minite_kernels.recipes import get_qlinear_params


def recipe(name: str):
    return get_qlinear_params(name, env={})


@pytest.mark.parametrize(
    "normalization, keys",
    [
        ("LayerNorm", ["layer_norm_weight", "layer_norm_bias", "weight", "bias"]),
        ("RMSNorm", ["layer_norm_weight", "weight", "bias"]),
    ],
)
def test_parameter_names_follow_te(normalization, keys):
    m = LayerNormLinear(32, 64, normalization=normalization, qlinear_params=recipe("nvfp4_per_token"))
    assert list(m.state_dict()) == keys
    assert not list(m.buffers())


def test_bf16_layernorm_matches_reference():
    torch.manual_seed(0)
    m = LayerNormLinear(32, 64, qlinear_params=recipe("bf16"), eps=1e-6)
    with torch.no_grad():
        m.layer_norm_weight.uniform_(0.5, 1.5)
        m.layer_norm_bias.uniform_(-0.1, 0.1)
    x = torch.randn(3, 4, 32)
    ref = F.linear(F.layer_norm(x, (32,), m.layer_norm_weight, m.layer_norm_bias, 1e-6), m.weight, m.bias)
    assert torch.equal(m(x), ref)


def test_rmsnorm_formula_and_zero_centered_gamma():
    torch.manual_seed(0)
    m = LayerNormLinear(
        32,
        64,
        bias=False,
        normalization="RMSNorm",
        zero_centered_gamma=True,
        eps=1e-5,
        qlinear_params=recipe("bf16"),
        return_layernorm_output=True,
    )
    assert torch.equal(m.layer_norm_weight, torch.zeros(32))  # gamma - 1 stored
    with torch.no_grad():
        m.layer_norm_weight.fill_(0.5)
    x = torch.randn(5, 32)
    y, ln = m(x)
    # RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + 0.5)
    expect = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * 1.5
    torch.testing.assert_close(ln, expect, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y, ln @ m.weight.t(), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["nvfp4_per_token", "nvfp4_per_token_bf16_bwd", "mxfp8"])
def test_quantized_equals_norm_then_linear(name):
    torch.manual_seed(1)
    m = LayerNormLinear(64, 64, normalization="RMSNorm", qlinear_params=recipe(name))
    lin = Linear.from_linear(torch.nn.Linear(64, 64), recipe(name))
    lin.weight, lin.bias = m.weight, m.bias
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        assert torch.equal(m(x), lin(m.norm(x)))


def test_backward_reaches_norm_parameters_and_meta():
    m = LayerNormLinear(32, 32, qlinear_params=recipe("nvfp4_per_token"))
    x = torch.randn(4, 32, requires_grad=True)
    m(x).square().sum().backward()
    for p in (m.layer_norm_weight, m.layer_norm_bias, m.weight, m.bias, x):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    meta = LayerNormLinear(32, 32, device="meta", params_dtype=torch.bfloat16)
    assert meta.weight.is_meta and meta.layer_norm_weight.dtype == torch.bfloat16


def test_bad_normalization_name():
    with pytest.raises(ValueError, match="did you mean 'RMSNorm'\\?"):
        LayerNormLinear(32, 32, normalization="RMSnorm")

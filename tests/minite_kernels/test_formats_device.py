"""The reference quantizers give the same bytes on CUDA as on CPU (run on a GPU machine: ``pytest -m gpu``)."""

from __future__ import annotations

import pytest
import torch

from minite_kernels.formats import (
    apply_rht,
    e2m1_encode_stochastic,
    quantize_mxfp8,
    quantize_nvfp4,
    random_bytes,
)

pytestmark = pytest.mark.gpu


def _data(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 512, generator=g) * torch.exp(torch.randn(256, 512, generator=g))
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kw",
    [{}, {"scaling": "per_token"}, {"tile": (16, 16)}, {"rht": True}, {"scaling": "per_token", "rht": True}],
    ids=["per_tensor", "per_token", "tile16x16", "rht", "per_token_rht"],
)
def test_nvfp4_cuda_equals_cpu(dtype, kw):
    x = _data(dtype)
    a, b = quantize_nvfp4(x, **kw), quantize_nvfp4(x.cuda(), **kw)
    assert torch.equal(a.data, b.data.cpu())
    assert torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8).cpu())
    assert torch.equal(a.amax, b.amax.cpu())
    assert torch.equal(a.dequantize(), b.dequantize().cpu())


def test_rht_and_sr_codes_cuda_equal_cpu():
    x = _data(torch.bfloat16)
    assert torch.equal(apply_rht(x), apply_rht(x.cuda()).cpu())
    v = (x.float() / x.float().abs().max() * 6).contiguous()
    r = random_bytes(v.shape, generator=torch.Generator().manual_seed(1), device="cpu")
    assert torch.equal(e2m1_encode_stochastic(v, r), e2m1_encode_stochastic(v.cuda(), r.cuda()).cpu())
    q = quantize_nvfp4(x.cuda(), rounding="stochastic", generator=torch.Generator("cuda").manual_seed(0))
    assert q.data.is_cuda and torch.isfinite(q.dequantize()).all()


def test_mxfp8_cuda_equals_cpu():
    x = _data(torch.bfloat16)
    a, b = quantize_mxfp8(x), quantize_mxfp8(x.cuda())
    assert torch.equal(a.scales, b.scales.cpu())
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8).cpu())

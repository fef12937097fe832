"""The strict backend (``minite_kernels/backends/strict.py``): the emulated backend's GEMM with the Triton NVFP4
quantizer where its kernels run. Bytes equal the reference quantizer's; under StrictMode a row's GEMM output does
not depend on its batch. The ``interp_`` tests run the Triton quantizer in Triton's CPU interpreter
(a subprocess); the ``gpu`` tests run it compiled on CUDA."""
from __future__ import annotations

import pytest
import torch
from minite_test_support import interp_only, no_interp

from minite_kernels.backends import get_backend
from minite_kernels.recipes import get_qlinear_params
from minite_kernels.strict import StrictMode, linear_backend

gpu = pytest.mark.gpu

SPEC = get_qlinear_params("nvfp4_per_token_w1x16_bf16_bwd").fprop


def _x(m, k, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, k)[torch.randperm(k, generator=g)]
    return x.to(dtype).to(device)


def _same_bytes(q, r):
    assert torch.equal(q.data.cpu(), r.data.cpu())
    assert torch.equal(q.scales.cpu(), r.scales.cpu())
    assert torch.equal(q.amax.cpu(), r.amax.cpu())


def test_linear_backend_names():
    assert linear_backend() == linear_backend("auto") == linear_backend("strict") == "strict"
    assert linear_backend("emulated") == "emulated"
    with pytest.raises(ValueError, match="auto, strict, emulated; got 'triton'"):
        linear_backend("triton")


@no_interp
def test_cpu_without_interpreter_is_the_emulated_backend():
    """On a plain CPU the reference quantizer runs: same bytes and the same GEMM bits as the emulated backend."""
    sb, eb = get_backend("strict", "cpu"), get_backend("emulated", "cpu")
    assert sb.quantizer == "formats"
    x, w = _x(5, 64, torch.float32), _x(48, 64, torch.float32, seed=1)
    _same_bytes(sb.quantize(x, SPEC.a), eb.quantize(x, SPEC.a))
    y = sb.qgemm_nt(x, w, SPEC.a, SPEC.b, out_dtype=torch.float32)
    assert torch.equal(y, eb.qgemm_nt(x, w, SPEC.a, SPEC.b, out_dtype=torch.float32))


def _check_quantizer_and_rows(device, kernels):
    sb, eb = get_backend("strict", device), get_backend("emulated", device)
    assert sb.quantizer == "triton"
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _x(7, 64, dtype, device=device), _x(48, 64, dtype, seed=1, device=device)
        _same_bytes(sb.quantize(x, SPEC.a), eb.quantize(x, SPEC.a))  # per token
        _same_bytes(sb.quantize(w, SPEC.b), eb.quantize(w, SPEC.b))  # weight, 1x16 blocks
        with StrictMode(kernels):  # a row alone gives the bits it has in the batch
            full = sb.qgemm_nt(x, w, SPEC.a, SPEC.b, out_dtype=dtype)
            rows = [sb.qgemm_nt(x[i:i + 1].clone(), w, SPEC.a, SPEC.b, out_dtype=dtype) for i in range(x.shape[0])]
        assert torch.equal(full, torch.cat(rows))


@interp_only
def test_interp_triton_quantizer_bytes_and_batch_invariant_rows():
    _check_quantizer_and_rows("cpu", "triton")


def test_strict_backend_under_interpreter(run_interp_tests):
    run_interp_tests(__file__)


@gpu
def test_gpu_triton_quantizer_bytes_and_batch_invariant_rows():
    _check_quantizer_and_rows("cuda", "auto")

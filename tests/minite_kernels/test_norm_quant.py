"""``backends/triton/norm_quant.py``: residual add + RMSNorm (and SiLU-gated product) + per-token NVFP4
quantize-dequantize in one kernel.

Against the pure-PyTorch reference: the residual bit for bit; the activation within one BF16 step (another
summation order, the GPU's approximate rsqrt, Triton's exp); and X̂ bit for bit equal to the reference quantizer
(``formats.quantize_nvfp4`` per token, dequantized to BF16) of the kernel's own activation. The kernels
run under Triton's CPU interpreter (a subprocess with ``TRITON_INTERPRET=1``) and compiled on a GPU (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from minite_test_support import interp_only

from minite_kernels.formats.nvfp4 import quantize_nvfp4
from rollout.fused import rms_norm


def _inputs(m: int, k: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = (3 * torch.randn(m, k, generator=g)).to(torch.bfloat16)
    y = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16)
    return h.to(device), y.to(device), w.to(device)


def _bf16_steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|difference| of BF16 values in units of their bit patterns (same sign: adjacent values differ by 1)."""
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


def _check(m: int, k: int, device, residual: bool, seed: int = 0) -> None:
    from minite_kernels.backends.triton.norm_quant import add_rms_norm_deq

    h, y, w = _inputs(m, k, device, seed)
    eps = 1e-6
    h_out, deq, x = add_rms_norm_deq(h, y if residual else None, w, eps, write_x=True)
    s = h + y if residual else h
    if residual:
        assert torch.equal(h_out.view(torch.int16), s.view(torch.int16))
    else:
        assert h_out is None
    want_x = rms_norm(s, w, eps)
    steps = _bf16_steps_apart(x, want_x)
    assert int(steps.max()) <= 1, int(steps.max())
    assert float((steps == 0).float().mean()) >= 0.99
    ref = quantize_nvfp4(x, scaling="per_token", tile=(1, 16)).dequantize(torch.bfloat16)
    assert torch.equal(deq.view(torch.int16), ref.view(torch.int16))


def _check_silu(m: int, k: int, device, seed: int = 0) -> None:
    from minite_kernels.backends.triton.norm_quant import silu_mul_deq

    g, u, _ = _inputs(m, k, device, seed)
    gu = torch.cat((g, u), dim=-1)  # the decode step's layout: g and u are the two halves of one GEMM output
    g, u = gu[:, :k], gu[:, k:]
    deq, x = silu_mul_deq(g, u, write_x=True)
    steps = _bf16_steps_apart(x, F.silu(g) * u)
    assert int(steps.max()) <= 1, int(steps.max())
    assert float((steps == 0).float().mean()) >= 0.99
    ref = quantize_nvfp4(x, scaling="per_token", tile=(1, 16)).dequantize(torch.bfloat16)
    assert torch.equal(deq.view(torch.int16), ref.view(torch.int16))
    assert silu_mul_deq(g, u)[1] is None


def _worked_example(device) -> None:
    from minite_kernels.backends.triton.norm_quant import add_rms_norm_deq

    h = torch.zeros(1, 16, dtype=torch.bfloat16, device=device)
    h[0, 0], h[0, 1] = 3.0, 4.0
    w = torch.ones(16, dtype=torch.bfloat16, device=device)
    _, deq, x = add_rms_norm_deq(h, None, w, 0.0, write_x=True)
    assert x[0, :2].tolist() == [2.40625, 3.203125] and not x[0, 2:].any()
    want = [round(4 * 3.203125 / 6, 10), 3.203125]  # codes 4 and 6 at scale 3.203125 / 6, rounded to bf16
    assert deq[0, :2].float().tolist() == [torch.tensor(v).to(torch.bfloat16).item() for v in want]


def _bad_inputs(device) -> None:
    from minite_kernels.backends.triton.norm_quant import add_rms_norm_deq

    h, y, w = _inputs(2, 32, device)
    with pytest.raises(ValueError, match="K must be a multiple of 16"):
        add_rms_norm_deq(h[:, :24].contiguous(), None, w[:24].contiguous(), 1e-6)
    with pytest.raises(ValueError, match="y must be a bfloat16 tensor of shape"):
        add_rms_norm_deq(h, y.float(), w, 1e-6)
    _pdl_where_it_cannot_run(device)


def _pdl_where_it_cannot_run(device) -> None:
    """``pdl=True`` where programmatic dependent launch cannot run (the interpreter, a CPU tensor, a pre-Hopper
    GPU) is the decode kernels' one-line error, raised before any launch; elsewhere it changes no value."""
    from minite_kernels.backends.triton._common import pdl_capable
    from minite_kernels.backends.triton.norm_quant import add_rms_norm_deq, silu_mul_deq

    h, y, w = _inputs(2, 32, device)
    if pdl_capable(h):
        got = add_rms_norm_deq(h, y, w, 1e-6, write_x=True, pdl=True)
        assert all(torch.equal(a, b) for a, b in zip(got, add_rms_norm_deq(h, y, w, 1e-6, write_x=True)))
        assert torch.equal(silu_mul_deq(h, y, pdl=True)[0], silu_mul_deq(h, y)[0])
        return
    msg = "programmatic dependent launch needs .*compute capability 9.0"
    with pytest.raises(ValueError, match=msg):
        add_rms_norm_deq(h, y, w, 1e-6, pdl=True)
    with pytest.raises(ValueError, match=msg):
        silu_mul_deq(h, y, pdl=True)


def test_pdl_on_the_cpu_is_an_error():
    _pdl_where_it_cannot_run("cpu")


# --- CPU: the interpreter run, in a subprocess ----------------------------------------------------------------
def test_norm_quant_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
@pytest.mark.parametrize("m,k,residual", [(1, 16, True), (3, 64, False), (5, 1024, True), (2, 2560, True)])
def test_interp_matches_reference(m, k, residual):
    _check(m, k, "cpu", residual)


@interp_only
@pytest.mark.parametrize("m,k", [(1, 16), (5, 3072)])
def test_interp_silu_mul_matches_reference(m, k):
    _check_silu(m, k, "cpu")


@interp_only
def test_interp_worked_example_and_bad_inputs():
    _worked_example("cpu")
    _bad_inputs("cpu")


# --- compiled kernels on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_matches_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for m, k, residual in ((1, 16, True), (64, 1024, True), (64, 1024, False), (8, 2560, True), (4, 9728, True)):
        _check(m, k, "cuda", residual, seed=m + k)
    for m, k in ((1, 16), (64, 3072), (8, 9728)):
        _check_silu(m, k, "cuda", seed=m + k)
    _worked_example("cuda")
    _bad_inputs("cuda")

"""``minite_kernels.optim.AdamW``: torch's AdamW whose step records max|θ|, and weight sync that uses it.

The pure-PyTorch reference runs on CPU; the grouped Triton kernel runs under Triton's CPU interpreter (a
subprocess with ``TRITON_INTERPRET=1``) and compiled on a GPU (``-m gpu``), and must equal the reference bit
for bit (same fp32 operations, correctly rounded square roots and divisions). ``WeightRequantizer(
amax_from=optimizer)`` must give the same bytes as its own amax pass.
"""

from __future__ import annotations

import math

import pytest
import torch
from minite_test_support import interp_only, no_interp

from minite_kernels.optim import AdamW, adamw_reference_

HP = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


def _params(device, dtype, shapes=((37, 160), (1001,), (16, 64)), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device=device, dtype=dtype)) for s in shapes]


def _grads(params, step, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(p.shape, generator=g).to(device=p.device, dtype=p.dtype) for p in params]


# --- CPU: the reference path -------------------------------------------------------------------------------
@no_interp
def test_worked_example_from_the_docstring():
    # θ = 1, g = 2, γ = 0.1, λ = 0, ε = 0: m = 0.1·2 = 0.2, v = 0.001·4 = 0.004, m̂ = 2, v̂ = 4,
    # θ ← 1 - 0.1·2/2 = 0.9 and amax = 0.9
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = AdamW([p], lr=0.1, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0)
    p.grad = torch.tensor([2.0])
    opt.step()
    assert p.item() == pytest.approx(0.9, abs=1e-7)
    assert opt.amax(p).item() == p.abs().item()


@no_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_tracks_torch_adamw_and_amax_is_exact(dtype):
    ours, theirs = _params("cpu", dtype), _params("cpu", dtype)
    opt = AdamW(ours, **HP)
    # torch's fused AdamW also computes bf16 parameters in fp32 and rounds once
    ref = torch.optim.AdamW(
        theirs, **HP, **({"foreach": False} if dtype == torch.float32 else {"fused": True})
    )
    for step in range(1, 4):
        for a, b, g in zip(ours, theirs, _grads(ours, step)):
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for a, b in zip(ours, theirs):
            # fp32: torch's CPU sqrt is 1-ulp accurate, ours correctly rounded; bf16: one final rounding apart
            tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 2**-7}
            torch.testing.assert_close(a.detach(), b.detach(), **tol)
            assert opt.amax(a).item() == a.detach().float().abs().max().item()
    assert opt.reference_params == 9 and opt.kernel_launches == 0
    for a, b in zip(ours, theirs):
        assert set(opt.state[a]) == set(ref.state[b]) == {"step", "exp_avg", "exp_avg_sq"}


@no_interp
def test_nan_parameter_poisons_its_amax_and_skipped_params_keep_theirs():
    a, b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.full((3,), -2.0))
    opt = AdamW([a, b], lr=0.1, weight_decay=0.0)
    a.grad, b.grad = torch.ones(4), torch.ones(3)
    opt.step()
    amax_b = opt.amax(b).item()
    assert amax_b == b.abs().max().item()
    a.grad, b.grad = torch.tensor([1.0, float("nan"), 1.0, 1.0]), None
    opt.step()
    assert math.isnan(opt.amax(a).item())
    assert opt.amax(b).item() == amax_b and opt.state[b]["step"].item() == 1


@no_interp
def test_state_dict_round_trips_with_torch_adamw():
    ours, theirs = _params("cpu", torch.float32), _params("cpu", torch.float32)
    opt = AdamW(ours, **HP)
    for p, g in zip(ours, _grads(ours, 1)):
        p.grad = g
    opt.step()
    ref = torch.optim.AdamW(theirs, **HP)
    ref.load_state_dict(opt.state_dict())
    back = AdamW(ours, **HP)
    back.load_state_dict(ref.state_dict())
    for p in ours:
        assert torch.equal(back.state[p]["exp_avg"], opt.state[p]["exp_avg"])
        assert back.state[p]["step"].item() == 1


@no_interp
def test_amax_current_follows_in_place_changes():
    ps = _params("cpu", torch.float32)
    opt = AdamW(ps, **HP)
    assert not opt.amax_current(ps)  # never stepped
    for p, g in zip(ps, _grads(ps, 1)):
        p.grad = g
    opt.step()
    assert opt.amax_current(ps)
    with torch.no_grad():
        ps[1].mul_(2)
    assert opt.amax_current([ps[0], ps[2]]) and not opt.amax_current(ps)
    with pytest.raises(ValueError, match="not a parameter of this optimizer"):
        opt.amax(torch.zeros(2))


@no_interp
def test_bad_options_name_the_valid_ones():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match=r"amsgrad=True.*valid here: lr, betas, eps, weight_decay"):
        AdamW(p, amsgrad=True)
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['momentum'\]"):
        AdamW(p, momentum=0.9)


# --- the Triton kernel ------------------------------------------------------------------------------------
def _kernel_equals_reference(device):
    """Kernel step (grouped, on ``device``) == reference step (CPU), bit for bit, for every dtype; amax exact;
    version counters bumped (so weight caches re-quantize)."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ours = _params(device, dtype)
        ref = [p.detach().cpu().clone() for p in ours]
        states = [(torch.zeros_like(r), torch.zeros_like(r)) for r in ref]
        opt = AdamW(ours, **HP)
        for step in range(1, 4):
            versions = [p._version for p in ours]
            grads = _grads(ours, step)
            for p, g in zip(ours, grads):
                p.grad = g
            opt.step()
            assert opt.kernel_launches == step and opt.reference_params == 0
            for i, (p, r, g, (m, v)) in enumerate(zip(ours, ref, grads, states)):
                amax = adamw_reference_(
                    r,
                    g.cpu(),
                    m,
                    v,
                    lr=HP["lr"],
                    beta1=0.9,
                    beta2=0.99,
                    eps=HP["eps"],
                    weight_decay=HP["weight_decay"],
                    step=step,
                )
                assert torch.equal(p.detach().cpu(), r), (dtype, step, i, (p.detach().cpu() - r).abs().max())
                assert torch.equal(opt.state[p]["exp_avg"].cpu(), m)
                assert torch.equal(opt.state[p]["exp_avg_sq"].cpu(), v)
                assert opt.amax(p).item() == amax.item()
                assert p._version > versions[i]
            assert opt.amax_current(ours)


def _requantizer_with_optimizer_amax(device, cuda_graph):
    import minite_kernels.backends.triton as tk

    ws = _params(
        device, torch.bfloat16, shapes=((16, 32), (32, 16)) if device == "cpu" else ((256, 512), (1024, 2048))
    )
    opt = AdamW(ws, **HP)
    with_opt = tk.WeightRequantizer(ws, write_deq=True, cuda_graph=cuda_graph, amax_from=opt)
    own = tk.WeightRequantizer(ws, write_deq=True, cuda_graph=cuda_graph)
    for step in range(1, 2 if device == "cpu" else 3):
        for p, g in zip(ws, _grads(ws, step)):
            p.grad = g
        opt.step()
        a, b = with_opt.sync(), own.sync()
        assert with_opt.amax_given and not own.amax_given
        assert with_opt.num_launches == 2 and own.num_launches == 3
        for x, y in zip(a, b):
            assert torch.equal(x.data, y.data) and torch.equal(x.amax, y.amax) and torch.equal(x.deq, y.deq)
            assert torch.equal(x.scales.view(torch.uint8), y.scales.view(torch.uint8))
    with torch.no_grad():  # changed after the step: the recorded amax is stale, so the sync measures its own
        ws[1].mul_(4)
    a, b = with_opt.sync(), own.sync()
    assert not with_opt.amax_given
    assert all(torch.equal(x.data, y.data) and torch.equal(x.amax, y.amax) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="every weight must be one of the optimizer's parameters"):
        tk.WeightRequantizer([torch.zeros(16, 16, dtype=torch.bfloat16, device=device)], amax_from=opt)
    with pytest.raises(ValueError, match="amax_from needs grouped=True"):
        tk.WeightRequantizer(ws, grouped=False, amax_from=opt)


def test_kernels_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
def test_interp_kernel_equals_reference():
    _kernel_equals_reference("cpu")


@interp_only
def test_interp_requantizer_takes_the_optimizer_amax():
    _requantizer_with_optimizer_amax("cpu", cuda_graph=False)


@pytest.mark.gpu
def test_gpu_kernel_equals_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _kernel_equals_reference("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_gpu_requantizer_takes_the_optimizer_amax(cuda_graph):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _requantizer_with_optimizer_amax("cuda", cuda_graph)

"""The learner's fast lane (``minite_kernels/modules/fast_lane.py``) gives exactly the generic path's results.

Eligible calls (``nvfp4_per_token_bf16_bwd`` on the Triton backend, BF16 contiguous input) must produce the
same Y, dX, dW, db bit for bit as ``Options.lane="off"``, share the activation quantization of projections
that read one input, and leave every other call to the generic path. The kernels run under Triton's CPU
interpreter here (a subprocess with ``TRITON_INTERPRET=1``) and compiled on a GPU (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from minite_test_support import interp_only

from minite_kernels.backends import get_backend
from minite_kernels.modules import Linear, WeightCache, qlinear
from minite_kernels.modules.functional import _plan_for
from minite_kernels.options import Options, use_options
from minite_kernels.recipes import get_qlinear_params

LANE = "nvfp4_per_token_bf16_bwd"


def recipe(name: str):
    return get_qlinear_params(name, env={})


def _inputs(device, m=24, k=64, n=96, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, m // 2, k, generator=g) * torch.exp(torch.randn(2, m // 2, k, generator=g))
    w = torch.randn(n, k, generator=g) * 0.1
    b = torch.randn(n, generator=g)
    dy = torch.randn(2, m // 2, n, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, w, b, dy)]


def _run(x, w, b, dy, backend, need=(True, True, True), name=LANE):
    """(path, [y, dx, dw, db]) of one qlinear call with a fresh weight cache (``name``: a recipe or its name);
    path is "lane" when the dense autograd function took the fast lane, else its node's name."""
    x = x.detach().requires_grad_(need[0])  # a new leaf over the same memory (keeps the layout)
    w = w.detach().clone().requires_grad_(need[1])
    b = None if b is None else b.detach().clone().requires_grad_(need[2])
    y = qlinear(x, w, b, recipe(name) if isinstance(name, str) else name, backend, WeightCache())
    fn = y.grad_fn.next_functions[0][0] if y.grad_fn.name() == "ViewBackward0" else y.grad_fn
    node = "lane" if getattr(fn, "lane", False) else type(fn).__name__
    y.backward(dy)
    return node, [y.detach()] + [None if t is None else t.grad for t in (x, w, b)]


def _assert_same(a, b):
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            assert u.dtype == v.dtype and u.shape == v.shape
            assert torch.equal(u.view(torch.int16), v.view(torch.int16)), (u.float() - v.float()).abs().max()


def _lane_equals_generic(device, minite_options, **shape):
    from minite_kernels.backends.triton import TritonBackend

    x, w, b, dy = _inputs(device, **shape)
    for bias in (b, None):
        for need in [(True, True, True), (True, False, True), (False, True, False)]:
            minite_options(lane="auto")
            node, lane = _run(x, w, bias, dy, TritonBackend(device), need)
            assert node == "lane"
            minite_options(lane="off")
            node, generic = _run(x, w, bias, dy, TritonBackend(device), need)
            assert node == "_DenseQLinearBackward"
            _assert_same(lane, generic)
    minite_options(lane="auto")
    with torch.no_grad():
        y_lane = qlinear(x, w, b, recipe(LANE), TritonBackend(device), WeightCache())
    minite_options(lane="off")
    with torch.no_grad():
        y_generic = qlinear(x, w, b, recipe(LANE), TritonBackend(device), WeightCache())
    _assert_same([y_lane], [y_generic])


def _lane_quantizer_equals_generic_quantizer(device, k=64):
    """``quantize_token_deq_bf16`` (typed pointers, no host views) writes what the generic per-token launch
    writes: codes, scales, amax, nonfinite and deq, for an aligned input and one at a 2-element offset, with a
    poisoned row."""
    from minite_kernels.backends.triton.quantize import quantize_nvfp4_triton, quantize_token_deq_bf16

    base, _w, _b, _dy = _inputs(device, m=48, k=k + 2, n=16)
    base = base.reshape(-1, k + 2)
    base[5, 9] = float("nan")
    flat = base.reshape(-1)
    for x in (flat[: 24 * k].view(24, k), flat[2 : 2 + 24 * k].view(24, k)):
        lane = quantize_token_deq_bf16(x)
        ref = quantize_nvfp4_triton(x, per_token=True, write_deq=True)
        assert lane.scales.dtype == ref.scales.dtype == torch.float8_e4m3fn
        for name in ("data", "scales", "amax", "nonfinite", "deq"):
            u, v = getattr(lane, name), getattr(ref, name)
            assert u.shape == v.shape and u.dtype == v.dtype, name
            assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)), name


def _shared_input_quantized_once(device, monkeypatch, minite_options):
    """q/k/v-style projections of one input: one activation quantization, and the generic path reuses the
    lane's operand (and the other way round): the cache entry is the same."""
    import minite_kernels.backends.triton.backend as tb
    from minite_kernels.backends.triton import TritonBackend

    minite_options(lane="auto")
    launches = []
    real = tb.quantize_token_deq_bf16
    monkeypatch.setattr(tb, "quantize_token_deq_bf16", lambda x: launches.append(1) or real(x))
    backend = TritonBackend(device)
    x, _w, _b, _dy = _inputs(device)
    layers = [
        Linear(64, 96, bias=False, device=device, dtype=torch.bfloat16, qlinear_params=LANE, backend=backend)
    ]
    layers += [
        Linear(64, 32, bias=False, device=device, dtype=torch.bfloat16, qlinear_params=LANE, backend=backend)
    ]
    for layer in layers:  # quantizes the weights (a weight quantization replaces the remembered input)
        layer(x + 1)
    launches.clear()
    h = x.detach().requires_grad_(True)
    ys = [layer(h) for layer in layers]
    assert len(launches) == 1
    minite_options(lane="off")
    layers[1](h)  # the generic path finds the lane's operand
    assert len(launches) == 1
    sum(y.float().sum() for y in ys).backward()
    assert h.grad is not None and torch.isfinite(h.grad.float()).all()


def _ineligible_calls_take_the_generic_path(device, minite_options):
    from minite_kernels.backends.triton import TritonBackend

    minite_options(lane="recipe")  # no override: each recipe's own choice
    x, w, b, dy = _inputs(device)
    cases = {
        "fp32 input": {"x": x.float(), "dy": dy.float()},
        "row-strided 2-D input": {
            "x": torch.cat([x.reshape(-1, 64), x.reshape(-1, 64)], dim=1)[:, :64],
            "dy": dy.reshape(-1, 96),
        },
    }
    for what, kw in cases.items():
        args = {"x": x, "w": w, "b": b, "dy": dy} | kw
        node, _ = _run(args["x"], args["w"], args["b"], args["dy"], TritonBackend(device))
        assert node == "_DenseQLinearBackward", what
    for change in ({"gemm": "exact"}, {"save_activations": "packed"}, {"lane": "off"}):
        # the recipe's kernel choice, and the same choice as a process-wide override: same path, same bits
        node, by_recipe = _run(x, w, b, dy, TritonBackend(device), name=recipe(LANE).with_kernels(**change))
        assert node == "_DenseQLinearBackward", change
        with use_options(**change):
            node, by_options = _run(x, w, b, dy, TritonBackend(device))
        assert node == "_DenseQLinearBackward", change
        _assert_same(by_recipe, by_options)
    # an override wins over the recipe's choice: the lane recipe asks for the lane, the options refuse it
    with use_options(lane="off"):
        assert _run(x, w, b, dy, TritonBackend(device), name=recipe(LANE).with_kernels(lane="auto"))[0] != "lane"
    node, _ = _run(x, w, b, dy, TritonBackend(device), name="nvfp4_per_token")  # NVFP4 backward
    assert node == "_DenseQLinearBackward"


def _lane_under_auto_routing(device, minite_options):
    """A module whose backend is ``auto`` (the default) takes the lane through the backend ``auto`` routes to,
    with the same bits as the Triton backend given directly."""
    from minite_kernels.backends import AutoBackend
    from minite_kernels.backends.emulated import EmulatedBackend
    from minite_kernels.backends.triton import TritonBackend

    minite_options(lane="auto")
    auto = AutoBackend(device)
    auto.candidates = [TritonBackend(device), EmulatedBackend(device)]  # on CPU, auto routes only to emulated
    assert _plan_for(recipe(LANE), auto, WeightCache()).lane is not None
    x, w, b, dy = _inputs(device)
    node, routed = _run(x, w, b, dy, auto)
    assert node == "lane"
    _, direct = _run(x, w, b, dy, TritonBackend(device))
    _assert_same(routed, direct)


# --- CPU, no interpreter: the plan ---------------------------------------------------------------------------
def test_plan_decides_the_lane_once_per_recipe_and_backend():
    pytest.importorskip("triton", reason="triton is not installed")
    from minite_kernels.backends.triton import TritonBackend

    tb = TritonBackend("cpu")
    assert _plan_for(recipe(LANE), tb, WeightCache()).lane
    for name in ("nvfp4_per_token", "nvfp4_per_token_rht", "w4a16_nvfp4", "bf16"):
        try:
            r = recipe(name)
        except (KeyError, ValueError):
            continue
        assert not _plan_for(r, tb, WeightCache()).lane, name
    assert not _plan_for(recipe(LANE), get_backend("emulated", "cpu"), WeightCache()).lane


def test_a_plan_binds_the_recipe_kernels_once_and_reads_no_option_field_per_call(monkeypatch):
    """The plan resolves the recipe's kernel choice against the options once and binds the backend to it (a
    memoised view sharing the backend's state); a call then makes one identity check of the active options and
    resolves nothing; other options make a new plan."""
    pytest.importorskip("triton", reason="triton is not installed")
    import minite_kernels.modules.functional as F
    from minite_kernels.backends import AutoBackend
    from minite_kernels.backends.triton import TritonBackend

    tb = TritonBackend("cpu")
    exact = recipe(LANE).with_kernels(gemm="exact")
    cache = WeightCache()
    plan = _plan_for(exact, tb, cache)
    assert plan.kernels.gemm == "exact" and plan.lane is None  # the lane computes the dequant formulation only
    assert plan.backend is tb.with_kernels(plan.kernels) and plan.backend.kernels is plan.kernels
    assert plan.backend._shared is tb._shared and tb.kernels is None
    assert _plan_for(exact, tb, cache) is plan
    with use_options(gemm="dequant"):
        other = _plan_for(exact, tb, cache)
        assert other is not plan and other.kernels.gemm == "dequant" and other.lane is not None
    # the shared-input cache: linears whose choices make the same operand share it, others do not
    from minite_kernels.recipes import KernelChoice

    x, spec = torch.zeros(8, 64, dtype=torch.bfloat16), exact.fprop.a
    assert tb._key(x, spec, KernelChoice()) == tb._key(x, spec, KernelChoice(lane="off"))
    assert tb._key(x, spec, KernelChoice()) != tb._key(x, spec, KernelChoice(decode="off"))
    assert tb._key(x, spec, KernelChoice()) != tb._key(x, spec, KernelChoice(gemm="exact"))
    auto = AutoBackend("cpu")
    view = auto.with_kernels(plan.kernels)
    assert view is auto.with_kernels(plan.kernels) and view.candidates[0].name == "emulated"

    calls = {"options": 0, "resolve": 0}
    real_options, real_resolve = F.options, F.resolve_kernels
    monkeypatch.setattr(F, "options", lambda: calls.__setitem__("options", calls["options"] + 1) or real_options())
    monkeypatch.setattr(F, "resolve_kernels",
                        lambda *a: calls.__setitem__("resolve", calls["resolve"] + 1) or real_resolve(*a))
    layer = Linear(64, 96, qlinear_params=exact, backend="emulated")
    x = torch.randn(8, 64)
    layer(x).sum().backward()  # the first call makes the plan
    calls.update(options=0, resolve=0)
    for _ in range(3):
        layer(x).sum().backward()
    assert calls == {"options": 3, "resolve": 0}


def test_invalid_lane_mode_names_the_choices():
    with pytest.raises(ValueError, match=r"MINITE_LINEAR_LANE='on' is not valid; valid: recipe, auto, off"):
        Options.from_env({"MINITE_LINEAR_LANE": "on"})


# --- Triton's CPU interpreter -----------------------------------------------------------------------------------
def test_fast_lane_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
def test_interp_lane_equals_generic_bitwise(minite_options):
    _lane_equals_generic("cpu", minite_options)


@interp_only
def test_interp_lane_quantizer_equals_generic_quantizer():
    _lane_quantizer_equals_generic_quantizer("cpu")


@interp_only
def test_interp_shared_input_is_quantized_once(monkeypatch, minite_options):
    _shared_input_quantized_once("cpu", monkeypatch, minite_options)


@interp_only
def test_interp_ineligible_calls_take_the_generic_path(minite_options):
    _ineligible_calls_take_the_generic_path("cpu", minite_options)


@interp_only
def test_interp_lane_under_auto_routing(minite_options):
    _lane_under_auto_routing("cpu", minite_options)


# --- compiled kernels on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_lane_equals_generic_bitwise(monkeypatch, minite_options):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _lane_quantizer_equals_generic_quantizer("cuda", k=2048)
    _lane_equals_generic("cuda", minite_options, m=4096, k=2048, n=1024)
    _shared_input_quantized_once("cuda", monkeypatch, minite_options)
    _ineligible_calls_take_the_generic_path("cuda", minite_options)
    _lane_under_auto_routing("cuda", minite_options)

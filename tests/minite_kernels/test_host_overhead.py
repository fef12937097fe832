"""The host-side fast paths of the quantized linear give exactly the results of the generic path.

``qlinear`` plans its dispatch once per (recipe, backend) and runs a dense layer without per-group slicing,
with BF16 backward GEMMs as direct matmuls (``minite_kernels.modules.functional``). The generic per-group
code is still what grouped layers run, so a dense layer must match, bit for bit, the same computation run
as a one-group grouped layer: same quantized operands, same GEMM operand layouts, same generator draws.
Timing lives in ``scripts/bench_host_overhead.py``; nothing here measures time.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from minite_test_support import interp_only

from minite_kernels.backends import get_backend
from minite_kernels.backends.base import Backend
from minite_kernels.formats import apply_rht, inverse_rht, rht_matrix
from minite_kernels.modules import Linear, WeightCache, qlinear
from minite_kernels.modules.functional import _Plan
from minite_kernels.options import Options, use_options
from minite_kernels.recipes import get_qlinear_params, recipe_names

ALL = [n for n in recipe_names() if n != "bf16"]
M, K, N = 24, 64, 96  # 24 tokens: wgrad contracts over a token count that needs zero-padding to 32


def recipe(name: str):
    return get_qlinear_params(name, env={})


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, M // 2, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) * 0.1).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    dy = torch.randn(2, M // 2, N, generator=g).to(dtype)
    return x, w, b, dy


def _run(x, w, b, dy, r, backend, *, grouped: bool, need=(True, True, True)):
    """y, dx, dw, db of qlinear: dense ([N, K] weight) or as a single group ([1, N, K], m_splits=[M])."""
    x = x.detach().clone().requires_grad_(need[0])
    if grouped:
        w = w.detach()[None].clone().requires_grad_(need[1])
        b = None if b is None else b.detach()[None].clone().requires_grad_(need[2])
        y = qlinear(
            x.reshape(-1, K),
            w,
            b,
            r,
            backend,
            WeightCache(),
            m_splits=[M],
            generator=torch.Generator().manual_seed(7),
        ).reshape(*x.shape[:-1], N)
    else:
        w = w.detach().clone().requires_grad_(need[1])
        b = None if b is None else b.detach().clone().requires_grad_(need[2])
        y = qlinear(x, w, b, r, backend, WeightCache(), generator=torch.Generator().manual_seed(7))
    y.backward(dy)
    grads = [t.grad if t is not None else None for t in (x, w, b)]
    if grouped:
        grads[1] = None if grads[1] is None else grads[1][0]
        grads[2] = None if grads[2] is None else grads[2][0]
    return [y.detach(), *grads]


def _assert_same(a, b):
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            assert u.dtype == v.dtype and u.shape == v.shape
            assert torch.equal(u, v), (u - v).abs().max()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_path_equals_generic_path_bitwise(name, dtype):
    x, w, b, dy = _inputs(dtype)
    r = recipe(name)
    be = get_backend("emulated", "cpu")
    dense = _run(x, w, b, dy, r, be, grouped=False)
    generic = _run(x, w, b, dy, r, be, grouped=True)
    _assert_same(dense, generic)
    assert all(t is not None for t in dense)


@pytest.mark.parametrize("name", ["nvfp4_per_token_bf16_bwd", "nvfp4_per_token", "w4a16_nvfp4"])
@pytest.mark.parametrize("need", [(True, False, False), (False, True, False), (False, False, True)])
def test_dense_path_partial_grads(name, need):
    x, w, b, dy = _inputs(torch.float32, seed=1)
    be = get_backend("emulated", "cpu")
    dense = _run(x, w, b, dy, recipe(name), be, grouped=False, need=need)
    generic = _run(x, w, b, dy, recipe(name), be, grouped=True, need=need)
    _assert_same(dense, generic)
    assert [t is not None for t in dense[1:]] == list(need)


@pytest.mark.parametrize("name", ["nvfp4_per_token_bf16_bwd", "nvfp4_per_token", "mxfp8"])
def test_auto_backend_routes_once_and_matches_emulated(name):
    x, w, b, dy = _inputs(torch.float32, seed=2)
    auto, emu = get_backend("auto", "cpu"), get_backend("emulated", "cpu")
    _assert_same(
        _run(x, w, b, dy, recipe(name), auto, grouped=False),
        _run(x, w, b, dy, recipe(name), emu, grouped=False),
    )
    plan = _Plan(recipe(name), auto)
    # on CPU every quantized operation is routed to the emulated backend; BF16 backward GEMMs are plain matmuls
    assert plan.x_quantizer.name == plan.fprop_backend.name == "emulated"
    assert (plan.dgrad_backend is None) == (not recipe(name).dgrad.quantized)
    assert (plan.wgrad_backend is None) == (not recipe(name).wgrad.quantized)


def test_plan_is_reused_and_follows_recipe_and_backend_changes():
    torch.manual_seed(0)
    layer = Linear(K, N, qlinear_params=recipe("nvfp4_per_token_bf16_bwd"), backend="emulated")
    x = torch.randn(M, K)
    y0 = layer(x)
    plan = layer._weight_cache._dispatch.value
    assert plan.recipe is layer.qlinear_params and plan.backend.name == "emulated"
    assert torch.equal(layer(x), y0) and layer._weight_cache._dispatch.value is plan  # reused
    # a new recipe object must be picked up at once (never a stale plan)
    layer.qlinear_params = recipe("mxfp8")
    y_mx = layer(x)
    assert layer._weight_cache._dispatch.value.recipe is layer.qlinear_params
    ref = Linear(K, N, qlinear_params=recipe("mxfp8"), backend="emulated")
    ref.load_state_dict(layer.state_dict())
    assert torch.equal(y_mx, ref(x)) and not torch.equal(y_mx, y0)
    layer.qlinear_params = recipe("bf16")
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    # a backend name change is picked up too
    layer.qlinear_params = recipe("nvfp4_per_token_bf16_bwd")
    layer.backend_name = "auto"
    assert torch.equal(layer(x), y0)
    assert layer._dispatch(x.device)[4] is get_backend("auto", "cpu")


def test_memos_are_not_copied_or_pickled():
    torch.manual_seed(0)
    layer = Linear(K, N, qlinear_params=recipe("nvfp4_per_token"), backend="auto")
    x = torch.randn(M, K)
    y = layer(x)
    assert layer._dispatch_memo.value is not None and layer._weight_cache._dispatch.value is not None
    clone = copy.deepcopy(layer)
    assert clone._dispatch_memo.value is None and clone._weight_cache._dispatch.value is None
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back._dispatch_memo.value is None and back._weight_cache._dispatch.value is None
    for m in (clone, back):
        assert torch.equal(m(x), y)
        assert m._dispatch(x.device)[4] is get_backend("auto", "cpu")  # the shared instance, not a copy


class CountingBackend(Backend):
    """The emulated numerics, counting what the module asks of the backend."""

    name = "counting"

    def __init__(self, device=None):
        super().__init__(device)
        self.emu = get_backend("emulated", "cpu")
        self.quantized: list[str] = []
        self.gemms = 0

    @classmethod
    def availability(cls, device=None):
        return True, "test backend"

    def _quantize(self, x2d, spec, *, generator=None):
        self.quantized.append(spec.summary())
        return self.emu._quantize(x2d, spec, generator=generator)

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype):
        self.gemms += 1
        return self.emu._gemm(qa, qb, a_spec, b_spec, out_dtype=out_dtype)


@pytest.mark.parametrize(
    "name, first, later, gemms",
    [
        # step 1 quantizes X and the cached W; later steps only X. BF16 backward GEMMs never reach the backend.
        ("nvfp4_per_token_bf16_bwd", ["nvfp4/tok", "nvfp4/16x16"], ["nvfp4/tok"], 1),
        # + dgrad: dY (SR) with the cached quantized Wᵀ; wgrad: dYᵀ (RHT, SR) and Xᵀ (RHT)
        (
            "nvfp4_per_token",
            ["nvfp4/tok", "nvfp4/16x16", "nvfp4/sr", "nvfp4/16x16", "nvfp4/rht/sr", "nvfp4/rht"],
            ["nvfp4/tok", "nvfp4/sr", "nvfp4/rht/sr", "nvfp4/rht"],
            3,
        ),
    ],
)
def test_backend_calls_per_step(name, first, later, gemms):
    be = CountingBackend("cpu")
    torch.manual_seed(0)
    layer = Linear(K, N, bias=False, qlinear_params=recipe(name), backend=be)
    ref = Linear(K, N, bias=False, qlinear_params=recipe(name), backend="emulated")
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(M, K, requires_grad=True)
    for step, expected in ((0, first), (1, later)):
        be.quantized.clear()
        be.gemms = 0
        layer.generator = torch.Generator().manual_seed(step)
        ref.generator = torch.Generator().manual_seed(step)
        y = layer(x)
        y.sum().backward()
        gx, gw = x.grad, layer.weight.grad
        x.grad = None
        y_ref = ref(x)
        y_ref.sum().backward()
        assert torch.equal(y, y_ref) and torch.equal(gx, x.grad) and torch.equal(gw, ref.weight.grad)
        x.grad = None
        layer.weight.grad = ref.weight.grad = None
        assert sorted(be.quantized) == sorted(expected)
        assert be.gemms == gemms


def test_weight_cache_token_checks_every_field():
    cache = WeightCache()
    w = torch.randn(4, 16)
    made = []

    def make():
        made.append(1)
        return len(made)

    assert cache.get("k", w, make) == 1 and cache.get("k", w, make) == 1
    w.add_(1)  # version
    assert cache.get("k", w, make) == 2
    w.data = torch.randn(4, 16)  # storage
    assert cache.get("k", w, make) == 3
    w.data = w.data.to(torch.float64)  # dtype (new storage too)
    assert cache.get("k", w, make) == 4
    v = w.view(16, 4)  # same storage, version and dtype; only the shape differs
    assert cache.get("k", w, make) == 4 and cache.get("k", v, make) == 5
    assert cache.misses == 5


def test_apply_rht_uses_a_cached_matrix_that_callers_cannot_disturb():
    x = torch.randn(3, 32)
    ref = (
        (x.bfloat16().double().reshape(3, 2, 16) @ rht_matrix(torch.float64))
        .reshape(3, 32)
        .float()
        .bfloat16()
    )
    y = apply_rht(x)
    assert torch.equal(y, ref)
    r = rht_matrix(torch.float64)
    r.mul_(0)  # the public builder returns a fresh tensor: mutating it cannot reach the cache
    assert torch.equal(apply_rht(x), ref)
    assert torch.allclose(inverse_rht(y), x.bfloat16().float(), atol=0.05)


def test_gemm_mode_follows_the_options(minite_options):
    pytest.importorskip("triton", reason="triton is not installed")
    from minite_kernels.backends.triton.backend import gemm_mode

    assert gemm_mode() == "dequant"
    minite_options(gemm="exact")
    assert gemm_mode() == "exact"
    with use_options(gemm="exact_fused"):
        assert gemm_mode() == "exact_fused"
    assert gemm_mode() == "exact"
    with pytest.raises(ValueError, match="Options.gemm='fast' is not valid"):
        minite_options(gemm="fast")
    assert gemm_mode() == "exact"  # a refused change changes nothing


# --- the Triton backend's plumbing, with its kernels run by Triton's CPU interpreter -------------------------


def test_triton_plumbing_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
@pytest.mark.parametrize(
    "name, mode",
    [
        ("nvfp4_per_token_bf16_bwd", "dequant"),
        ("nvfp4_per_token_bf16_bwd", "exact"),
        ("nvfp4_per_token", "dequant"),
        ("w4a16_nvfp4", "exact"),
    ],
)
def test_interp_triton_dense_equals_generic(name, mode, minite_options):
    from minite_kernels.backends.triton import TritonBackend

    minite_options(gemm=mode)
    x, w, b, dy = _inputs(torch.bfloat16, seed=3)
    tb = TritonBackend("cpu")
    dense = _run(x, w, b, dy, recipe(name), tb, grouped=False)
    tb.clear_cache()
    generic = _run(x, w, b, dy, recipe(name), tb, grouped=True)
    _assert_same(dense, generic)
    emu = _run(x, w, b, dy, recipe(name), get_backend("emulated", "cpu"), grouped=False)
    y, y_ref = dense[0].double(), emu[0].double()
    # bf16 GEMM operands and outputs against the fp32 reference
    assert ((y - y_ref).norm() / y_ref.norm()).item() < 1e-2


@interp_only
def test_interp_save_dequantized_keeps_one_bf16_tensor_and_same_grads(minite_options):
    """``save_activations="dequantized"`` saves the forward's BF16 ``deq`` (1 tensor) instead of the packed
    operand (data, scales, amax, nonfinite: 4 tensors); gradients are bit-identical (deq is bit-equal to
    dequantizing the bytes)."""
    from minite_kernels.backends.triton import TritonBackend

    x, w, b, dy = _inputs(torch.bfloat16, seed=5)
    r = recipe("nvfp4_per_token_bf16_bwd")
    results, saved = {}, {}
    for mode in ("packed", "dequantized"):
        minite_options(save_activations=mode)
        shapes = []

        def pack(t, shapes=shapes):
            shapes.append((tuple(t.shape), t.dtype))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            results[mode] = _run(x, w, b, dy, r, TritonBackend("cpu"), grouped=False)
        saved[mode] = shapes
    _assert_same(results["packed"], results["dequantized"])
    # packed: the weight and the input operand's four tensors; dequantized (the fast lane): the input's BF16
    # dequantized copy and the weight-sized dequantized weight (the cached one, no new memory)
    assert len(saved["packed"]) == 1 + 4
    assert sorted(saved["dequantized"]) == sorted([((M, K), torch.bfloat16), ((N, K), torch.bfloat16)])


def test_save_mode_rejects_unknown_values():
    with pytest.raises(ValueError, match=r"MINITE_SAVE_ACTIVATIONS='fp8' is not valid; valid: recipe, dequantized, packed"):
        Options.from_env({"MINITE_SAVE_ACTIVATIONS": "fp8"})
    assert Options.from_env({"MINITE_SAVE_ACTIVATIONS": " Dequantized"}).save_activations == "dequantized"

"""GPU tests of the Triton backend against the pure-PyTorch reference (``minite_kernels.formats``).

Quantization and dequantization are compared byte for byte (data, scales, amax) with the reference run on
the CPU; GEMMs with a stated tolerance (FP32 accumulation order, one BF16 output rounding, and for the cuBLAS
path one extra BF16 rounding before the epilogue):

    |Y - Y_ref| <= 2e-2 * |Y_ref| + 2e-3 * max|Y_ref|  elementwise,  rel_l2 <= 5e-3   (BF16 output)

for every GEMM mode (``MINITE_TRITON_GEMM``): ``dequant`` (BF16-rounded dequantized operands, default),
``exact`` (exact q*s_b operands, cuBLAS, FP32 epilogue) and ``exact_fused`` (one Triton kernel); FP32
outputs always take the exact path.

Run on the H200: ``python -m pytest tests/minite_kernels/test_triton_kernels.py -m gpu -q``.
"""

from __future__ import annotations

import pytest
import torch

from minite_kernels.options import options, use_options

pytestmark = pytest.mark.gpu

triton = pytest.importorskip("triton")


def _tk():
    import minite_kernels.backends.triton as tk

    return tk


def _heavy(m, k, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g) * torch.exp(
        2.0 * torch.randn(m, k, device="cuda", generator=g)
    )
    return x.to(dtype)


def _ref(x, **kw):
    from minite_kernels.formats import quantize_nvfp4

    return quantize_nvfp4(x.detach().cpu(), **kw)


def _assert_same_bytes(data, scales, amax, ref):
    rd = ref.data.cpu()
    assert torch.equal(data.cpu(), rd), f"data differs in {(data.cpu() != rd).sum().item()} bytes"
    s, rs = scales.cpu().view(torch.uint8), ref.scales.cpu().view(torch.uint8)
    assert torch.equal(s, rs), f"scales differ in {(s != rs).sum().item()} bytes"
    assert torch.equal(amax.cpu().view(torch.int32), ref.amax.cpu().view(torch.int32))


def _rel_l2(ref, x):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize(
    "scaling,tile", [("per_tensor", (1, 16)), ("per_tensor", (16, 16)), ("per_token", (1, 16))]
)
@pytest.mark.parametrize("shape", [(256, 2560), (48, 4112), (1, 16), (333, 272)])
def test_quantize_bytes_match_reference(dtype, scaling, tile, shape):
    m, k = shape
    if tile == (16, 16) and m % 16:
        m = (m + 15) // 16 * 16
    x = _heavy(m, k, dtype, seed=m + k)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    data, scales, amax, nonfinite, qs, deq = _tk().quantize_nvfp4_triton(
        x, per_token=scaling == "per_token", tile16=tile == (16, 16), write_qs=True, write_deq=True
    )
    ref = _ref(x, scaling=scaling, tile=tile)
    _assert_same_bytes(data, scales, amax, ref)
    assert torch.equal(nonfinite.cpu(), ref.nonfinite)
    assert torch.equal(deq.cpu(), ref.dequantize(torch.bfloat16))  # bit-equal dequantized operand
    # qs = e2m1 * s_b exactly (the dequantized value without the outer amax/2688)
    qs_ref = _tk().dequantize_nvfp4_triton(data, scales, None, per_token=False, dtype=torch.float32)
    assert torch.equal(qs.float(), qs_ref)


def test_quantize_noncontiguous_and_edge_values():
    tk = _tk()
    x = _heavy(512, 256).t()  # a transposed view: stride_k != 1
    d, s, a, *_ = tk.quantize_nvfp4_triton(x, per_token=True)
    _assert_same_bytes(d, s, a, _ref(x.contiguous(), scaling="per_token"))
    z = torch.zeros(32, 64, device="cuda", dtype=torch.bfloat16)
    z[1, :16] = 1e-30  # underflowing block scale (s_b = 0)
    z[2, 3] = 2688.0
    z[3] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5] * 8, device="cuda")  # E2M1 ties
    for per_token in (True, False):
        d, s, a, *_ = tk.quantize_nvfp4_triton(z.float(), per_token=per_token)
        _assert_same_bytes(d, s, a, _ref(z.float(), scaling="per_token" if per_token else "per_tensor"))


@pytest.mark.parametrize("per_token", [True, False])
def test_nonfinite_poisons_like_reference(per_token):
    x = _heavy(64, 128)
    x[5, 7] = float("inf")
    x[9, 0] = float("nan")
    d, s, a, *_ = _tk().quantize_nvfp4_triton(x, per_token=per_token)
    ref = _ref(x, scaling="per_token" if per_token else "per_tensor")
    assert torch.equal(d.cpu(), ref.data)
    assert torch.equal(s.cpu().view(torch.uint8), ref.scales.view(torch.uint8))
    assert torch.equal(a.cpu().isnan(), ref.amax.isnan())
    assert torch.equal(a.cpu().nan_to_num(), ref.amax.nan_to_num())


@pytest.mark.parametrize(
    "spec_kw",
    [
        dict(scaling="per_token"),
        dict(scaling="per_tensor", tile=(16, 16)),
        dict(scaling="per_tensor", rht=True),
    ],
)
def test_backend_quantize_and_dequantize_bit_exact(spec_kw):
    from minite_kernels.recipes import OperandSpec

    spec = OperandSpec("nvfp4", **spec_kw)
    tb = _tk().TritonBackend("cuda")
    x = _heavy(128, 512)
    q = tb.quantize(x, spec)
    ref = _ref(x, scaling=spec.scaling, tile=spec.tile, rht=spec.rht)
    _assert_same_bytes(q.data, q.scales, q.amax, ref)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(q.dequantize(dtype).cpu(), ref.dequantize(dtype))


def test_stochastic_rounding_matches_reference_given_the_same_generator():
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import OperandSpec

    spec = OperandSpec("nvfp4", "per_tensor", (1, 16), False, True)
    x = _heavy(256, 512)
    q = _tk().TritonBackend("cuda").quantize(x, spec, generator=torch.Generator(device="cuda").manual_seed(7))
    ref = quantize_nvfp4(x, rounding="stochastic", generator=torch.Generator(device="cuda").manual_seed(7))
    _assert_same_bytes(q.data, q.scales, q.amax, ref)  # same random bytes -> same codes
    # and it is unbiased: averaged over draws the error shrinks below round-to-nearest's
    xs = _heavy(64, 256)
    tb = _tk().TritonBackend("cuda")
    mean = sum(tb.quantize(xs, spec).dequantize() for _ in range(64)) / 64
    rn = tb.quantize(xs, OperandSpec("nvfp4")).dequantize()
    assert _rel_l2(xs.float(), mean) < 0.5 * _rel_l2(xs.float(), rn)


def _check_gemm(y, ref, out_dtype, fused=False):
    y, ref = y.double().cpu(), ref.double().cpu()
    assert torch.isfinite(y).all()
    if out_dtype == torch.float32 and fused:  # FP32 accumulate + FP32 epilogue, no BF16 rounding anywhere
        assert _rel_l2(ref, y) < 1e-5
    err = (y - ref).abs()
    assert (err <= 2e-2 * ref.abs() + 2e-3 * ref.abs().max()).all(), f"max err {err.max().item()}"
    assert _rel_l2(ref, y) < 5e-3


@pytest.mark.parametrize("mode", ["dequant", "exact", "exact_fused"])
@pytest.mark.parametrize("recipe", ["nvfp4_per_token", "nvfp4_per_tensor"])
@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad"])
def test_qgemm_matches_emulated(mode, recipe, gemm, minite_options):
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import get_qlinear_params

    minite_options(gemm=mode)
    spec = get_qlinear_params(recipe).gemm(gemm)
    m, n, k = 384, 320, 512
    a = _heavy(m, k, seed=1)
    b = _heavy(n, k, seed=2)
    tb = _tk().TritonBackend("cuda")

    def q(t, s, gen):
        return quantize_nvfp4(
            t,
            scaling=s.scaling,
            tile=s.tile,
            rht=s.rht,
            rounding="stochastic" if s.stochastic_rounding else "nearest",
            generator=gen if s.stochastic_rounding else None,
        )

    for out_dtype in (torch.bfloat16, torch.float32):
        tb.clear_cache()
        y = tb.qgemm_nt(
            a, b, spec.a, spec.b, out_dtype=out_dtype, generator=torch.Generator(device="cuda").manual_seed(3)
        )
        gen = torch.Generator(device="cuda").manual_seed(3)
        ref = q(a, spec.a, gen).dequantize().double() @ q(b, spec.b, gen).dequantize().double().t()
        assert y.dtype == out_dtype and y.shape == (m, n)
        _check_gemm(y, ref, out_dtype, fused=True)  # FP32 outputs always take the FP32-exact fused kernel


@pytest.mark.parametrize("m", [1, 5, 48, 64, 65, 200])
def test_fused_gemm_small_m_fixed_config_and_autotuned(m, minite_options):
    """FP32 outputs of the fused kernel at decode sizes (M <= SMALL_M: the fixed configuration, no autotuner)
    and above (autotuned) against the FP64 reference GEMM; the pair decode kernel is off, so 1-4 rows reach
    the fused GEMM too."""
    from minite_kernels.backends.triton import gemm as G
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import get_qlinear_params

    minite_options(decode="off")
    assert (G.fixed_meta(m) is not None) == (m <= G.SMALL_M)
    spec = get_qlinear_params("nvfp4_per_token").fprop
    x, w = _heavy(m, 576, seed=6), _heavy(1536, 576, seed=7)
    qw = quantize_nvfp4(w, tile=(1, 16))
    y = _tk().TritonBackend("cuda").qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=torch.float32)
    ref = quantize_nvfp4(x, scaling="per_token").dequantize().double() @ qw.dequantize().double().t()
    assert y.dtype == torch.float32 and y.shape == (m, 1536)
    _check_gemm(y, ref, torch.float32, fused=True)


def test_qgemm_with_a_weight_quantized_by_the_reference():
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import get_qlinear_params

    spec = get_qlinear_params("nvfp4_per_token").fprop
    x, w = _heavy(64, 256, seed=4), _heavy(128, 256, seed=5)
    qw = quantize_nvfp4(w, tile=(16, 16))  # a plain NVFP4Tensor (another backend's cache)
    y = _tk().TritonBackend("cuda").qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=torch.float32)
    ref = quantize_nvfp4(x, scaling="per_token").dequantize().double() @ qw.dequantize().double().t()
    _check_gemm(y, ref, torch.float32, fused=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprobs_entropy_match_torch(temperature):
    tk = _tk()
    g = torch.Generator(device="cuda").manual_seed(0)
    t, h, v = 300, 256, 5000
    hid = (torch.randn(t, h, device="cuda", generator=g)).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.05).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, v, (t,), device="cuda", generator=g)
    lp, ent = tk.logprobs_and_entropy(hid, w, ids, temperature=temperature, chunk=128)
    lp_r, ent_r = tk.logprobs_and_entropy_torch(hid, w, ids, temperature=temperature, chunk=128)
    assert torch.allclose(lp, lp_r, atol=2e-4, rtol=1e-4)
    assert torch.allclose(ent, ent_r, atol=2e-4, rtol=1e-4)
    gl = torch.randn(t, device="cuda", generator=g)
    ge = torch.randn(t, device="cuda", generator=g)
    d1 = torch.autograd.grad((lp * gl).sum() + (ent * ge).sum(), (hid, w))
    d2 = torch.autograd.grad((lp_r * gl).sum() + (ent_r * ge).sum(), (hid, w))
    for a, b in zip(d1, d2):  # bf16 dlogits and bf16 GEMM outputs on both sides
        assert _rel_l2(b.float(), a.float()) < 2e-2


def test_activation_cache_reuses_only_unchanged_inputs():
    from minite_kernels.recipes import OperandSpec

    tb = _tk().TritonBackend("cuda")
    spec = OperandSpec("nvfp4", "per_token")
    x = _heavy(64, 256, seed=3)
    q1 = tb.quantize(x, spec)
    assert tb.quantize(x.view(64, 256), spec) is q1  # q/k/v projections: same storage, same version
    with torch.no_grad():
        x.mul_(2.0)  # in place: the version counter moves
    q2 = tb.quantize(x, spec)
    assert q2 is not q1
    _assert_same_bytes(q2.data, q2.scales, q2.amax, _ref(x, scaling="per_token"))
    assert tb.quantize(x.clone(), spec) is not q2  # another tensor with equal values is quantized afresh


@pytest.mark.parametrize("cuda_graph", [True, False])
def test_weight_sync_requantizes_after_inplace_update(cuda_graph):
    tk = _tk()
    ws = [_heavy(256, 512, seed=s) for s in range(3)] + [_heavy(64, 1024, seed=9)]
    sync = tk.WeightRequantizer(ws, cuda_graph=cuda_graph, write_qs=True, write_deq=True)
    for step in range(2):
        if step:
            with torch.no_grad():
                for w in ws:
                    w.mul_(1.5).add_(0.01)  # an "optimizer step" in place
        out = sync.sync()
        torch.cuda.synchronize()
        for w, q, qs in zip(ws, out, sync.qs):
            ref = _ref(w, tile=(16, 16))
            _assert_same_bytes(q.data, q.scales, q.amax, ref)
            assert torch.equal(
                qs.float(), tk.dequantize_nvfp4_triton(q.data, q.scales, None, per_token=False)
            )
            assert torch.equal(q.deq.cpu(), ref.dequantize(torch.bfloat16))


@pytest.mark.parametrize("recipe", ["nvfp4_per_token_bf16_bwd", "nvfp4_per_token"])
def test_linear_module_triton_matches_emulated(recipe):
    from minite_kernels.modules import Linear

    torch.manual_seed(0)
    lin_t = Linear(
        512, 256, bias=True, qlinear_params=recipe, backend="triton", device="cuda", dtype=torch.bfloat16
    )
    lin_e = Linear(
        512, 256, bias=True, qlinear_params=recipe, backend="emulated", device="cuda", dtype=torch.bfloat16
    )
    lin_e.load_state_dict(lin_t.state_dict())
    x = _heavy(2 * 128, 512, seed=11).reshape(2, 128, 512)
    xt, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    yt, ye = lin_t(xt), lin_e(xe)
    assert _rel_l2(ye.float(), yt.float()) < 5e-3
    dy = torch.randn_like(yt)
    # stochastic rounding (nvfp4_per_token's gradients) draws from the default CUDA generator in the same
    # order in both backends, so reseeding makes the random bytes identical
    torch.cuda.manual_seed(5)
    yt.backward(dy)
    torch.cuda.manual_seed(5)
    ye.backward(dy)
    assert _rel_l2(xe.grad.float(), xt.grad.float()) < 1e-2
    assert _rel_l2(lin_e.weight.grad.float(), lin_t.weight.grad.float()) < 1e-2


def test_save_dequantized_activations_gives_identical_gradients(minite_options):
    """MINITE_SAVE_ACTIVATIONS=dequantized keeps the forward's BF16 deq for backward: same bits as
    re-dequantizing the packed bytes, so y, dx, dw, db are bit-identical to the default."""
    from minite_kernels.modules import Linear

    torch.manual_seed(0)
    lin = Linear(
        512,
        256,
        bias=True,
        qlinear_params="nvfp4_per_token_bf16_bwd",
        backend="triton",
        device="cuda",
        dtype=torch.bfloat16,
    )
    x = _heavy(2 * 128, 512, seed=12).reshape(2, 128, 512)
    dy = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    out = {}
    for mode in ("packed", "dequantized"):
        minite_options(save_activations=mode)
        lin.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        y = lin(xi)
        y.backward(dy)
        out[mode] = (y.detach(), xi.grad, lin.weight.grad.clone(), lin.bias.grad.clone())
    for a, b in zip(out["packed"], out["dequantized"]):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------------
# BF16 fast path at the benchmark size, grouped weight sync at Qwen3-1.7B shapes
# ------------------------------------------------------------------------------------------------------
_REF_CACHE: dict = {}


def _big_case(scaling, tile):
    """8192x8192 bf16 (the benchmark's tensor) with a poisoned row for per-token scaling, and its CPU
    reference (computed once per case)."""
    key = (scaling, tile)
    if key not in _REF_CACHE:
        x = _heavy(8192, 8192, seed=21)
        if scaling == "per_token":
            x[77, 4000] = float("nan")
            x[78, :16] = -0.0
        _REF_CACHE.clear()  # keep one 8192^2 case in host memory at a time
        _REF_CACHE[key] = (x, _ref(x, scaling=scaling, tile=tile))
    return _REF_CACHE[key]


def _qs_bits_ref(ref):
    from minite_kernels.formats import e2m1_decode

    m, k = ref.rows, ref.cols
    v = e2m1_decode(ref.codes()).view(m, k // 16, 16) * ref.scales_f32().unsqueeze(-1)
    return v.reshape(m, k).to(torch.bfloat16).view(torch.int16)


@pytest.mark.parametrize(
    "scaling,tile", [("per_token", (1, 16)), ("per_tensor", (1, 16)), ("per_tensor", (16, 16))]
)
def test_bf16_fast_path_8192_bytes_match_reference(scaling, tile):
    from minite_kernels.backends.triton import quantize as q

    x, ref = _big_case(scaling, tile)
    per_token, tile16 = scaling == "per_token", tile == (16, 16)
    d, s, a, nf, *_ = q.quantize_nvfp4_triton(x, per_token=per_token, tile16=tile16)  # the benchmark call
    _assert_same_bytes(d, s, a, ref)
    assert torch.equal(nf.cpu(), torch.isnan(ref.amax))
    d, s, a, nf, qs, deq = q.quantize_nvfp4_triton(
        x, per_token=per_token, tile16=tile16, write_qs=True, write_deq=True
    )
    _assert_same_bytes(d, s, a, ref)
    dr = ref.dequantize(torch.bfloat16)
    fin = ~torch.isnan(dr)
    assert torch.equal(torch.isnan(deq.cpu()), ~fin)
    qr = _qs_bits_ref(ref)
    qfin = ~torch.isnan(ref.scales_f32()).repeat_interleave(16, dim=1)
    # bit patterns, signed zeros included
    assert torch.equal(deq.cpu().view(torch.int16)[fin], dr.view(torch.int16)[fin])
    assert torch.equal(qs.cpu().view(torch.int16)[qfin], qr[qfin])
    if per_token:
        *_, a2, _nf, qs2, _ = q.quantize_nvfp4_triton(x, per_token=True, write_packed=False, write_qs=True)
        assert torch.equal(qs2, qs)  # amax holds a NaN (row 77): compare bit patterns
        assert torch.equal(a2.view(torch.int32), a.view(torch.int32))


@pytest.mark.parametrize("words_per_thread", [8, 16, 32])
@pytest.mark.parametrize("program_words", [1024, 2048, 4096, 8192])
def test_every_swept_per_token_launch_size_is_byte_exact(words_per_thread, program_words, monkeypatch):
    """Each per-token launch size ``scripts/bench_quantize_sweeps.py`` may recommend (learner K values, a
    poisoned row, packed + qs + deq) gives the reference's bytes, so a default can change on timing alone."""
    from minite_kernels.backends.triton import quantize as q

    cfg = dict(q.BF16_CONFIG, token_words_per_thread=words_per_thread, token_program_words=program_words)
    monkeypatch.setattr(q, "BF16_CONFIG", cfg)
    for k in (1024, 2048, 2560, 6144, 9728, 4112):
        x = _heavy(64, k, seed=k)
        x[5, 17] = float("nan")
        d, s, a, nf, qs, deq = q.quantize_nvfp4_triton(x, per_token=True, write_qs=True, write_deq=True)
        ref = _ref(x, scaling="per_token")
        _assert_same_bytes(d, s, a, ref)
        # packed only: K = 2560, 6144, 9728, 4112 rows are held as two segments (_token_geometry)
        _assert_same_bytes(*q.quantize_nvfp4_triton(x, per_token=True)[:3], ref)
        assert torch.equal(nf.cpu(), torch.isnan(ref.amax))
        dr = ref.dequantize(torch.bfloat16)
        fin = ~torch.isnan(dr)
        assert torch.equal(deq.cpu().view(torch.int16)[fin], dr.view(torch.int16)[fin])
        qfin = ~torch.isnan(ref.scales_f32()).repeat_interleave(16, dim=1)
        assert torch.equal(qs.cpu().view(torch.int16)[qfin], _qs_bits_ref(ref)[qfin])


def _qwen3_1p7b_layer(device="cuda"):
    shapes = [
        (2048, 2048),
        (1024, 2048),
        (1024, 2048),
        (2048, 2048),
        (6144, 2048),
        (6144, 2048),
        (2048, 6144),
    ]
    return [(torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16) for n, k in shapes]


@pytest.mark.parametrize("chunk_bytes", [None, 32 << 20])
def test_grouped_weight_sync_qwen3_shapes_match_reference(chunk_bytes):
    tk = _tk()
    ws = _qwen3_1p7b_layer()
    ws[4][100, 7] = float("inf")  # poisons the gate projection only
    sync = tk.WeightRequantizer(ws, write_qs=True, chunk_bytes=chunk_bytes)  # grouped (default), CUDA graph
    assert sync.grouped and not sync._single
    per_weight = tk.WeightRequantizer(ws, write_qs=True, grouped=False)
    for step in range(2):
        if step:
            with torch.no_grad():
                for w in ws:
                    w.mul_(1.5).add_(0.001)  # an optimizer step in place
        out, base = sync.sync(), per_weight.sync()
        torch.cuda.synchronize()
        for w, q, p in zip(ws, out, base):
            ref = _ref(w, tile=(16, 16))
            _assert_same_bytes(q.data, q.scales, q.amax, ref)
            assert q.nonfinite.item() == bool(torch.isnan(ref.amax).item())
            if not q.nonfinite.item():
                assert torch.equal(q.qs.cpu().view(torch.int16), _qs_bits_ref(ref))
            assert torch.equal(p.data, q.data) and torch.equal(
                p.scales.view(torch.uint8), q.scales.view(torch.uint8)
            )


@pytest.mark.parametrize("per_token,tile16", [(True, False), (False, False), (False, True)])
def test_cached_launches_pick_jit_kernel_and_give_reference_bytes(per_token, tile16, monkeypatch):
    """Every BF16 quantize launch through the cached launcher (``launcher.py``) uses the compiled kernel
    ``JITFunction.run`` would pick (``verify``), across aligned and misaligned inputs and row strides, and
    the bytes equal the reference's and the ``launch="jit"`` launch's."""
    from minite_kernels.backends.triton import quantize as q

    assert options().launch == "cached"
    launchers = q._launchers()
    for lau in launchers:
        monkeypatch.setattr(lau, "verify", True)
    before = sum(lau.direct_launches for lau in launchers)
    base = _heavy(64, 2048 + 64, seed=3)
    for x in (base[:, :2048], base[:, 16:2064], base[:, 8:2056], base[:16, :1024], base[:48, 2:18]):
        for _ in range(2):  # the second call is a cached launch
            d, s, a, _nf, _qs, deq = q.quantize_nvfp4_triton(
                x, per_token=per_token, tile16=tile16, write_deq=True
            )
        ref = _ref(
            x, scaling="per_token" if per_token else "per_tensor", tile=(16, 16) if tile16 else (1, 16)
        )
        _assert_same_bytes(d, s, a, ref)
        with use_options(launch="jit"):
            dj, sj, _aj, _nf, _q, deqj = q.quantize_nvfp4_triton(
                x, per_token=per_token, tile16=tile16, write_deq=True
            )
        assert torch.equal(d, dj) and torch.equal(s.view(torch.uint8), sj.view(torch.uint8))
        assert torch.equal(deq.view(torch.int16), deqj.view(torch.int16))
    assert sum(lau.direct_launches for lau in launchers) > before


def test_huge_finite_input_decodes_finite_as_the_reference():
    """amax above FLT_MAX / 448 (TE's decode order overflows there): the deq output and the dequantize kernel
    equal the reference bit for bit and are finite; a per-token row under the limit keeps TE's order."""
    tk = _tk()
    x = _heavy(40, 256, seed=9).float()
    x = (x / x.abs().amax() * torch.finfo(torch.bfloat16).max).bfloat16()
    x[3] = (x[3].float() * 1e-6).bfloat16()
    for per_token in (True, False):
        d, s, a, _nf, _qs, deq = tk.quantize_nvfp4_triton(x, per_token=per_token, write_deq=True)
        ref = _ref(x, scaling="per_token" if per_token else "per_tensor")
        _assert_same_bytes(d, s, a, ref)
        want = ref.dequantize(torch.bfloat16)
        assert torch.equal(deq.cpu().view(torch.int16), want.view(torch.int16)) and torch.isfinite(deq).all()
        back = tk.dequantize_nvfp4_triton(d, s, a, per_token=per_token)
        assert torch.equal(back.cpu(), ref.dequantize()) and torch.isfinite(back).all()

"""Backend factory, gating messages, the emulated reference GEMM, and Blackwell argument preparation on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minite_kernels import backends as B
from minite_kernels.backends import base as base_mod
from minite_kernels.backends.base import Backend, BackendUnavailable
from minite_kernels.backends.emulated import EmulatedBackend
from minite_kernels.formats import quantize_mxfp8, quantize_nvfp4, swizzle_scales_128x4
from minite_kernels.recipes import BF16, OperandSpec

NV = OperandSpec("nvfp4")
NV_TOK = OperandSpec("nvfp4", "per_token")
NV_2D = OperandSpec("nvfp4", tile=(16, 16))
NV_RHT = OperandSpec("nvfp4", rht=True)
MX = OperandSpec("mxfp8")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# --- factory -----------------------------------------------------------------------------------------
def test_auto_on_cpu_routes_everything_to_emulated():
    auto = B.get_backend("auto", "cpu")
    assert isinstance(auto, B.AutoBackend)
    assert [b.name for b in auto.candidates][-1] == "emulated"
    backend, why = auto.plan_gemm(NV_TOK, NV_2D)
    assert backend.name == "emulated" and "no CUDA device" in why
    assert B.get_backend("auto", "cpu") is auto  # cached per (name, device)


def test_unknown_backend_has_closest_match():
    with pytest.raises(ValueError, match="did you mean 'flashinfer'\\?"):
        B.get_backend("flashinfr", "cpu")


@pytest.mark.parametrize("name", ["te", "flashinfer"])
def test_blackwell_backends_refuse_on_cpu(name):
    with pytest.raises(BackendUnavailable, match="compute capability 10.0"):
        B.get_backend(name, "cpu")


@pytest.mark.parametrize("name", ["te", "flashinfer"])
def test_blackwell_backends_refuse_on_hopper(monkeypatch, name):
    monkeypatch.setattr(base_mod, "cuda_capability", lambda device=None: (9, 0))
    ok, why = B.backend_class(name).availability("cuda")
    assert not ok and "need compute capability 10.0; this GPU is sm_90" in why
    if name == "flashinfer":
        assert "silently return zeros" in why


@pytest.mark.parametrize("name", ["te", "flashinfer"])
def test_blackwell_backends_without_package(monkeypatch, name):
    monkeypatch.setattr(base_mod, "cuda_capability", lambda device=None: (10, 0))
    ok, why = B.backend_class(name).availability("cuda")
    assert not ok and "not importable" in why and "minite-rl[blackwell]" in why


def test_flashinfer_refuses_fast_math(monkeypatch):
    monkeypatch.setattr(base_mod, "cuda_capability", lambda device=None: (10, 0))
    monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "0")
    ok, why = B.backend_class("flashinfer").availability("cuda")
    assert not ok and "not bit-exact" in why


def test_auto_skips_backends_that_refuse_a_gemm():
    class NoMX(EmulatedBackend):
        name = "nomx"

        def supports_gemm(self, a_spec, b_spec):
            return (
                (False, "no MXFP8 here") if "mxfp8" in (a_spec.format, b_spec.format) else (True, "nomx: ok")
            )

    auto = B.AutoBackend("cpu")
    auto.candidates = [NoMX("cpu"), EmulatedBackend("cpu")]
    assert auto.plan_gemm(NV, NV)[0].name == "nomx"
    chosen, why = auto.plan_gemm(MX, MX)
    assert chosen.name == "emulated" and "nomx cannot: no MXFP8 here" in why


def test_plan_recipe_rows():
    from minite_kernels.recipes import get_qlinear_params

    rows = B.plan_recipe(get_qlinear_params("w4a16_nvfp4", env={}), "auto", "cpu")
    assert [(r["gemm"], r["backend"], r["ok"]) for r in rows] == [
        ("fprop", "emulated", True),
        ("dgrad", "torch", True),
        ("wgrad", "torch", True),
    ]
    rows = B.plan_recipe(get_qlinear_params("mxfp8", env={}), "te", "cpu")
    assert not any(r["ok"] for r in rows)


# --- emulated reference ------------------------------------------------------------------------------
def test_worked_example_ones():
    # amax 1 -> S_enc 2688, block scale 448, codes decode to exactly 1.0: 16 products of 1
    a = torch.ones(1, 16)
    assert B.get_backend("emulated", "cpu").qgemm_nt(a, a, NV, NV).item() == 16.0


@pytest.mark.parametrize(
    "a_spec, b_spec", [(NV, NV), (NV_TOK, NV_2D), (NV_RHT, NV_RHT), (MX, MX), (BF16, NV)]
)
def test_emulated_equals_dequantize_then_matmul(a_spec, b_spec):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(24, 64, generator=g), torch.randn(40, 64, generator=g)
    emu = B.get_backend("emulated", "cpu")
    y = emu.qgemm_nt(a, b, a_spec, b_spec, out_dtype=torch.float32)

    def deq(x, s):
        if not s.quantized:
            return x
        if s.format == "mxfp8":
            return quantize_mxfp8(x).dequantize()
        return quantize_nvfp4(x, scaling=s.scaling, tile=s.tile, rht=s.rht).dequantize()

    assert torch.equal(y, deq(a, a_spec) @ deq(b, b_spec).t())
    tol = {"nvfp4": 0.25, "mxfp8": 0.06}[b_spec.format]
    assert rel(y, a @ b.t()) < tol  # RHT cancels: same accuracy class as plain NVFP4


def test_cached_operands_give_identical_results():
    emu = B.get_backend("emulated", "cpu")
    a, b = torch.randn(8, 32), torch.randn(16, 32)
    y = emu.qgemm_nt(a, b, NV_TOK, NV_2D)
    qb = emu.quantize(b, NV_2D)
    assert torch.equal(emu.qgemm_nt(a, None, NV_TOK, NV_2D, b_quantized=qb), y)
    qa = emu.quantize(a, NV_TOK)
    assert torch.equal(
        emu.qgemm_nt(None, None, NV_TOK, NV_2D, a_quantized=qa, b_quantized=qb, out_dtype=a.dtype), y
    )


def test_contraction_dim_is_zero_padded():
    # wgrad contracts over tokens (37 here): padding with zeros changes no scale, so it equals manual padding
    emu = B.get_backend("emulated", "cpu")
    a, b = torch.randn(16, 37), torch.randn(32, 37)
    y = emu.qgemm_nt(a, b, NV_RHT, NV_RHT)
    ap, bp = F.pad(a, (0, 11)), F.pad(b, (0, 11))
    assert torch.equal(y, emu.qgemm_nt(ap, bp, NV_RHT, NV_RHT))
    y_mx = emu.qgemm_nt(a, b, MX, MX)
    assert torch.equal(y_mx, emu.qgemm_nt(F.pad(a, (0, 27)), F.pad(b, (0, 27)), MX, MX))


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 20), k=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_padding_invariance_property(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    emu = B.get_backend("emulated", "cpu")
    y = emu.qgemm_nt(a, b, NV_TOK, NV)
    kp = -(-k // 16) * 16
    assert y.shape == (m, n)
    assert torch.equal(y, emu.qgemm_nt(F.pad(a, (0, kp - k)), F.pad(b, (0, kp - k)), NV_TOK, NV))


def test_bad_inputs():
    emu = B.get_backend("emulated", "cpu")
    with pytest.raises(ValueError, match="K % 16 == 0"):
        emu.quantize(torch.randn(4, 40), NV)
    with pytest.raises(TypeError, match="floating-point"):
        emu.qgemm_nt(torch.ones(2, 16, dtype=torch.int32), torch.ones(2, 16), NV, NV)
    with pytest.raises(ValueError, match="2-D"):
        emu.qgemm_nt(torch.ones(2, 2, 16), torch.ones(2, 16), NV, NV)
    with pytest.raises(ValueError, match="contraction dims differ"):
        emu.qgemm_nt(torch.ones(2, 16), torch.ones(2, 32), NV, NV)


def test_bf16_gemm_is_plain_matmul():
    emu = B.get_backend("emulated", "cpu")
    a, b = torch.randn(5, 7, dtype=torch.bfloat16), torch.randn(3, 7, dtype=torch.bfloat16)
    assert torch.equal(emu.qgemm_nt(a, b, BF16, BF16), a @ b.t())


def test_backend_is_abstract():
    with pytest.raises(TypeError):
        Backend()  # type: ignore[abstract]


# --- TE / FlashInfer argument preparation (pure torch) -------------------------------------------------
def test_te_scale_layout_roundtrip():
    from minite_kernels.backends.te import pad_scales_for_te, scales_from_te

    q = quantize_nvfp4(torch.randn(130, 80))  # M=130, Kb=5 -> TE buffer [256, 8]
    padded = pad_scales_for_te(q.scales)
    assert padded.shape == (256, 8) and padded.dtype == torch.uint8
    assert torch.equal(padded[:130, :5], q.scales.view(torch.uint8)) and padded[130:].sum() == 0
    back = scales_from_te(padded, 130, 5, swizzled=False, dtype=torch.float8_e4m3fn)
    assert torch.equal(back.view(torch.uint8), q.scales.view(torch.uint8))
    sw = swizzle_scales_128x4(q.scales)
    back = scales_from_te(sw, 130, 5, swizzled=True, dtype=torch.float8_e4m3fn)
    assert torch.equal(back.view(torch.uint8), q.scales.view(torch.uint8))


def test_flashinfer_alpha():
    from minite_kernels.backends.flashinfer import gemm_alpha

    # amax 2688 on both sides: alpha = 2688*2688/(36*448^2) = 1
    assert gemm_alpha(torch.tensor([2688.0]), torch.tensor([2688.0])).item() == 1.0
    assert gemm_alpha(torch.tensor([6.0]), torch.tensor([448.0])).item() == pytest.approx(
        6 * 448 / 2688**2, rel=1e-7
    )


@pytest.mark.parametrize(
    "a_scaling, b_scaling",
    [("per_tensor", "per_tensor"), ("per_token", "per_tensor"), ("per_token", "per_token")],
)
def test_flashinfer_arguments_reproduce_emulated_gemm(a_scaling, b_scaling):
    from minite_kernels.backends.flashinfer import emulate_mm_fp4, mm_fp4_arguments

    g = torch.Generator().manual_seed(1)
    a = torch.randn(33, 64, generator=g) * torch.logspace(-2, 2, 33).unsqueeze(1)
    b = torch.randn(20, 64, generator=g)
    qa, qb = quantize_nvfp4(a, scaling=a_scaling), quantize_nvfp4(b, scaling=b_scaling)
    args = mm_fp4_arguments(qa, qb)
    assert args["b"].shape == (32, 20) and args["b_descale"].shape == (4, 128)  # column-major (k, n) views
    ref = qa.dequantize() @ qb.dequantize().t()
    out = emulate_mm_fp4(args)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


# --- GPU comparisons (run on the machines that have them) -------------------------------------------
def _available(name):
    return B.backend_status(name)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "te", "flashinfer"])
@pytest.mark.parametrize(
    "a_spec, b_spec", [(NV, NV_2D), (NV_TOK, NV_2D), (NV_RHT, NV_RHT), (MX, MX), (BF16, NV)]
)
def test_fast_backend_matches_emulated(name, a_spec, b_spec):
    if not _available(name):
        pytest.skip(B.backend_status(name)[1])
    fast = B.get_backend(name)
    ok, why = fast.supports_gemm(a_spec, b_spec)
    if not ok:
        pytest.skip(why)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(256, 512, device="cuda", generator=g, dtype=torch.bfloat16)
    b = torch.randn(384, 512, device="cuda", generator=g, dtype=torch.bfloat16)
    emu = B.get_backend("emulated", "cuda")
    ref = emu.qgemm_nt(a, b, a_spec, b_spec, out_dtype=torch.float32)
    out = fast.qgemm_nt(a, b, a_spec, b_spec, out_dtype=torch.float32)
    assert torch.allclose(out, ref, rtol=8e-3, atol=8e-3 * ref.abs().max().item())  # TE's GEMM tolerance


def test_te_quantizer_arguments_follow_the_recipe():
    from minite_kernels.backends.te import te_quantizer_kwargs
    from minite_kernels.recipes import get_qlinear_params

    r = get_qlinear_params("nvfp4_per_token", env={})
    x, w = te_quantizer_kwargs(r.fprop.a), te_quantizer_kwargs(r.fprop.b)
    assert x["row_scaled_nvfp4"] and x["rowwise"] and not x["with_rht"] and not x["with_2d_quantization"]
    assert w["with_2d_quantization"] and not w["row_scaled_nvfp4"] and not w["stochastic_rounding"]
    dy = te_quantizer_kwargs(r.dgrad.a)
    assert dy["stochastic_rounding"] and not dy["with_rht"]
    dyt, xt = te_quantizer_kwargs(r.wgrad.a), te_quantizer_kwargs(r.wgrad.b)
    assert dyt["columnwise"] and not dyt["rowwise"] and dyt["with_rht"] and dyt["with_post_rht_amax"]
    assert xt["with_rht"] and not xt["stochastic_rounding"]
    assert te_quantizer_kwargs(MX) == {"rowwise": True, "columnwise": False}
    rows = B.plan_recipe(r, "auto", "cpu")
    assert rows[0]["te_quantizer"]["a"] == x
    assert (
        B.plan_recipe(get_qlinear_params("w4a16_nvfp4", env={}), "auto", "cpu")[0]["te_quantizer"]["a"]
        is None
    )


def test_emulated_weight_dequant_memo_is_exact_and_per_object():
    # The emulated backend memoises the FP32 values of a (cached) B operand on CPU; results must be bit-identical
    # to a fresh dequantize, and a re-quantized weight (new object) must never see the old memo.
    from minite_kernels.backends import get_backend
    from minite_kernels.recipes import get_qlinear_params

    r = get_qlinear_params("nvfp4_per_token_bf16_bwd")
    be = get_backend("emulated")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=g), torch.randn(32, 64, generator=g)
    qw = be.quantize(w, r.fprop.b)
    fresh = be.qgemm_nt(x, w, r.fprop.a, r.fprop.b, out_dtype=torch.float32)
    first = be.qgemm_nt(x, None, r.fprop.a, r.fprop.b, out_dtype=torch.float32, b_quantized=qw)
    again = be.qgemm_nt(x, None, r.fprop.a, r.fprop.b, out_dtype=torch.float32, b_quantized=qw)
    assert torch.equal(fresh, first) and torch.equal(first, again)
    assert torch.equal(qw._emulated_fp32, qw.dequantize(torch.float32))
    w2 = w * 2  # "after an optimizer step": a new quantized object
    qw2 = be.quantize(w2, r.fprop.b)
    assert not hasattr(qw2, "_emulated_fp32")
    out2 = be.qgemm_nt(x, None, r.fprop.a, r.fprop.b, out_dtype=torch.float32, b_quantized=qw2)
    assert torch.equal(out2, be.qgemm_nt(x, w2, r.fprop.a, r.fprop.b, out_dtype=torch.float32))


def test_auto_clear_cache_reaches_every_routed_backend():
    class Remembers:
        cleared = 0

        def clear_cache(self):
            self.cleared += 1

    auto = B.AutoBackend("cpu")
    stub = Remembers()
    auto.candidates = [*auto.candidates, stub]
    auto.clear_cache()  # the emulated backend has no cache: skipped
    assert stub.cleared == 1

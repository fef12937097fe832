"""CPU tests of the Triton kernels under Triton's interpreter (``TRITON_INTERPRET=1``), on tiny shapes.

The same kernels the H200 runs are executed element by element by Triton's NumPy interpreter and compared
with the reference (``minite_kernels.formats``): bytes for quantization, ``rel_l2 <= 1e-5`` for FP32-output
GEMMs. Skipped when triton is not installed (CI installs no GPU extras) and when CUDA is present (the GPU
tests in ``test_triton_kernels.py`` cover the compiled kernels there).
"""

from __future__ import annotations

import pytest
import torch
from minite_test_support import IN_INTERPRETER, interp_only

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")
if torch.cuda.is_available():  # pragma: no cover - GPU machines run test_triton_kernels.py instead
    pytest.skip(
        "CUDA present: the compiled kernels are tested by test_triton_kernels.py", allow_module_level=True
    )


@pytest.fixture(scope="module")
def tk():
    import minite_kernels.backends.triton as mod

    return mod


if not IN_INTERPRETER:

    def test_interpreter_suite_in_subprocess(run_interpreted):
        run_interpreted(__file__)


def _heavy(m, k, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * torch.exp(2.0 * torch.randn(m, k, generator=g))).to(dtype)


def _same(q, ref) -> None:
    data, scales, amax = q
    assert torch.equal(data, ref.data)
    assert torch.equal(scales.view(torch.uint8), ref.scales.view(torch.uint8))
    assert torch.equal(amax.nan_to_num().view(torch.int32), ref.amax.nan_to_num().view(torch.int32))


def _rel(ref, x):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@interp_only
def test_quantize_bytes_match_reference(tk):
    from minite_kernels.formats import quantize_nvfp4

    x = _heavy(32, 48)
    x[3, 5] = float("inf")  # poisons row 3 (per token) / the whole tensor (per tensor)
    for scaling, tile in (("per_token", (1, 16)), ("per_tensor", (1, 16)), ("per_tensor", (16, 16))):
        for inp in (x, x[:, :32].float(), _heavy(32, 32, seed=1)):
            d, s, a, *_ = tk.quantize_nvfp4_triton(
                inp, per_token=scaling == "per_token", tile16=tile == (16, 16)
            )
            _same((d, s, a), quantize_nvfp4(inp, scaling=scaling, tile=tile))


@interp_only
def test_worked_example_bytes(tk):
    # notes §1.9: tensor amax 10, block amax 6.3 -> s_b = 288 (0x79); packed bytes 80 11 a2 44 5d e6 07 78
    vals = [0.1, -0.25, 0.3, 0.75, 1.0, -1.3, 2.0, 2.5, -3.1, 3.5, 4.2, -5.0, 5.9, 0.0, -0.01, 6.3]
    x = torch.tensor([vals + [10.0] + [0.0] * 15])
    d, s, a, *_ = tk.quantize_nvfp4_triton(x, per_token=False)
    assert d[0, :8].tolist() == [0x80, 0x11, 0xA2, 0x44, 0x5D, 0xE6, 0x07, 0x78]
    assert s.view(torch.uint8)[0, 0].item() == 0x79 and a.item() == 10.0


@interp_only
def test_backend_sr_rht_and_dequantize(tk):
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import OperandSpec

    tb = tk.TritonBackend("cpu")
    x = _heavy(16, 64, seed=2)
    spec = OperandSpec("nvfp4", "per_tensor", (1, 16), True, True)  # RHT + stochastic rounding (wgrad dY)
    q = tb.quantize(x, spec, generator=torch.Generator().manual_seed(3))
    ref = quantize_nvfp4(x, rht=True, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    _same((q.data, q.scales, q.amax), ref)
    assert torch.equal(q.dequantize(torch.bfloat16), ref.dequantize(torch.bfloat16))


@interp_only
def test_qgemm_and_decode_match_reference(tk):
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import get_qlinear_params

    spec = get_qlinear_params("nvfp4_per_token").fprop
    x, w = _heavy(32, 64, seed=4), _heavy(32, 64, seed=5)
    ref = (
        quantize_nvfp4(x, scaling="per_token").dequantize().double()
        @ quantize_nvfp4(w, tile=(16, 16)).dequantize().double().t()
    )
    y = tk.TritonBackend("cpu").qgemm_nt(x, w, spec.a, spec.b, out_dtype=torch.float32)
    assert _rel(ref, y) < 1e-5
    qw = quantize_nvfp4(w, tile=(16, 16))
    for b, split in ((2, 2), (4, None)):  # the pair decode kernel with and without split-K
        out, xp = tk.quantize_for_decode(x[:b])
        yd = tk.decode_linear_pairs(xp, out.scales, out.amax, qw.data, qw.scales, qw.amax,
                                    out_dtype=torch.float32, split=split)
        assert _rel(ref[:b], yd) < 1e-5


@interp_only
def test_logprobs_entropy_kernel_matches_torch(tk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(6, 32, generator=g, requires_grad=True)
    w = (torch.randn(300, 32, generator=g) * 0.3).requires_grad_()
    ids = torch.randint(0, 300, (6,), generator=g)
    lp, ent = tk.logprobs_and_entropy(h, w, ids, temperature=0.7, chunk=4)
    lp_r, ent_r = tk.logprobs_and_entropy_torch(h, w, ids, temperature=0.7, chunk=4)
    assert torch.allclose(lp, lp_r, atol=1e-5) and torch.allclose(ent, ent_r, atol=1e-5)
    # worked example of the module docstring: logits (0, ln 3), y = 1 -> logp = ln(3/4), H = 0.5623
    hh = torch.tensor([[1.0]])
    ww = torch.tensor([[0.0], [float(torch.log(torch.tensor(3.0)))]])
    lp1, ent1 = tk.logprobs_and_entropy(hh, ww, torch.tensor([1]))
    assert (
        abs(lp1.item() - float(torch.log(torch.tensor(0.75)))) < 1e-6 and abs(ent1.item() - 0.5623351) < 1e-6
    )
    c = torch.arange(6.0)
    g1 = torch.autograd.grad((lp * c).sum() + (ent * 0.3).sum(), (h, w))
    g2 = torch.autograd.grad((lp_r * c).sum() + (ent_r * 0.3).sum(), (h, w))
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5)


@interp_only
def test_backend_reports_unavailable_on_cpu(tk):
    ok, why = tk.TritonBackend.availability("cpu")
    assert not ok and "CUDA" in why


# ------------------------------------------------------------------------------------------------------
# BF16 fast-path quantizer (quantize_bf16.py) and grouped weight sync
# ------------------------------------------------------------------------------------------------------
def _qs_ref(ref):
    """The exact GEMM operand e2m1 * s_b of a reference NVFP4Tensor (signed zeros included), bf16."""
    from minite_kernels.formats import e2m1_decode

    m, k = ref.rows, ref.cols
    vals = e2m1_decode(ref.codes()).view(m, k // 16, 16) * ref.scales_f32().unsqueeze(-1)
    return vals.reshape(m, k).to(torch.bfloat16)


def _bits(t):
    return t.contiguous().view(torch.int16)


def _same_all(out, ref) -> None:
    """data / scales / amax / nonfinite bytes, and qs / deq bit patterns (signed zeros too; NaN positions
    where the domain is poisoned, where qs is defined as +0)."""
    data, scales, amax, nonfinite, qs, deq = out
    _same((data, scales, amax), ref)
    assert torch.equal(nonfinite, torch.isnan(ref.amax))
    if qs is not None:
        qr = _qs_ref(ref)
        fin = ~torch.isnan(qr)
        assert torch.equal(_bits(qs)[fin], _bits(qr)[fin])
        assert torch.equal(_bits(qs)[~fin], torch.zeros_like(_bits(qs)[~fin]))
    if deq is not None:
        dr = ref.dequantize(torch.bfloat16)
        fin = ~torch.isnan(dr)
        assert torch.equal(torch.isnan(deq), ~fin)
        assert torch.equal(_bits(deq)[fin], _bits(dr)[fin])


@interp_only
def test_huge_finite_input_decodes_finite_as_the_reference(tk):
    """amax above FLT_MAX / 448, where TE's decode order overflows: the kernels form the factor as the reference
    does (formats.nvfp4.dequant_factor), bit for bit, and decode to finite values; a row under the limit keeps
    TE's order."""
    from minite_kernels.formats import quantize_nvfp4

    x = _heavy(17, 64, seed=6).float()
    x = (x / x.abs().amax() * torch.finfo(torch.bfloat16).max).bfloat16()  # tensor amax: the bf16 maximum
    x[3] = (x[3].float() * 1e-6).bfloat16()  # per token, this row stays under the limit
    for per_token in (True, False):
        out = tk.quantize_nvfp4_triton(x, per_token=per_token, write_qs=True, write_deq=True)
        ref = quantize_nvfp4(x, scaling="per_token" if per_token else "per_tensor")
        _same_all(out, ref)
        assert torch.isfinite(out[-1]).all()
        back = tk.dequantize_nvfp4_triton(ref.data, ref.scales, ref.amax, per_token=per_token)
        assert torch.equal(back, ref.dequantize()) and torch.isfinite(back).all()


@pytest.fixture
def quant_mod():
    from minite_kernels.backends.triton import quantize as q

    return q


@interp_only
def test_bf16_quantize_every_output_matches_reference(tk):
    from minite_kernels.formats import quantize_nvfp4

    x = _heavy(17, 112, seed=3)  # 17 rows: not a multiple of any row tile; K/16 = 7 blocks (padded to 8)
    x[2, 5] = float("inf")  # poisons row 2 (per token) / the whole tensor (per tensor)
    x[4, :16] = -0.0  # a block of negative zeros: codes 0, not 8 (the reference tests y < 0)
    x[5, 3] = -1e-38  # rounds to a signed zero code (8)
    wide = _heavy(32, 160, seed=4)
    cases = [
        ("per_token", (1, 16), x),
        ("per_token", (1, 16), wide[:, 16:128]),  # row stride 160 elements, offset 16: strided view
        ("per_tensor", (1, 16), x),
        ("per_tensor", (1, 16), wide[:17, :96]),
        ("per_tensor", (16, 16), wide),
        ("per_tensor", (16, 16), torch.cat([x[:16], x[:16]])),  # poisoned
    ]
    for scaling, tile, inp in cases:
        out = tk.quantize_nvfp4_triton(
            inp, per_token=scaling == "per_token", tile16=tile == (16, 16), write_qs=True, write_deq=True
        )
        _same_all(out, quantize_nvfp4(inp, scaling=scaling, tile=tile))
    # packed only, K/16 = 5 and 6 blocks: the per-token row is held as two segments (4 + 1, 4 + 2)
    for inp in (torch.cat([x[:, :80], wide[:17, :80]]), wide[:, 32:128]):
        d, s, a, *_ = tk.quantize_nvfp4_triton(inp, per_token=True)
        _same((d, s, a), quantize_nvfp4(inp, scaling="per_token"))
    # qs only (the decode path's activation operand), no packed output
    *_, a, _nf, qs, _ = tk.quantize_nvfp4_triton(wide, per_token=True, write_packed=False, write_qs=True)
    ref = quantize_nvfp4(wide, scaling="per_token")
    assert torch.equal(_bits(qs), _bits(_qs_ref(ref))) and torch.equal(a, ref.amax)


@interp_only
def test_bf16_stochastic_rounding_matches_reference(tk):
    from minite_kernels.formats import quantize_nvfp4, random_bytes

    x = _heavy(16, 64, seed=6)
    for scaling in ("per_token", "per_tensor"):
        rb = random_bytes(x.shape, generator=torch.Generator().manual_seed(1), device="cpu")
        out = tk.quantize_nvfp4_triton(x, per_token=scaling == "per_token", rbits=rb, write_qs=True)
        ref = quantize_nvfp4(
            x, scaling=scaling, rounding="stochastic", generator=torch.Generator().manual_seed(1)
        )
        _same_all(out, ref)


if IN_INTERPRETER:
    import triton
    import triton.language as tl

    from minite_kernels.backends.triton.nvfp4_jit import _e2m1_rn

    @triton.jit
    def _rn_kernel(y_ptr, c_ptr, v_ptr, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        y = tl.load(y_ptr + o, mask=m, other=0.0)
        code, mag = _e2m1_rn(tl.minimum(tl.abs(y), 6.0), y)  # the signed code, the magnitude
        tl.store(c_ptr + o, code, mask=m)
        tl.store(v_ptr + o, mag, mask=m)


@interp_only
def test_magic_add_e2m1_rounding_matches_reference_table(tk):
    # ties of the E2M1 grid (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 3.5 -> 4, 5 -> 4: RNE), their fp32 neighbours,
    # saturation (> 6, inf), subnormals, signed zeros and random values of both signs
    from minite_kernels.formats import e2m1_decode, e2m1_encode

    ties = torch.tensor(
        [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 1e30, 1e-40]
        + [float("inf")]
    )
    rnd = torch.rand(3000, generator=torch.Generator().manual_seed(0)) * 8
    a = torch.cat(
        [
            ties,
            torch.nextafter(ties, torch.full_like(ties, float("inf"))),
            torch.nextafter(ties, torch.zeros_like(ties)),
            rnd,
        ]
    )
    y = torch.cat([a, -a])
    c = torch.empty(y.shape, dtype=torch.int32)
    v = torch.empty(y.shape, dtype=torch.float32)
    _rn_kernel[(triton.cdiv(y.numel(), 1024),)](y, c, v, y.numel(), BLOCK=1024)
    ref = e2m1_encode(y).to(torch.int32)  # the reference's signed codes (-0.0 -> 0)
    assert torch.equal(c, ref)
    assert torch.equal(v, e2m1_decode(ref & 7))


@pytest.fixture
def small_tiles(quant_mod):
    """Small tiles, so that the tiny test weights span several tiles in both directions (exercises the
    grouped kernels' flat tile enumeration) and the interpreter runs fast."""
    old = dict(quant_mod.BF16_CONFIG)
    quant_mod.BF16_CONFIG.update(
        amax_rows=16, amax_block_m=8, amax_block_w=32, tile16_nb=4, tensor_block_m=4, tensor_nb=4
    )
    yield
    quant_mod.BF16_CONFIG.update(old)


def _sync_weights():
    ws = [
        _heavy(32, 64, seed=10),
        _heavy(16, 288, seed=11),  # K/16 = 18 blocks: a partial second tile along K
        _heavy(48, 32, seed=12),
        _heavy(32, 128, seed=13)[:, 16:112],  # strided view (row stride 128, offset 16 elements)
        _heavy(16, 64, seed=14).float(),  # fp32: per-weight fallback
    ]
    ws[2][5, 3] = float("nan")  # poisons weight 2 only
    return ws


@interp_only
def test_grouped_weight_sync_matches_reference_and_per_weight_path(tk, small_tiles):
    from minite_kernels.formats import quantize_nvfp4

    ws = _sync_weights()
    sync = tk.WeightRequantizer(ws, write_qs=True, write_deq=True, cuda_graph=False)
    assert sync.grouped and len(sync._groups) == 1 and sync._single == [4]
    out = sync.sync()
    for w, q in zip(ws, out):
        ref = quantize_nvfp4(w, tile=(16, 16))
        _same_all((q.data, q.scales, q.amax, q.nonfinite, q.qs, q.deq), ref)
    with torch.no_grad():
        for w in ws:
            w.mul_(1.5).add_(0.01)  # an optimizer step in place: same buffers, new values
    out = sync.sync()
    for w, q in zip(ws, out):
        _same((q.data, q.scales, q.amax), quantize_nvfp4(w, tile=(16, 16)))


@interp_only
def test_grouped_weight_sync_1x16_chunks_and_ragged_rows(tk, small_tiles):
    from minite_kernels.formats import quantize_nvfp4

    ws = _sync_weights()[:4] + [_heavy(21, 48, seed=15)]  # 21 rows: not a multiple of the 8-row tile
    sync = tk.WeightRequantizer(ws, tile16=False, chunk_bytes=4096, cuda_graph=False)
    assert len(sync._groups) >= 3 and sync.num_launches == 2 * len(sync._groups) + 1
    for q, w in zip(sync.sync(), ws):
        _same((q.data, q.scales, q.amax), quantize_nvfp4(w, tile=(1, 16)))
    per_weight = tk.WeightRequantizer(ws[3:], tile16=False, grouped=False, cuda_graph=False)  # the A/B path
    assert not per_weight._groups and per_weight.num_launches == 6
    for p, w in zip(per_weight.sync(), ws[3:]):
        _same((p.data, p.scales, p.amax), quantize_nvfp4(w, tile=(1, 16)))
    with pytest.raises(ValueError, match="chunk_bytes"):
        tk.WeightRequantizer(ws, tile16=False, chunk_bytes=0)


def test_gemm_autotuning_key_buckets_m():
    """The fused GEMM autotunes per power-of-two bucket of M, not per M: a learner's M (rows x padded length)
    changes almost every step, and each new key re-benchmarks every configuration."""
    pytest.importorskip("triton")
    from minite_kernels.backends.triton.gemm import AUTOTUNE_KEY, m_bucket

    assert "M" not in AUTOTUNE_KEY and "M_BUCKET" in AUTOTUNE_KEY
    assert [m_bucket(m) for m in (1, 16, 17, 32, 33, 1000, 1024, 1025)] == [16, 16, 32, 32, 64, 1024, 1024, 2048]


def test_gemm_decode_sizes_skip_the_autotuner(monkeypatch):
    """M <= SMALL_M rows launch one fixed configuration (a sampler's new batch bucket benchmarks nothing); larger
    M goes to the autotuner; the CPU interpreter always gets its own small tiles."""
    pytest.importorskip("triton")
    from minite_kernels.backends.triton import gemm as G

    monkeypatch.setattr(G, "interpret_mode", lambda: False)
    assert G.fixed_meta(1) == G.fixed_meta(G.SMALL_M) == G.SMALL_M_META
    assert G.fixed_meta(G.SMALL_M + 1) is None
    G.fixed_meta(1)["BLOCK_M"] = 1  # a copy: callers cannot change the default
    assert G.SMALL_M_META["BLOCK_M"] == 64
    monkeypatch.setattr(G, "interpret_mode", lambda: True)
    assert G.fixed_meta(10_000)["DOT_F32"] is True

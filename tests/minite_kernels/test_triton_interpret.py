"""CPU tests of the Triton kernels under Triton's interpreter (``TRITON_INTERPRET=1``), on tiny shapes.

The same kernels the H200 runs are executed element by element by Triton's NumPy interpreter and compared
with the reference (``minite_kernels.formats``): bytes for quantization, ``rel_l2 <= 1e-5`` for FP32-output
GEMMs. Skipped when triton is not installed (CI installs no GPU extras) and when CUDA is present (the GPU
tests in ``test_triton_kernels.py`` cover the compiled kernels there).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")
if torch.cuda.is_available():  # pragma: no cover - GPU machines run test_triton_kernels.py instead
    pytest.skip(
        "CUDA present: the compiled kernels are tested by test_triton_kernels.py", allow_module_level=True
    )

_IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
_interp_only = pytest.mark.skipif(not _IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess")


@pytest.fixture(scope="module")
def tk():
    import minite_kernels.backends.triton as mod

    return mod


if not _IN_INTERPRETER:
    # triton.jit decides at definition time (also for triton's own library functions) whether a kernel is
    # interpreted, so the interpreter suite needs a process that imports triton with TRITON_INTERPRET=1.
    def test_interpreter_suite_in_subprocess():
        import subprocess

        env = dict(os.environ, TRITON_INTERPRET="1")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", __file__, "-q", "-x", "-p", "no:cacheprovider"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout


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


@_interp_only
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


if _IN_INTERPRETER:
    import triton
    import triton.language as tl

    from minite_kernels.backends.triton.quantize import _e2m1_code_rn

    @triton.jit
    def _code_kernel(a_ptr, c_ptr, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        tl.store(c_ptr + o, _e2m1_code_rn(tl.load(a_ptr + o, mask=m, other=0.0)), mask=m)


@_interp_only
def test_e2m1_code_matches_threshold_table(tk):
    from minite_kernels.formats import e2m1_encode

    ties = torch.tensor(
        [
            0.0,
            0.25,
            0.5,
            0.75,
            1.0,
            1.25,
            1.5,
            1.75,
            2.0,
            2.5,
            3.0,
            3.5,
            4.0,
            5.0,
            6.0,
            7.0,
            1e30,
            float("inf"),
            1e-40,
        ]
    )
    rnd = torch.rand(2000, generator=torch.Generator().manual_seed(0)) * 8
    a = torch.cat(
        [
            ties,
            torch.nextafter(ties, torch.full_like(ties, float("inf"))),
            torch.nextafter(ties, torch.zeros_like(ties)),
            rnd,
        ]
    )
    c = torch.empty(a.shape, dtype=torch.int32)
    _code_kernel[(triton.cdiv(a.numel(), 1024),)](a, c, a.numel(), BLOCK=1024)
    assert torch.equal(c, e2m1_encode(a).to(torch.int32))


@_interp_only
def test_worked_example_bytes(tk):
    # notes §1.9: tensor amax 10, block amax 6.3 -> s_b = 288 (0x79); packed bytes 80 11 a2 44 5d e6 07 78
    vals = [0.1, -0.25, 0.3, 0.75, 1.0, -1.3, 2.0, 2.5, -3.1, 3.5, 4.2, -5.0, 5.9, 0.0, -0.01, 6.3]
    x = torch.tensor([vals + [10.0] + [0.0] * 15])
    d, s, a, *_ = tk.quantize_nvfp4_triton(x, per_token=False)
    assert d[0, :8].tolist() == [0x80, 0x11, 0xA2, 0x44, 0x5D, 0xE6, 0x07, 0x78]
    assert s.view(torch.uint8)[0, 0].item() == 0x79 and a.item() == 10.0


@_interp_only
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


@_interp_only
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
    for b, split in ((2, 2), (8, None)):  # FMA path with split-K, tensor-core path
        *_, xa, _nf, xqs, _dq = tk.quantize_nvfp4_triton(
            x[:b], per_token=True, write_packed=False, write_qs=True
        )
        yd = tk.decode_linear(xqs, xa, qw.data, qw.scales, qw.amax, out_dtype=torch.float32, split=split)
        assert _rel(ref[:b], yd) < 1e-5


@_interp_only
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


@_interp_only
def test_backend_reports_unavailable_on_cpu(tk):
    ok, why = tk.TritonBackend.availability("cpu")
    assert not ok and "CUDA" in why

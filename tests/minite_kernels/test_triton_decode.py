"""The packed-FP4 pair decode linear (``minite_kernels/backends/triton/decode.py``) and its routing in the backend.

On CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess, tiny shapes);
on a GPU the compiled kernels (``-m gpu``). Both compare with the FP64 product of the reference dequantized
operands (``rel_l2 <= 1e-5`` for FP32 output: only the FP32 accumulation order differs), the activation
quantizer with the reference bytes, and the BF16 output with the FP32 one rounded to nearest-even
(bit-equal). The first formulation, the benchmarks' baseline, is tested in ``test_decode_planes.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from minite_test_support import IN_INTERPRETER, rel_l2, spread_bf16

from minite_kernels.options import Options, use_options

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")

_DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pdl_here() -> bool:
    from minite_kernels.backends.triton._common import pdl_capable

    return _DEV == "cuda" and pdl_capable(torch.empty(0, device=_DEV))


#: programmatic dependent launch available (sm_90+, not the interpreter): the PDL variants are compared too
_PDL = _pdl_here()


def _heavy(m: int, k: int, seed: int) -> torch.Tensor:
    return spread_bf16(m, k, seed).to(_DEV)


def _check_pairs(batches, n: int, k: int, splits, configs=((None, None, None, 4, 1, True),)) -> None:
    """The fp16x2 pair kernel against the FP64 product (rel_l2 <= 1e-5: every 16-value block sum is exact,
    only the FP32 accumulation across blocks rounds), its BF16 output against its FP32 output rounded once,
    and its activation quantizer against the reference codes laid out by ``pairs_for_decode``. A config's
    last field also runs it (at the default split) with the register double buffer (``prefetch=True``),
    which must give the same bits: it changes when tiles are loaded, not the order of the arithmetic."""
    from minite_kernels.backends.triton.decode import (
        decode_linear_pairs,
        pairs_for_decode,
        quantize_for_decode,
    )
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.formats.e2m1 import e2m1_decode, unpack_nibbles

    x, w = _heavy(max(batches), k, seed=11), _heavy(n, k, seed=12)
    w[3, :16] = 0  # an all-zero block: scale 0, codes 0
    w[5, 16:32] = -w[5, 16:32].abs()  # a block of negative codes only
    qw = quantize_nvfp4(w.cpu(), tile=(16, 16))
    qw_dev = [t.to(_DEV) for t in (qw.data, qw.scales, qw.amax)]
    for b in batches:
        qx = quantize_nvfp4(x[:b].cpu(), scaling="per_token")
        ref = qx.dequantize().double() @ qw.dequantize().double().t()
        out, xp = quantize_for_decode(x[:b])
        if _PDL:
            for pdl in (False, True):
                out_p, xp_p = quantize_for_decode(x[:b], pdl=pdl)
                assert torch.equal(xp_p, xp) and torch.equal(out_p.data, out.data)
                assert torch.equal(out_p.scales.view(torch.uint8), out.scales.view(torch.uint8))
        codes = e2m1_decode(unpack_nibbles(qx.data), torch.float16)
        assert torch.equal(xp.cpu(), pairs_for_decode(codes))  # bit patterns, signed zeros included
        assert torch.equal(out.data.cpu(), qx.data)
        assert torch.equal(out.scales.view(torch.uint8).cpu(), qx.scales.view(torch.uint8))
        for split in splits:
            for bn, bkb, bb, warps, stages, also_prefetch in configs:
                kw = {
                    "split": split,
                    "block_n": bn,
                    "block_kb": bkb,
                    "block_b": bb,
                    "num_warps": warps,
                    "stages": stages,
                }
                y = decode_linear_pairs(xp, out.scales, out.amax, *qw_dev, out_dtype=torch.float32, **kw)
                assert rel_l2(ref, y) < 1e-5, (b, split, bn, bkb, bb, rel_l2(ref, y))
                if also_prefetch and split is None:
                    kp = {**kw, "stages": 1}
                    yr = decode_linear_pairs(
                        xp, out.scales, out.amax, *qw_dev, out_dtype=torch.float32, prefetch=True, **kp
                    )
                    assert torch.equal(yr, y), (b, split, bn, bkb, bb, "prefetch")
                if _PDL and bn is None:  # PDL changes when the kernel starts, not what it computes
                    for pdl in (False, True):
                        yp = decode_linear_pairs(
                            xp, out.scales, out.amax, *qw_dev, out_dtype=torch.float32, pdl=pdl, **kw
                        )
                        assert torch.equal(yp, y), (b, split, bn, bkb, bb, pdl)
                yb = decode_linear_pairs(xp, out.scales, out.amax, *qw_dev, out_dtype=torch.bfloat16, **kw)
                if IN_INTERPRETER:  # the interpreter truncates to bf16: <= 2^-8 relative
                    assert rel_l2(ref, yb) < 8e-3
                else:  # the FP32 result, rounded once to nearest-even
                    assert torch.equal(yb, y.to(torch.bfloat16)), (b, split, rel_l2(y, yb))


def _check_pdl_chain() -> None:
    """Three dependent linears (each one's output is the next one's input; the middle one small enough for
    split-K), quantize + pair kernel each, captured in one CUDA graph with programmatic dependent launch:
    every launch may start while its predecessor runs, so a read of the activations before
    ``griddepcontrol.wait`` would race. Replays must equal the same chain run eagerly without PDL, bit for
    bit, also after the input changed between replays."""
    from minite_kernels.backends.triton.decode import decode_linear_pairs, quantize_for_decode
    from minite_kernels.formats import quantize_nvfp4

    dims = (2560, 4096, 256, 2560)
    ws = []
    for i in range(3):
        qw = quantize_nvfp4(_heavy(dims[i + 1], dims[i], seed=30 + i).cpu(), tile=(16, 16))
        ws.append([t.to(_DEV) for t in (qw.data, qw.scales, qw.amax)])
    for b in (1, 2, 5):
        x = _heavy(b, dims[0], seed=40 + b)

        def chain(pdl, x=x):
            h = x
            for w in ws:
                o, xp = quantize_for_decode(h, pdl=pdl)
                h = decode_linear_pairs(xp, o.scales, o.amax, *w, pdl=pdl)
            return h

        want = chain(False)
        assert torch.equal(chain(True), want), b
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = chain(True)
        for step in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, want), (b, step)
            x.mul_(-0.5)  # a new input: the next replay must see it
            want = chain(False)


def _check_nonfinite() -> None:
    from minite_kernels.backends.triton.decode import decode_linear_pairs, quantize_for_decode
    from minite_kernels.formats import quantize_nvfp4

    x, w = _heavy(3, 64, seed=5), _heavy(32, 64, seed=6)
    x[1, 7] = float("inf")
    x[2, 0] = float("nan")
    qw = quantize_nvfp4(w.cpu(), tile=(16, 16))
    args = [t.to(_DEV) for t in (qw.data, qw.scales, qw.amax)]
    out, xp = quantize_for_decode(x)
    y = decode_linear_pairs(xp, out.scales, out.amax, *args, out_dtype=torch.float32)
    assert y[1:].isnan().all()  # a poisoned row poisons its outputs, never finite garbage
    out0, xp0 = quantize_for_decode(x[:1])
    y0 = decode_linear_pairs(xp0, out0.scales, out0.amax, *args, out_dtype=torch.float32)
    assert torch.equal(y[0], y0[0]) and y0.isfinite().all()


def _check_decode_quantizer() -> None:
    """The pair-word quantizer (one row spread over several programs) against the reference: the same bytes,
    scales, amax and nonfinite flags, and the codes as the pair kernel's words, at K that pad the row."""
    from minite_kernels.backends.triton.decode import pairs_for_decode, quantize_for_decode
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.formats.e2m1 import e2m1_decode, unpack_nibbles

    for dtype in (torch.bfloat16, torch.float32):
        for k in (80, 2560, 9728):  # 5 blocks (padded to 8 in the kernel), Qwen3-4B hidden and MLP sizes
            x = _heavy(3, k, seed=k).to(dtype)
            x[0, :16] = 0  # an all-zero block
            x[1, 5] = -1e-30  # rounds to -0.0
            x[2, 3] = float("nan")  # a poisoned row
            out, xp = quantize_for_decode(x)
            ref = quantize_nvfp4(x.cpu(), scaling="per_token")
            assert torch.equal(out.data.cpu(), ref.data)
            assert torch.equal(out.scales.view(torch.uint8).cpu(), ref.scales.view(torch.uint8))
            assert torch.equal(out.amax.cpu().nan_to_num(-1.0), ref.amax.nan_to_num(-1.0))
            assert out.nonfinite.tolist() == [False, False, True]
            codes = e2m1_decode(unpack_nibbles(ref.data), torch.float16)
            assert torch.equal(xp.cpu(), pairs_for_decode(codes))  # the NaN row: all codes 0; signed zeros


def _check_backend_routing() -> None:
    import minite_kernels.backends.triton as tk
    from minite_kernels.formats import quantize_nvfp4
    from minite_kernels.recipes import get_qlinear_params

    spec = get_qlinear_params("nvfp4_per_token_bf16_bwd").fprop
    assert tk.DECODE_MAX_ROWS == 4
    x, w = _heavy(tk.DECODE_MAX_ROWS, 128, seed=3), _heavy(64, 128, seed=4)
    qw = quantize_nvfp4(w.cpu(), tile=(16, 16))
    qw = type(qw)(**{f: (v.to(_DEV) if isinstance(v, torch.Tensor) else v) for f, v in vars(qw).items()})
    backend = tk.TritonBackend(_DEV)
    ref = (
        quantize_nvfp4(x.cpu(), scaling="per_token").dequantize().double()
        @ quantize_nvfp4(w.cpu(), tile=(16, 16)).dequantize().double().t()
    )
    assert tk.decode_mode() == "auto"  # the default
    qx = backend.quantize(x, spec.a)
    assert qx.qs_decode is not None and qx.deq is None  # decode-sized: the codes as the pair kernel's words
    assert qx.qs_decode.shape == (x.shape[0], 8, x.shape[1] // 16) and qx.qs_decode.dtype == torch.int32
    y = backend.qgemm_nt(None, None, spec.a, spec.b, a_quantized=qx, b_quantized=qw, out_dtype=torch.float32)
    direct = tk.decode_linear_pairs(qx.qs_decode, qx.scales, qx.amax, qw.data, qw.scales, qw.amax,
                                    out_dtype=torch.float32)
    assert torch.equal(direct, y)  # the backend ran the pair kernel on the words its quantizer wrote
    # the decode-sized quantized activation is a complete NVFP4 tensor for every other consumer
    assert torch.equal(
        qx.dequantize(torch.float32).cpu(), quantize_nvfp4(x.cpu(), scaling="per_token").dequantize()
    )
    assert rel_l2(ref, y) < 1e-5
    try:
        backend.clear_cache()  # a ROCm build (no PTX): the GEMM path, not the decode kernel
        from minite_kernels.backends.triton import backend as tb

        tb.PAIR_KERNEL_OK = False
        try:
            assert backend.quantize(x, spec.a).qs_decode is None
            y_rocm = backend.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=torch.float32)
            assert rel_l2(ref, y_rocm) < 1e-5
        finally:
            tb.PAIR_KERNEL_OK = True
        backend.clear_cache()  # one row more: the GEMM path, not the decode kernel
        x3 = _heavy(tk.DECODE_MAX_ROWS + 1, 128, seed=5)
        assert backend.quantize(x3, spec.a).qs_decode is None
        # decode-sized but stochastically rounded (no pair words): the GEMM path, on the operand it was given
        sr = dataclasses.replace(spec.a, stochastic_rounding=True)
        qsr = backend.quantize(x, sr, generator=torch.Generator(device=_DEV).manual_seed(0))
        assert qsr.qs_decode is None
        y_sr = backend.qgemm_nt(None, None, sr, spec.b, a_quantized=qsr, b_quantized=qw, out_dtype=torch.float32)
        ref_sr = qsr.dequantize(torch.float32).cpu().double() @ qw.dequantize(torch.float32).cpu().double().t()
        assert rel_l2(ref_sr, y_sr) < 1e-5
        from minite_kernels.backends.triton._common import pdl_mode

        assert pdl_mode() == "off"  # the default
        backend.clear_cache()  # programmatic dependent launch (sm_90+) against none: the same bits
        y_nopdl = backend.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=torch.float32)
        backend.clear_cache()
        with use_options(pdl="on"):
            assert torch.equal(
                backend.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=torch.float32), y_nopdl
            )
        with pytest.raises(ValueError, match="MINITE_TRITON_PDL='never' is not valid; valid: off, on"):
            Options.from_env({"MINITE_TRITON_PDL": "never"})
        with use_options(decode="off"):
            backend.clear_cache()
            assert backend.quantize(x, spec.a).qs_decode is None
            backend.clear_cache()
            y_off = backend.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=torch.float32)
        assert rel_l2(ref, y_off) < 1e-5
        with pytest.raises(ValueError, match="MINITE_TRITON_DECODE='sometimes' is not valid; valid: recipe, auto, off"):
            Options.from_env({"MINITE_TRITON_DECODE": "sometimes"})
    finally:
        backend.clear_cache()


def _check_bad_input() -> None:
    """The pair kernel takes x as int32 pair words [B, 8, K/16] with matching scales and amax."""
    from minite_kernels.backends.triton.decode import decode_linear_pairs, quantize_for_decode

    a = torch.ones(2, device=_DEV)
    w8, s8 = (
        torch.zeros(8, 16, dtype=torch.uint8, device=_DEV),
        torch.zeros(8, 2, dtype=torch.uint8, device=_DEV),
    )
    with pytest.raises(ValueError, match="K % 16 == 0"):
        quantize_for_decode(torch.zeros(2, 24, dtype=torch.bfloat16, device=_DEV))
    xp = torch.zeros(2, 8, 2, dtype=torch.int32, device=_DEV)  # K = 32
    xs = torch.zeros(2, 2, dtype=torch.uint8, device=_DEV)
    with pytest.raises(ValueError, match=r"pair words \[B, 8, K/16\]"):
        decode_linear_pairs(xp.view(2, 16, 1), xs, a, w8, s8, a[:1])
    with pytest.raises(ValueError, match=r"pair words .*got torch.float32"):
        decode_linear_pairs(xp.float(), xs, a, w8, s8, a[:1])
    with pytest.raises(ValueError, match=r"expected \[N, 16\]"):
        decode_linear_pairs(xp, xs, a, torch.zeros(8, 8, dtype=torch.uint8, device=_DEV), s8, a[:1])
    with pytest.raises(ValueError, match=r"x_scales has shape \(2, 1\), expected \(2, 2\)"):
        decode_linear_pairs(xp, xs[:, :1].contiguous(), a, w8, s8, a[:1])
    with pytest.raises(ValueError, match=r"w_scales has shape \(8, 1\), expected \(8, 2\)"):
        decode_linear_pairs(xp, xs, a, w8, s8[:, :1].contiguous(), a[:1])
    with pytest.raises(ValueError, match="x_amax has 1 values for 2 rows"):
        decode_linear_pairs(xp, xs, a[:1], w8, s8, a[:1])
    if not _PDL:  # asked for where it cannot run (the interpreter, a pre-Hopper GPU): an error, not a hang
        with pytest.raises(ValueError, match="programmatic dependent launch needs .*compute capability 9.0"):
            decode_linear_pairs(xp, xs, a, w8, s8, a[:1], pdl=True)


if torch.cuda.is_available():

    @pytest.mark.gpu
    @pytest.mark.parametrize("n,k", [(1024, 2560), (256, 9728), (96, 512), (40, 80)])
    def test_decode_pairs_gpu(n, k):
        configs = (
            (None, None, None, 4, 1, True),
            (8, 32, 4, 4, 3, True),
            (32, 64, 4, 8, 2, False),
            (16, 32, 2, 4, 4, False),
            (16, 16, 1, 4, 3, False),
            (4, 128, 1, 4, 2, True),  # the long-K tiles (o, down) pipelined, then double-buffered
        )
        _check_pairs((1, 2, 3, 4, 5, 8, 16), n, k, (None, 1, 3), configs)

    @pytest.mark.gpu
    @pytest.mark.skipif(not _PDL, reason="programmatic dependent launch needs sm_90+ and Triton >= 3.3")
    def test_decode_pairs_pdl_chain_gpu():
        _check_pdl_chain()

    @pytest.mark.gpu
    def test_backend_routes_decode_gpu():
        _check_decode_quantizer()
        _check_nonfinite()
        _check_backend_routing()
        _check_bad_input()

elif IN_INTERPRETER:

    def test_decode_pairs_interpreted():
        _check_pairs((1, 6), 40, 96, (None, 2), ((8, 4, 2, 4, 2, True),))

    def test_backend_routes_decode_interpreted():
        _check_decode_quantizer()
        _check_nonfinite()
        _check_backend_routing()
        _check_bad_input()

else:

    def test_decode_suite_in_interpreter_subprocess(run_interpreted):
        last = run_interpreted(__file__).splitlines()[-1]  # every interpreted test ran and passed
        assert " passed" in last and "skipped" not in last and "deselected" not in last, last

"""The first packed-FP4 decode formulation (``scripts/decode_planes.py``), the decode benchmarks' baseline:
against the FP64 product of the reference dequantized operands (``rel_l2 <= 1e-5`` for FP32 output), its
activation layouts against each other (natural, plane-major bf16 and fp16: bit-equal), its BF16 output against
the FP32 one rounded to nearest-even (bit-equal), and its one-launch quantizer against the reference bytes.

On CPU under Triton's interpreter (in a subprocess, tiny shapes); on a GPU compiled (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from minite_test_support import IN_INTERPRETER, load_script, rel_l2, spread_bf16

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")

_DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _planes():
    """``scripts/decode_planes.py`` as a module."""
    return load_script("decode_planes")


def _heavy(m: int, k: int, seed: int) -> torch.Tensor:
    return spread_bf16(m, k, seed).to(_DEV)


def _check_decode(batches, n: int, k: int, splits) -> None:
    import minite_kernels.backends.triton as tk
    from minite_kernels.formats import quantize_nvfp4

    dp = _planes()
    x, w = _heavy(max(batches), k, seed=1), _heavy(n, k, seed=2)
    w[3, :16] = 0  # an all-zero block: scale 0, codes 0
    qw = quantize_nvfp4(w.cpu(), tile=(16, 16))
    qw_dev = [t.to(_DEV) for t in (qw.data, qw.scales, qw.amax)]
    for b in batches:
        ref = (
            quantize_nvfp4(x[:b].cpu(), scaling="per_token").dequantize().double()
            @ qw.dequantize().double().t()
        )
        *_, xa, _nf, xqs, _dq = tk.quantize_nvfp4_triton(
            x[:b], per_token=True, write_packed=False, write_qs=True
        )
        for split in splits:
            for _ in range(2):  # the second call reuses the split-K counters (they must reset themselves)
                y = dp.decode_linear(xqs, xa, *qw_dev, out_dtype=torch.float32, split=split)
                assert rel_l2(ref, y) < 1e-5, (b, split, rel_l2(ref, y))
            # the permuted activation layout reads the same values in the same order: same bits
            xperm = dp.permute_for_decode(xqs)
            yp = dp.decode_linear(xperm, xa, *qw_dev, out_dtype=torch.float32, split=split, x_perm=True)
            assert torch.equal(yp, y), (b, split)
            # fp16 activations (what quantize_planes writes) are the same exact values: same bits
            yh = dp.decode_linear(xperm.half(), xa, *qw_dev, out_dtype=torch.float32, split=split, x_perm=True)
            assert torch.equal(yh, yp), (b, split)
            if b > 4:  # tensor-core path with all 8 nibble planes in one MMA operand
                yo = dp.decode_linear(
                    xperm, xa, *qw_dev, out_dtype=torch.float32, split=split, x_perm=True, one_dot=True
                )
                assert rel_l2(ref, yo) < 1e-5, (b, split)
            yb = dp.decode_linear(xqs, xa, *qw_dev, out_dtype=torch.bfloat16, split=split)
            if IN_INTERPRETER:  # the interpreter truncates to bf16: <= 2^-8 relative
                assert rel_l2(ref, yb) < 8e-3
            else:  # the FP32 result, rounded once to nearest-even
                assert torch.equal(yb, y.to(torch.bfloat16)), (b, split, rel_l2(y, yb))


def _check_nonfinite() -> None:
    import minite_kernels.backends.triton as tk
    from minite_kernels.formats import quantize_nvfp4

    dp = _planes()
    x, w = _heavy(3, 64, seed=5), _heavy(32, 64, seed=6)
    x[1, 7] = float("inf")
    x[2, 0] = float("nan")
    qw = quantize_nvfp4(w.cpu(), tile=(16, 16))
    args = [t.to(_DEV) for t in (qw.data, qw.scales, qw.amax)]
    *_, xa, _nf, xqs, _dq = tk.quantize_nvfp4_triton(x, per_token=True, write_packed=False, write_qs=True)
    y = dp.decode_linear(xqs, xa, *args, out_dtype=torch.float32)
    assert y[1:].isnan().all()  # a poisoned row poisons its outputs, never finite garbage
    y0 = dp.decode_linear(xqs[:1], xa[:1], *args, out_dtype=torch.float32)
    assert torch.equal(y[0], y0[0]) and y0.isfinite().all()


def _check_quantizer() -> None:
    import minite_kernels.backends.triton as tk
    from minite_kernels.formats import quantize_nvfp4

    dp = _planes()
    for dtype in (torch.bfloat16, torch.float32):
        for k in (80, 2560):  # 5 blocks (padded to 8 in the kernel), a Qwen3-4B hidden size
            x = _heavy(3, k, seed=k).to(dtype)
            x[0, :16] = 0  # an all-zero block
            x[1, 5] = -1e-30  # rounds to -0.0
            x[2, 3] = float("nan")  # a poisoned row
            out, qsp = dp.quantize_planes(x)
            ref = quantize_nvfp4(x.cpu(), scaling="per_token")
            assert torch.equal(out.data.cpu(), ref.data)
            assert torch.equal(out.scales.view(torch.uint8).cpu(), ref.scales.view(torch.uint8))
            assert torch.equal(out.amax.cpu().nan_to_num(-1.0), ref.amax.nan_to_num(-1.0))
            assert out.nonfinite.tolist() == [False, False, True]
            q = tk.quantize_nvfp4_triton(x, per_token=True, write_packed=False, write_qs=True)
            assert qsp.dtype == torch.float16  # exact, like the bf16 qs
            assert torch.equal(qsp.float(), dp.permute_for_decode(q.qs).float())
            # signed zeros as the reference's dequantized values (-1e-30 -> -0.0)
            ref_perm = dp.permute_for_decode(ref.dequantize(torch.float32).to(_DEV))
            assert torch.equal(torch.signbit(qsp), torch.signbit(ref_perm))


def _check_bad_input() -> None:
    dp = _planes()
    x = torch.zeros(2, 24, dtype=torch.bfloat16, device=_DEV)
    a = torch.ones(2, device=_DEV)
    with pytest.raises(ValueError, match="K % 16"):
        dp.decode_linear(
            x,
            a,
            torch.zeros(8, 12, dtype=torch.uint8, device=_DEV),
            torch.zeros(8, 1, dtype=torch.uint8, device=_DEV),
            a[:1],
        )
    with pytest.raises(ValueError, match="K % 16"):
        dp.quantize_planes(x)
    x = torch.zeros(2, 32, dtype=torch.bfloat16, device=_DEV)
    w8, s8 = (
        torch.zeros(8, 16, dtype=torch.uint8, device=_DEV),
        torch.zeros(8, 2, dtype=torch.uint8, device=_DEV),
    )
    with pytest.raises(ValueError, match="one_dot=True.*x_perm=True"):
        dp.decode_linear(x, a, w8, s8, a[:1], one_dot=True)
    with pytest.raises(ValueError, match=r"\[B, 8, K/8\]"):
        dp.decode_linear(x, a, w8, s8, a[:1], x_perm=True)
    with pytest.raises(ValueError, match="K=48"):
        dp.decode_linear(torch.zeros(2, 48, dtype=torch.bfloat16, device=_DEV), a, w8, s8, a[:1])


if torch.cuda.is_available():

    @pytest.mark.gpu
    @pytest.mark.parametrize("n,k", [(1024, 2560), (256, 9728), (96, 512)])
    def test_decode_planes_gpu(n, k):
        _check_decode((1, 3, 4, 8, 16), n, k, (None, 1, 4))

    @pytest.mark.gpu
    def test_decode_planes_quantizer_and_inputs_gpu():
        _check_quantizer()
        _check_nonfinite()
        _check_bad_input()

elif IN_INTERPRETER:

    def test_decode_planes_interpreted():
        _check_decode((1, 3, 8, 16), 48, 128, (None, 2))

    def test_decode_planes_quantizer_and_inputs_interpreted():
        _check_quantizer()
        _check_nonfinite()
        _check_bad_input()

else:

    def test_decode_planes_in_interpreter_subprocess(run_interpreted):
        last = run_interpreted(__file__).splitlines()[-1]  # every interpreted test ran and passed
        assert " passed" in last and "skipped" not in last and "deselected" not in last, last

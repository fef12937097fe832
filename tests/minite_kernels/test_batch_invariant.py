"""The batch-invariant kernels (``minite_kernels/backends/triton/batch_invariant.py``).

Each kernel against PyTorch's own op (equal up to the reduction order: fp32 within 2e-5 relative, bf16 within
its rounding), and the property they exist for, bit for bit: a row computed alone, inside a bigger batch, or
(attention) as one decode step over a left-padded cache equals that row in the full pass.
On CPU under Triton's interpreter (``interp_`` tests, in a subprocess); on a GPU compiled (``-m gpu``).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from minite_test_support import interp_only

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")

gpu = pytest.mark.gpu


def _rel(ref: torch.Tensor, y: torch.Tensor) -> float:
    ref, y = ref.double().cpu(), y.double().cpu()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def _check_linear(dev: str, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    from minite_kernels.backends.triton import batch_invariant as bi

    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(dev, dtype)
    w = torch.randn(n, k, generator=g).to(dev, dtype)
    b = torch.randn(n, generator=g).to(dev, dtype)
    y = bi.linear(x, w, b)
    assert y.dtype == dtype and y.shape == (m, n)
    ref = F.linear(x.double(), w.double(), b.double())
    assert _rel(ref, y) < (2e-5 if dtype == torch.float32 else 8e-3)
    # every row alone, and every suffix of the batch (rows land in other tiles): the same bits
    for i in (0, 1, m // 2, m - 1):
        assert torch.equal(bi.linear(x[i:i + 1], w, b), y[i:i + 1]), i
        assert torch.equal(bi.linear(x[i:], w, b), y[i:]), i
    # a transposed (non-contiguous) weight view, as ``a @ w.t()`` passes it
    assert torch.equal(bi.linear(x, w.t().contiguous().t(), b), y)
    # leading dims are flattened rows
    assert torch.equal(bi.linear(x.view(1, m, k), w, b)[0], y)


def _check_rows(dev: str, n: int) -> None:
    from minite_kernels.backends.triton import batch_invariant as bi

    g = torch.Generator().manual_seed(1)
    x = (torch.randn(6, n, generator=g) * 4).to(dev)
    x[2, ::3] = float("-inf")  # masked logits (top-k / top-p)
    refs = {"sum": x[[0, 1, 3, 4, 5]].sum(-1), "logsumexp": x.logsumexp(-1), "log_softmax": x.log_softmax(-1),
            "softmax": x.softmax(-1)}
    for op, ref in refs.items():
        y = bi.rows(x[[0, 1, 3, 4, 5]] if op == "sum" else x, op)
        fin = torch.isfinite(ref)
        assert torch.equal(torch.isfinite(y), fin), op
        assert _rel(ref[fin], y[fin]) < 2e-6, op
        alone = torch.stack([bi.rows(r.unsqueeze(0), op)[0] for r in (x[[0, 1, 3, 4, 5]] if op == "sum" else x)])
        assert torch.equal(alone, y), op
    assert bi.rows(x[:0], "sum").shape == (0,)
    assert bi.rows(x.bfloat16(), "log_softmax", torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match="valid: sum, logsumexp, log_softmax, softmax"):
        bi.rows(x, "mean")


def _check_attention(dev: str, dtype: torch.dtype, d: int = 16, length: int = 75) -> None:
    from minite_kernels.backends.triton import batch_invariant as bi

    g = torch.Generator().manual_seed(2)
    b, h, hk = 2, 4, 2
    q, k, v = (torch.randn(b, n, length, d, generator=g).to(dev, dtype) for n in (h, hk, hk))
    i = torch.arange(length, device=dev)
    lo = torch.zeros(1, 1, length, dtype=torch.int32, device=dev)
    hi = (i + 1).to(torch.int32).view(1, 1, length)
    full = bi.attention(q, k, v, lo, hi, d ** -0.5)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    assert _rel(ref, full) < (2e-6 if dtype == torch.float32 else 8e-3)
    # each position as one decode step over a cache with `pad` garbage slots in front: bit-equal to the full pass
    pad = 7
    junk = torch.full((b, hk, pad, d), float("nan"), device=dev, dtype=dtype)  # never read
    kc, vc = torch.cat([junk, k], 2), torch.cat([junk, v], 2)
    start = torch.full((b, 1, 1), pad, dtype=torch.int32, device=dev)
    for t in (0, 1, 63, 64, length - 1):
        end = torch.full((1, 1, 1), pad + t + 1, dtype=torch.int32, device=dev)
        step = bi.attention(q[:, :, t:t + 1], kc, vc, start, end, d ** -0.5)
        assert torch.equal(step[:, :, 0], full[:, :, t]), t
    # a query with no valid key gives 0
    none = bi.attention(q[:, :, :1], k, v, lo[..., :1], lo[..., :1], 1.0)
    assert torch.equal(none, torch.zeros_like(none))


@interp_only
def test_interp_linear_fp32():
    _check_linear("cpu", 70, 80, 100, torch.float32)


@interp_only
def test_interp_linear_bf16():
    _check_linear("cpu", 37, 70, 48, torch.bfloat16)


@interp_only
def test_interp_rows():
    _check_rows("cpu", 2100)


@interp_only
def test_interp_attention():
    _check_attention("cpu", torch.float32)


def test_batch_invariant_kernels_under_interpreter(run_interp_tests):
    run_interp_tests(__file__)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_linear(dtype):
    _check_linear("cuda", 300, 1000, 576, dtype)
    _check_linear("cuda", 5, 49152, 576, dtype)


@gpu
def test_gpu_rows():
    _check_rows("cuda", 151_936)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_attention(dtype):
    _check_attention("cuda", dtype, d=64, length=300)
    _check_attention("cuda", dtype, d=128, length=130)


def test_bad_input_names_the_problem():
    from minite_kernels.backends.triton import batch_invariant as bi

    x = torch.zeros(2, 8)
    with pytest.raises(TypeError, match="must share one dtype"):
        bi.linear(x, torch.zeros(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not match input"):
        bi.linear(x, torch.zeros(3, 9))
    with pytest.raises(ValueError, match="H a multiple of Hk"):
        bi.attention(torch.zeros(1, 3, 2, 4), torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4),
                     torch.zeros(1, 1, 2), torch.ones(1, 1, 2), 1.0)

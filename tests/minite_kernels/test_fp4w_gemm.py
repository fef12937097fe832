"""``scripts/fp4w_gemm.py`` (loaded by path: the scripts folder is not a package): ``Y = X̂ Ŵᵀ (+ b)`` with the
NVFP4 weight read as packed bytes, the decode GEMM measured against cuBLAS and kept out of the library.

Against the pure-PyTorch reference ``bf16(X̂ @ Ŵᵀ)`` (then ``bf16(· + b)``) with ``Ŵ`` the reference BF16
dequantization (``formats.quantize_nvfp4(...).dequantize()`` rounded to BF16):
- Ŵ bit for bit: one-hot rows of X̂ pick single weight columns, and a one-term fp32 sum is exact;
- Y within the fp32 accumulation order: ``|Y - Y_ref| <= 2^-7 |Y_ref| + 1e-6 max|Y_ref|`` elementwise (one BF16
  rounding step either side of a tie of the two fp32 sums), and relative L2 error <= 2e-3;
- every split-K and tile choice gives the same Ŵ, and split-K results do not depend on arrival order (two calls
  equal bit for bit).
The kernel runs under Triton's CPU interpreter (a subprocess with ``TRITON_INTERPRET=1``) and compiled on a GPU
(``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from minite_test_support import interp_only, load_script, spread_bf16

from minite_kernels.formats.nvfp4 import quantize_nvfp4

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")


def _fp4w():
    """``scripts/fp4w_gemm.py`` as a module."""
    return load_script("fp4w_gemm")


def _weights(ns: tuple[int, ...], k: int, device, seed: int = 0):
    """A packed group of ``len(ns)`` weights [n_i, K] (each its own per-tensor amax, 16x16 tiles) as one
    :class:`PackedFP4`, and the reference Ŵ [sum n_i, K] in BF16."""
    pk = _fp4w().PackedFP4.empty(sum(ns), k, device)
    w_hat, row = [], 0
    for i, n in enumerate(ns):
        w = spread_bf16(n, k, seed + i)
        w[0, :16] = 0  # an all-zero block: scale 0
        w[-1, 16:32] = -w[-1, 16:32].abs()  # negative codes only
        q = quantize_nvfp4(w, tile=(16, 16))
        row = pk.copy_rows_(row, q.data.to(device), q.scales.to(device), q.amax.to(device))
        w_hat.append(q.dequantize().to(torch.bfloat16))
    return pk, torch.cat(w_hat).to(device)


def _x_hat(m: int, k: int, device, seed: int) -> torch.Tensor:
    return quantize_nvfp4(spread_bf16(m, k, seed), scaling="per_token").dequantize().to(torch.bfloat16).to(device)


def _reference(x_hat, w_hat, bias=None):
    y = (x_hat.double() @ w_hat.double().t()).to(torch.bfloat16)
    return y if bias is None else (y.double() + bias.double()).to(torch.bfloat16)


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    y, ref = y.double().cpu(), ref.double().cpu()
    err = (y - ref).abs()
    assert bool((err <= 2.0**-7 * ref.abs() + 1e-6 * ref.abs().max()).all()), float(err.max())
    assert float(err.norm() / ref.norm()) <= 2e-3


def _check(m: int, ns: tuple[int, ...], k: int, device, configs, bias: bool = False, seed: int = 0) -> None:
    fp4w_linear = _fp4w().fp4w_linear
    pk, w_hat = _weights(ns, k, device, seed)
    x_hat = _x_hat(m, k, device, seed + 100)
    b = (torch.randn(sum(ns), generator=torch.Generator().manual_seed(seed)) * 4).to(torch.bfloat16).to(device)
    b = b if bias else None
    ref = _reference(x_hat, w_hat, b)
    cols = torch.arange(m) % k
    onehot = torch.zeros(m, k, dtype=torch.bfloat16)
    onehot[torch.arange(m), cols] = 1.0
    onehot = onehot.to(device)
    for cfg in configs:
        y = fp4w_linear(x_hat, pk, b, **cfg)
        _close(y, ref)
        assert torch.equal(fp4w_linear(x_hat, pk, b, **cfg), y), cfg  # split-K sums in a fixed order
        picked = fp4w_linear(onehot, pk, **cfg)  # row r = Ŵ[:, r % K]: exact
        assert torch.equal(picked.cpu(), w_hat[:, cols.to(w_hat.device)].t().cpu()), cfg


def _worked_example(device) -> None:
    fp4w_linear = _fp4w().fp4w_linear
    pk = _fp4w().PackedFP4.empty(1, 32, device)
    pk.codes[0, 0] = 7  # element 0: code 7 (6.0), element 1: code 0
    pk.scales[0, 0] = 0x38  # E4M3 1.0
    pk.amax[0] = 2688.0
    x = torch.zeros(1, 32, dtype=torch.bfloat16, device=device)
    x[0, 0] = 1.0
    assert fp4w_linear(x, pk).item() == 6.0


def _bad_inputs(device) -> None:
    fp4w_linear = _fp4w().fp4w_linear
    pk = _fp4w().PackedFP4.empty(32, 64, device)
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="takes BF16 x_hat"):
        fp4w_linear(x.float(), pk)
    with pytest.raises(ValueError, match=r"takes BF16 x_hat \[M, 64\]"):
        fp4w_linear(x[:, :48], pk)
    with pytest.raises(ValueError, match="block_k=48 must be a multiple of 32 dividing K=64"):
        fp4w_linear(x, pk, block_k=48)
    with pytest.raises(ValueError, match="split=3 must be a power of two"):
        fp4w_linear(x, pk, split=3)
    assert fp4w_linear(x[:0], pk).shape == (0, 32)


_INTERP_CONFIGS = ({}, {"block_n": 16, "block_k": 32, "split": 2}, {"block_m": 16, "block_n": 64, "split": 1})


# --- CPU: the interpreter run, in a subprocess ----------------------------------------------------------------
def test_fp4w_gemm_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
@pytest.mark.parametrize(
    "m,ns,k,bias", [(1, (32,), 64, False), (5, (48, 16), 128, True), (20, (16, 32, 16), 64, False)]
)
def test_interp_matches_reference(m, ns, k, bias):
    _check(m, ns, k, "cpu", _INTERP_CONFIGS, bias=bias, seed=m)


@interp_only
def test_interp_worked_example_and_bad_inputs():
    _worked_example("cpu")
    _bad_inputs("cpu")


# --- compiled kernels on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_matches_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    configs = ({}, {"split": 1}, {"split": 4}, {"block_n": 64, "block_k": 64, "split": 2}, {"block_n": 128},
               {"block_k": 32, "split": 2, "num_warps": 8})
    for m, ns, k, bias in ((5, (2048, 1024, 1024), 1024, False), (64, (1024,), 3072, False),
                           (64, (3072, 3072), 1024, True), (17, (1024,), 2048, False), (100, (256,), 512, True)):
        _check(m, ns, k, "cuda", configs, bias=bias, seed=m + k)
    _worked_example("cuda")
    _bad_inputs("cuda")


@pytest.mark.gpu
def test_gpu_inside_a_cuda_graph_follows_new_weights():
    """Captured once, replayed after the packed weight and the input changed in place: the replay equals an
    eager call on the new values (the graph reads the buffers, and split-K's counters reset themselves)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fp4w_linear = _fp4w().fp4w_linear
    pk, _ = _weights((1024,), 2048, "cuda", seed=1)
    pk2, _ = _weights((1024,), 2048, "cuda", seed=2)
    x = _x_hat(32, 2048, "cuda", seed=3)
    fp4w_linear(x, pk, split=4)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp4w_linear(x, pk, split=4)
    graph.replay()
    assert torch.equal(y, fp4w_linear(x, pk, split=4))
    pk.copy_rows_(0, pk2.codes, pk2.scales, pk2.amax)
    x.mul_(-2.0)
    graph.replay()
    want = fp4w_linear(x, pk2, split=4)
    assert torch.equal(y, want) and not torch.equal(y, fp4w_linear(x, pk2, split=4).neg())

"""``minite_kernels.backends.triton.fp4w``: the FP4-weight GEMM ``Y = bf16(fp32(X̂ QSᵀ) · g) (+ b)`` that reads the
NVFP4 weight as packed codes and E4M3 scales.

- Against its pure-PyTorch reference (``fp4w_linear_reference``, fp64 sums of the exact products): bit-equal
  where one term is summed (one-hot rows of X̂ pick single weight columns), and within the fp32 accumulation
  order otherwise: ``|Y - Y_ref| <= 2^-7 |Y_ref| + 1e-6 max|Y_ref|`` elementwise, relative L2 <= 1e-3.
- Against the learner's dequantized-weight GEMM ``bf16(X̂ Ŵᵀ)`` (Ŵ rounded to BF16 per element): the module
  docstring's elementwise bound ``|ΔY| <= 2^-8 Σ_k |X̂ Ŵ| + 2^-7 |Y|`` (plus (K - 1) 2^-24 of the first term for fp32
  sums: (K - 1) 2^-24 of it), and relative L2 <= 1e-2.
- Split-K sums its partials in a fixed order: two calls are equal bit for bit, whatever the configuration.
- Inside a CUDA graph the kernel follows weights rewritten in place (``FP4Weight.copy_rows_``).
The kernel runs under Triton's CPU interpreter (a subprocess with ``TRITON_INTERPRET=1``; there the MMA is an
fp32 dot on the upcast values) and compiled on a GPU (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from minite_test_support import interp_only, spread_bf16

from minite_kernels.formats.nvfp4 import quantize_nvfp4

pytest.importorskip("triton", reason="triton is not installed (pip install 'minite-rl[gpu]')")


def _mod():
    from minite_kernels.backends.triton import fp4w

    return fp4w


def _weights(ns: tuple[int, ...], k: int, device, seed: int = 0):
    """A packed group of ``len(ns)`` weights [n_i, K] (each its own per-tensor amax, 1x16 blocks) as one
    :class:`FP4Weight`, the learner's BF16 Ŵ [sum n_i, K], and the fp32 dequantized values (not rounded)."""
    pk = _mod().FP4Weight.empty(sum(ns), k, device)
    w_hat, w32, row = [], [], 0
    for i, n in enumerate(ns):
        w = spread_bf16(n, k, seed + i)
        w[0, :16] = 0  # an all-zero block: scale 0
        w[-1, 16:32] = -w[-1, 16:32].abs()  # negative codes only
        q = quantize_nvfp4(w, tile=(1, 16))
        row = pk.copy_rows_(row, q.data.to(device), q.scales.to(device), q.amax.to(device))
        w_hat.append(q.dequantize().to(torch.bfloat16))
        w32.append(q.dequantize())
    return pk, torch.cat(w_hat).to(device), torch.cat(w32)


def _x_hat(m: int, k: int, device, seed: int) -> torch.Tensor:
    return quantize_nvfp4(spread_bf16(m, k, seed), scaling="per_token").dequantize().to(torch.bfloat16).to(device)


def _close(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    y, ref = y.double().cpu(), ref.double().cpu()
    err = (y - ref).abs()
    assert bool((err <= 2.0**-7 * ref.abs() + 1e-6 * ref.abs().max()).all()), float(err.max())
    assert float(err.norm() / ref.norm()) <= rel


def _check(m: int, ns: tuple[int, ...], k: int, device, configs, bias: bool = False, seed: int = 0) -> None:
    mod = _mod()
    pk, w_hat, _ = _weights(ns, k, device, seed)
    x_hat = _x_hat(m, k, device, seed + 100)
    b = (torch.randn(sum(ns), generator=torch.Generator().manual_seed(seed)) * 4).to(torch.bfloat16).to(device)
    b = b if bias else None
    ref = mod.fp4w_linear_reference(x_hat, pk, b)
    deq = (x_hat.double() @ w_hat.double().t()).to(torch.bfloat16)
    if b is not None:
        deq = (deq.float() + b.float()).to(torch.bfloat16)
    cols = torch.arange(m) % k
    onehot = torch.zeros(m, k, dtype=torch.bfloat16)
    onehot[torch.arange(m), cols] = 1.0
    onehot = onehot.to(device)
    picked_ref = mod.fp4w_linear_reference(onehot, pk)
    for cfg in configs:
        y = mod.fp4w_linear(x_hat, pk, b, cfg)
        _close(y, ref, 1e-3)
        _near_dequantized(y, deq, x_hat, w_hat, cfg)
        assert torch.equal(mod.fp4w_linear(x_hat, pk, b, cfg), y), cfg  # split-K sums in a fixed order
        assert torch.equal(mod.fp4w_linear(onehot, pk, None, cfg).cpu(), picked_ref.cpu()), cfg


def _near_dequantized(y, deq, x_hat, w_hat, cfg) -> None:
    """The bound against the dequantized-weight GEMM: Ŵ's per-element rounding (<= 2^-8 |Ŵ|), the two output
    roundings (<= 2^-8 |Y| each) and fp32 sums."""
    y, deq = y.double().cpu(), deq.double().cpu()
    terms = x_hat.double().abs().cpu() @ w_hat.double().abs().cpu().t()
    err = (y - deq).abs()
    k = x_hat.shape[1]  # fp32 sums in any order: within (K - 1) 2^-24 of the sum of |terms|
    bound = (2.0**-8 + k * 2.0**-24) * terms + 2.0**-7 * torch.maximum(y.abs(), deq.abs()) + 1e-30
    assert bool((err <= bound).all()), (cfg, float((err - bound).max()))
    assert float(err.norm() / deq.norm()) <= 1e-2, cfg


def _worked_example(device) -> None:
    mod = _mod()
    pk = mod.FP4Weight.empty(1, 64, device)
    pk.codes[0, 0] = 7  # chunked layout, byte 0: element 0 (low nibble) code 7 (6.0), element 32 code 0
    pk.scales.view(torch.uint8)[0, 0] = 0x38  # E4M3 1.0
    pk.gain[0] = float(torch.tensor(2688.0) * mod.INV_2688)
    x = torch.zeros(1, 64, dtype=torch.bfloat16, device=device)
    x[0, 0] = 1.0
    assert mod.fp4w_linear(x, pk).item() == 6.0
    x[0, 0], x[0, 32] = 0.0, 1.0  # value 32 is byte 0's high nibble: code 0
    assert mod.fp4w_linear(x, pk).item() == 0.0


def _bad_inputs(device) -> None:
    mod = _mod()
    pk = mod.FP4Weight.empty(32, 64, device)
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="takes BF16 x_hat"):
        mod.fp4w_linear(x.float(), pk)
    with pytest.raises(ValueError, match=r"takes BF16 x_hat \[M, 64\]"):
        mod.fp4w_linear(x[:, :48], pk)
    with pytest.raises(ValueError, match="split=3 must be a power of two"):
        mod.fp4w_linear(x, pk, None, mod.FP4WConfig(block_n=32, block_k=64, split=3))
    with pytest.raises(ValueError, match="needs K % 64 == 0"):
        mod.FP4Weight.empty(32, 96, device)
    with pytest.raises(ValueError, match="block_k=96 must be a multiple of 64"):
        mod.fp4w_linear(x, pk, None, mod.FP4WConfig(block_k=96))
    with pytest.raises(ValueError, match="one amax per tensor or per row"):
        pk.copy_rows_(0, pk.codes, pk.scales, torch.ones(3))
    assert mod.fp4w_linear(x[:0], pk).shape == (0, 32)


def test_chunked_layout_round_trip():
    """``chunk_codes`` places value j and 32 + j of each 64-value chunk in byte j; ``unchunk_codes`` undoes it."""
    from minite_kernels.formats.e2m1 import pack_nibbles, unpack_nibbles

    mod = _mod()
    codes = torch.randint(0, 16, (3, 192), dtype=torch.uint8)
    data = pack_nibbles(codes)
    ch = mod.chunk_codes(data)
    assert torch.equal(mod.unchunk_codes(ch), data)
    nib = unpack_nibbles(ch).view(3, 3, 32, 2)  # per chunk, byte j: (low, high)
    assert torch.equal(nib[..., 0], codes.view(3, 3, 64)[..., :32])
    assert torch.equal(nib[..., 1], codes.view(3, 3, 64)[..., 32:])
    sc = torch.arange(24, dtype=torch.uint8).view(2, 12)  # K = 192: 3 chunks of 4 blocks per row
    assert mod.chunk_scales(sc)[0].tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    assert torch.equal(mod.unchunk_scales(mod.chunk_scales(sc)), sc)


def test_table_lookup_and_buckets():
    mod = _mod()
    assert [mod.m_bucket(m) for m in (1, 8, 9, 64, 65, 300)] == [8, 8, 16, 64, 128, 256]
    saved = dict(mod.TABLE)
    try:
        mod.TABLE[(4096, 1024)] = {64: None, 128: mod.FP4WConfig(block_n=64)}
        assert mod.table_config(4096, 1024, 60) is None
        assert mod.table_config(4096, 1024, 100) == mod.FP4WConfig(block_n=64)
        assert mod.table_config(4096, 1024, 8) is None  # a bucket not measured: the nearest measured (64)
        assert mod.table_config(4096, 1024, 300) == mod.FP4WConfig(block_n=64)  # 256: from 128
        assert mod.table_config(1, 64, 16) is mod.DEFAULT_CONFIG  # a shape not measured, few rows
        assert mod.table_config(1, 64, 64) is None  # a shape not measured, as many rows as no shape won at
        assert not mod.prefers_fp4(4096, 1024, (64,)) and mod.prefers_fp4(4096, 1024, (64, 128))
        assert not mod.prefers_fp4(1, 64) and mod.prefers_fp4(1, 64, (16,))
    finally:
        mod.TABLE.clear()
        mod.TABLE.update(saved)


def test_reference_is_the_dequantized_product_up_to_rounding():
    """The reference's exact products times g equal the fp64 product of the fp32 dequantized operands (the
    ``formats`` dequantizer without its BF16 rounding) to fp32 precision."""
    mod = _mod()
    pk, _, w32 = _weights((48, 16), 64, "cpu", seed=3)
    x_hat = _x_hat(4, 64, "cpu", seed=4)
    want = x_hat.double() @ w32.double().t()
    got = mod.fp4w_linear_reference(x_hat, pk).double()
    err = (got - want).abs()
    assert bool((err <= 2.0**-8 * want.abs() + 1e-6 * want.abs().max()).all())


def _interp_configs():
    c = _mod().FP4WConfig
    return (None, c(block_n=16, block_k=64, split=2), c(block_n=64, block_k=128, split=1, upcast="f32"),
            c(block_n=32, block_k=64, split=4))


# --- CPU: the interpreter run, in a subprocess ----------------------------------------------------------------
def test_fp4w_under_interpreter_in_subprocess(run_interp_tests):
    run_interp_tests(__file__)


@interp_only
@pytest.mark.parametrize(
    "m,ns,k,bias", [(1, (32,), 256, False), (5, (48, 16), 256, True), (20, (16, 32, 16), 512, False)]
)
def test_interp_matches_reference(m, ns, k, bias):
    _check(m, ns, k, "cpu", _interp_configs(), bias=bias, seed=m)


@interp_only
def test_interp_worked_example_and_bad_inputs():
    _worked_example("cpu")
    _bad_inputs("cpu")


# --- compiled kernels on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_matches_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    c = _mod().FP4WConfig
    configs = (None, c(split=1, upcast="asm"), c(split=4, upcast="asm"), c(block_n=64, block_k=64, split=2,
               upcast="bf16"), c(block_n=128, block_k=256, upcast="asm"), c(block_n=256, num_warps=8, num_stages=3),
               c(block_n=64, block_k=128, num_warps=8, num_stages=3, upcast="asm"))
    for m, ns, k, bias in ((5, (2048, 1024, 1024), 1024, False), (64, (1024,), 3072, False),
                           (64, (3072, 3072), 1024, True), (17, (1024,), 2048, False), (100, (256,), 512, True),
                           (256, (512,), 1024, False)):
        _check(m, ns, k, "cuda", configs, bias=bias, seed=m + k)
    _worked_example("cuda")
    _bad_inputs("cuda")


@pytest.mark.gpu
def test_gpu_inside_a_cuda_graph_follows_new_weights():
    """Captured once, replayed after the packed weight and the input changed in place: the replay equals an
    eager call on the new values (the graph reads the buffers, and split-K's counters reset themselves)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    mod = _mod()
    cfg = mod.FP4WConfig(split=4)
    pk, _, _ = _weights((1024,), 2048, "cuda", seed=1)
    pk2, _, _ = _weights((1024,), 2048, "cuda", seed=2)
    x = _x_hat(32, 2048, "cuda", seed=3)
    mod.fp4w_linear(x, pk, None, cfg)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mod.fp4w_linear(x, pk, None, cfg)
    graph.replay()
    assert torch.equal(y, mod.fp4w_linear(x, pk, None, cfg))
    pk.codes.copy_(pk2.codes)
    pk.scales.copy_(pk2.scales)
    pk.gain.copy_(pk2.gain)
    x.mul_(-2.0)
    graph.replay()
    want = mod.fp4w_linear(x, pk2, None, cfg)
    assert torch.equal(y, want) and not torch.equal(y, want.neg())

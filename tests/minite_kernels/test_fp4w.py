"""``minite_kernels.backends.triton.fp4w``: the FP4-weight GEMM ``Y = bf16(fp32(X̂ QSᵀ) · g) (+ b)`` that reads the
NVFP4 weight as packed E2M1 codes and block scales in the kernel's layout.

- Against its pure-PyTorch reference (``fp4w_linear_reference``, fp64 sums of the exact products): bit-equal
  where one term is summed (one-hot rows of X̂ pick single weight columns), and within the fp32 accumulation
  order otherwise: ``|Y - Y_ref| <= 2^-7 |Y_ref| + 1e-6 max|Y_ref|`` elementwise, relative L2 <= 1e-3.
- Against the learner's dequantized-weight GEMM ``bf16(X̂ Ŵᵀ)`` (Ŵ rounded to BF16 per element): the module
  docstring's elementwise bound ``|ΔY| <= 2^-8 Σ_k |X̂ Ŵ| + 2^-7 |Y|``, plus ``K 2^-24 Σ_k |X̂ Ŵ|`` for the fp32
  sums, and relative L2 <= 1e-2.
- The layout: packing and unpacking are exact inverses on every code and valid scale byte.
- Split-K sums its partials in a fixed order: two calls are equal bit for bit, whatever the configuration.
- Inside a CUDA graph the kernel follows weights rewritten in place (``FP4Weight.copy_rows_``).
- Programmatic dependent launch (``pdl=True``) changes no bit, alone or in the decode step's chain (fused norm,
  GEMM, SiLU product, GEMM) captured in one CUDA graph; compiled for sm_90 without a GPU, the kernel touches
  nothing but L2 prefetches of its own weight bytes before ``griddepcontrol.wait``.
- The decode's inline PTX, executed instruction by instruction on the CPU, gives ``q · s · 2^-26`` exactly.
The kernel runs under Triton's CPU interpreter (a subprocess with ``TRITON_INTERPRET=1``; there the decode is
written with Triton integer ops and the MMA is an fp32 dot) and compiled on a GPU (``-m gpu``).
"""

from __future__ import annotations

import re

import pytest
import torch
from minite_test_support import interp_only, spread_bf16

from minite_kernels.formats.nvfp4 import quantize_nvfp4
from minite_kernels.options import use_options

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
    return (
        quantize_nvfp4(spread_bf16(m, k, seed), scaling="per_token")
        .dequantize()
        .to(torch.bfloat16)
        .to(device)
    )


def _close(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    y, ref = y.double().cpu(), ref.double().cpu()
    err = (y - ref).abs()
    assert bool((err <= 2.0**-7 * ref.abs() + 1e-6 * ref.abs().max()).all()), float(err.max())
    assert float(err.norm() / ref.norm()) <= rel


def _check(m: int, ns: tuple[int, ...], k: int, device, configs, bias: bool = False, seed: int = 0) -> None:
    mod = _mod()
    pk, w_hat, _ = _weights(ns, k, device, seed)
    x_hat = _x_hat(m, k, device, seed + 100)
    b = (
        (torch.randn(sum(ns), generator=torch.Generator().manual_seed(seed)) * 4)
        .to(torch.bfloat16)
        .to(device)
    )
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
        _near_dequantized(y, deq, x_hat, w_hat, (m, ns, k, cfg), bias=b is not None)
        assert torch.equal(mod.fp4w_linear(x_hat, pk, b, cfg), y), cfg  # split-K sums in a fixed order
        assert torch.equal(mod.fp4w_linear(onehot, pk, None, cfg).cpu(), picked_ref.cpu()), cfg


def _near_dequantized(y, deq, x_hat, w_hat, cfg, bias: bool = False) -> None:
    """The bound against the dequantized-weight GEMM: Ŵ's per-element rounding (<= 2^-8 |Ŵ|), the two output
    roundings (<= 2^-8 |Y| each) and fp32 sums. With a bias, both sides also round the product before adding it
    (<= 2^-9 of the product each, and the product is at most the sum of |terms|): where the bias cancels the
    product, that rounding is large against the final |Y|."""
    y, deq = y.double().cpu(), deq.double().cpu()
    terms = x_hat.double().abs().cpu() @ w_hat.double().abs().cpu().t()
    err = (y - deq).abs()
    k = x_hat.shape[1]  # fp32 sums in any order: within (K - 1) 2^-24 of the sum of |terms|
    bound = (2.0**-8 + k * 2.0**-24) * terms + 2.0**-7 * torch.maximum(y.abs(), deq.abs()) + 1e-30
    if bias:
        bound = bound + 2.0**-8 * (1 + 2.0**-8) * terms
    assert bool((err <= bound).all()), (cfg, float((err - bound).max()))
    assert float(err.norm() / deq.norm()) <= 1e-2, cfg


def _worked_example(device) -> None:
    mod = _mod()
    pk = mod.FP4Weight.empty(16, 64, device)  # one 16-row group
    pk.codes[0, :2] = torch.tensor([0xC0, 0x01])  # value (0, 0): code 7 (6.0), every other value code 0
    pk.scales[0, 0] = 0x50  # E4M3 1.0 as its E5M3 byte
    pk.gain[0] = float(torch.tensor(2688.0) * mod.INV_2688)
    x = torch.zeros(1, 64, dtype=torch.bfloat16, device=device)
    x[0, 0] = 1.0
    assert mod.fp4w_linear(x, pk)[0, 0].item() == 6.0
    x[0, 0], x[0, 1] = 0.0, 1.0  # value (0, 1): code 0
    assert mod.fp4w_linear(x, pk)[0, 0].item() == 0.0


def _bad_inputs(device) -> None:
    mod = _mod()
    pk = mod.FP4Weight.empty(64, 64, device)
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="takes BF16 x_hat"):
        mod.fp4w_linear(x.float(), pk)
    with pytest.raises(ValueError, match=r"takes BF16 x_hat \[M, 64\]"):
        mod.fp4w_linear(x[:, :48], pk)
    with pytest.raises(ValueError, match="split=3 must be a power of two"):
        mod.fp4w_linear(x, pk, None, mod.FP4WConfig(block_n=64, block_k=64, split=3))
    with pytest.raises(ValueError, match=r"needs N % 16 == 0 and K % 64 == 0; got N=32, K=96"):
        mod.FP4Weight.empty(32, 96, device)
    with pytest.raises(ValueError, match=r"needs N % 16 == 0 and K % 64 == 0; got N=24, K=64"):
        mod.FP4Weight.empty(24, 64, device)
    with pytest.raises(ValueError, match="block_k=96 must be a multiple of 64 and block_n=128 of 16"):
        mod.fp4w_linear(x, pk, None, mod.FP4WConfig(block_k=96))
    with pytest.raises(ValueError, match="whole 16-row groups"):
        z = torch.zeros(16, 32, dtype=torch.uint8, device=device)
        pk.copy_rows_(8, z, z[:, :4].view(torch.float8_e4m3fn), torch.ones(1, device=device))
    with pytest.raises(ValueError, match="one amax per tensor or per row"):
        pk.copy_rows_(0, pk.codes, pk.scales, torch.ones(3))
    assert mod.fp4w_linear(x[:0], pk).shape == (0, 64)
    if not _pdl_capable(x):  # asked for where it cannot run (the interpreter, a pre-Hopper GPU): an error
        with pytest.raises(ValueError, match="programmatic dependent launch needs .*compute capability 9.0"):
            mod.fp4w_linear(x, pk, pdl=True)
    with pytest.raises(ValueError, match=r"prefetch='all' is not valid; valid: slice, head, none"):
        mod.fp4w_linear(x, pk, prefetch="all")


def _pdl_capable(x: torch.Tensor) -> bool:
    from minite_kernels.backends.triton._common import pdl_capable

    return pdl_capable(x)


def _pdl_switch(device) -> None:
    """``MINITE_TRITON_PDL=on`` (``options().pdl``) turns PDL on where it can run and is ignored elsewhere; the
    result is the same either way."""
    mod = _mod()
    pk, _, _ = _weights((32,), 128, device, seed=5)
    x = _x_hat(3, 128, device, seed=6)
    want = mod.fp4w_linear(x, pk, pdl=False)
    for mode in ("on", "head", "bare"):
        with use_options(pdl=mode):
            assert torch.equal(mod.fp4w_linear(x, pk), want), mode


def test_layout_round_trip_and_worked_example():
    """``pack_codes`` / ``pack_scales`` and their inverses are exact on every code and every valid E4M3 scale;
    the module docstring's worked example lands on the bytes it names."""
    from minite_kernels.formats.e2m1 import pack_nibbles

    mod = _mod()
    codes = torch.randint(0, 16, (32, 192), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    data = pack_nibbles(codes)
    assert torch.equal(mod.unpack_codes(mod.pack_codes(data)), data)
    sc = torch.arange(127, dtype=torch.uint8).repeat(1, 4)[:, : 32 * 12].view(32, 12)  # every valid E4M3 byte
    e5 = mod.pack_scales(sc.view(torch.float8_e4m3fn))
    assert torch.equal(mod.unpack_scales(e5).view(torch.uint8), sc)
    # E5M3 bytes decode (2^(E - 10) (1 + m/8)) to the E4M3 values they stand for
    e4 = torch.arange(127, dtype=torch.uint8)
    fwd = torch.tensor(mod._E5M3_FWD, dtype=torch.float64)
    val = torch.where(fwd == 0, 0.0, torch.exp2(torch.floor(fwd / 8) - 10) * (1 + (fwd % 8) / 8))
    assert torch.equal(val, e4.view(torch.float8_e4m3fn).to(torch.float64))
    one = torch.zeros(16, 32, dtype=torch.uint8)
    one[0, 0] = 7  # value (0, 0): code 7
    assert mod.pack_codes(one)[0, :2].tolist() == [0xC0, 0x01]
    s1 = torch.zeros(16, 4, dtype=torch.uint8)
    s1[0, 0] = 0x38  # E4M3 1.0
    assert mod.pack_scales(s1.view(torch.float8_e4m3fn))[0, 0].item() == 0x50


def _bf16_bits_to_float(bits: int) -> float:
    return torch.tensor([bits << 16], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


def _run_ptx(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """Execute the decode's PTX on Python ints: the handful of opcodes it uses, with PTX's semantics (32-bit
    registers; ``shr.b32`` logical; ``prmt`` default mode; ``lop3`` by its truth table; ``mul.rn.bf16x2`` per half,
    rounded to nearest even)."""
    regs = dict(regs)

    def val(t: str) -> int:
        return int(t, 0) if t[0].isdigit() else regs[t]

    for line in asm.strip().strip("{}").splitlines():
        line = line.strip().rstrip(";")
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        v = [val(a) for a in src]
        if op == "prmt.b32":
            pool = v[0] | (v[1] << 32)
            out = 0
            for i in range(4):
                sel = (v[2] >> (4 * i)) & 7  # no sign-replicate bit in the decode's selectors
                out |= ((pool >> (8 * sel)) & 255) << (8 * i)
        elif op == "mad.lo.u32":
            out = v[0] * v[1] + v[2]
        elif op == "and.b32":
            out = v[0] & v[1]
        elif op == "shl.b32":
            out = v[0] << v[1]
        elif op == "shr.b32":
            out = v[0] >> v[1]
        elif op == "lop3.b32":
            a, b, c, lut = v
            out = 0
            for bit in range(32):
                idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
                out |= ((lut >> idx) & 1) << bit
        elif op == "mul.rn.bf16x2":
            out = 0
            for half in range(2):
                x = _bf16_bits_to_float((v[0] >> (16 * half)) & 0xFFFF) * _bf16_bits_to_float(
                    (v[1] >> (16 * half)) & 0xFFFF
                )
                b16 = (
                    torch.tensor([x], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item()
                    & 0xFFFF
                )
                out |= b16 << (16 * half)
        else:
            raise AssertionError(f"opcode {op} has no executor here")
        regs[d] = out & 0xFFFFFFFF
    return regs


def test_decode_ptx_executed_on_cpu_gives_qs_times_2_pow_minus_26():
    """The inline PTX of the compiled decode, executed instruction by instruction: each fragment register holds
    the two values ``q · s · 2^-26`` (exact) the layout put there, for random words (every bit of a word is a
    code bit) and every scale byte, subnormal E4M3 scales and code 1 (a subnormal BF16 input) included."""
    from minite_kernels.formats.e2m1 import E2M1_VALUES

    mod = _mod()
    asm = mod._DECODE_ASM.value if hasattr(mod._DECODE_ASM, "value") else mod._DECODE_ASM
    g = torch.Generator().manual_seed(0)
    words = torch.randint(0, 2**32, (300,), generator=g, dtype=torch.int64).tolist()
    words += [0, 0xFFFFFFFF, 0x11111111, 0x88888888]
    e4 = list(
        range(1, 127)
    )  # a zero scale's block has zero codes (``copy_rows_``), whatever byte 0 decodes to
    for i, word in enumerate(words):
        s_e4 = (e4[i % 126], e4[(7 * i + 3) % 126])
        s_e5 = [mod._E5M3_FWD[b] for b in s_e4]
        scale_reg = s_e5[0] | (s_e5[0] << 8) | (s_e5[1] << 16) | (s_e5[1] << 24)
        out = _run_ptx(asm, {"$4": word, "$5": scale_reg})
        for r in range(4):
            h = r % 2
            s = torch.tensor([s_e4[h]], dtype=torch.uint8).view(torch.float8_e4m3fn).item()
            for p in range(2):
                code = int(mod._e2m1_code(r, p, torch.tensor(word, dtype=torch.int64)))
                want = E2M1_VALUES[code] * s * 2.0**-26
                got = _bf16_bits_to_float((out[f"${r}"] >> (16 * p)) & 0xFFFF)
                assert got == want, (hex(word), r, p, code, s, got, want)


def test_block_m_keeps_every_launch_within_shared_memory():
    """A configuration measured at tens of rows and used at hundreds takes fewer rows per program where its
    pipeline would not fit the shared memory (``_block_m``); the table's own configurations fit at any row count."""
    mod = _mod()
    deep = mod.FP4WConfig(block_n=128, block_k=256)  # 4 stages of 256-wide K steps
    assert mod._block_m(deep, 256, 256) == 64 and mod._block_m(deep, 16, 256) == 16
    assert mod._block_m(mod.DEFAULT_CONFIG, 256, 128) == 128 and mod._block_m(mod.DEFAULT_CONFIG, 5, 128) == 16
    for row in mod.TABLE.values():
        for cfg in filter(None, row.values()):
            bm = mod._block_m(cfg, 256, cfg.block_k)
            assert mod._smem_bytes(cfg, bm, cfg.block_k) <= mod.SMEM_BUDGET, cfg


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
    return (
        None,
        c(block_n=64, block_k=64, split=2),
        c(block_n=128, block_k=128, split=1),
        c(block_n=64, block_k=64, split=4),
        c(block_n=64, block_k=128, split=2, swap_ab=False),
        c(block_n=32, block_k=64, split=2, num_warps=2),
    )


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
    _pdl_switch("cpu")


def test_pdl_on_the_cpu_is_an_error():
    """``pdl=True`` on a CPU tensor (no interpreter here) fails before any launch, with the one-line error of
    the decode kernels; ``pdl=None`` follows the switch, which is off by default."""
    mod = _mod()
    pk = mod.FP4Weight.empty(64, 64, "cpu")
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    msg = r"programmatic dependent launch needs .*; pass pdl=None or False on cpu"
    with pytest.raises(ValueError, match=msg):
        mod.fp4w_linear(x, pk, pdl=True)


def _pack_kernel_equals_reference(device) -> None:
    """``FP4Weight.copy_rows_`` through the pack kernel (``fp4w_pack``) writes the bytes of the PyTorch reference
    (``pack_codes`` / ``pack_scales`` after zeroing the codes of zero-scale blocks): random codes, every valid
    E4M3 scale byte and zero blocks, two linears at row offsets, K with 1, 2 and 4 tiles per program."""
    mod = _mod()
    gen = torch.Generator().manual_seed(7)
    for ns, k in (((32, 16), 64), ((16, 48), 128), ((48,), 320), ((16, 32), 768)):
        pk = mod.FP4Weight.empty(sum(ns), k, device)
        want_c, want_s, row = [], [], 0
        for n in ns:
            data = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
            sc = torch.randint(0, 127, (n, k // 16), dtype=torch.uint8, generator=gen)
            sc[torch.rand(n, k // 16, generator=gen) < 0.2] = 0  # zero blocks: their codes must become 0
            amax = torch.rand(1, generator=gen) * 10
            row = pk.copy_rows_(row, data.to(device), sc.view(torch.float8_e4m3fn).to(device), amax.to(device))
            zeroed = torch.where((sc == 0).repeat_interleave(8, dim=1), 0, data)
            want_c.append(mod.pack_codes(zeroed))
            want_s.append(mod.pack_scales(sc.view(torch.float8_e4m3fn)))
        assert torch.equal(pk.codes.cpu(), torch.cat(want_c)), (ns, k)
        assert torch.equal(pk.scales.cpu(), torch.cat(want_s)), (ns, k)
    with pytest.raises(ValueError, match="takes data"):
        pk.copy_rows_(0, torch.zeros(16, 8, dtype=torch.uint8, device=device),
                      torch.zeros(16, 1, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn),
                      torch.ones(1, device=device))
    with pytest.raises(ValueError, match="do not fit"):
        pk.copy_rows_(32, torch.zeros(32, k // 2, dtype=torch.uint8, device=device),
                      torch.zeros(32, k // 16, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn),
                      torch.ones(1, device=device))


@interp_only
def test_interp_pack_kernel_equals_reference():
    _pack_kernel_equals_reference("cpu")


# --- compiled kernels on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_pack_kernel_equals_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _pack_kernel_equals_reference("cuda")


@pytest.mark.gpu
def test_gpu_matches_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    c = _mod().FP4WConfig
    configs = (
        None,
        c(split=1),
        c(split=4),
        c(block_n=64, block_k=64, split=2),
        c(block_n=128, block_k=256),
        c(block_n=256, num_warps=8, num_stages=3),
        c(block_n=64, block_k=128, num_warps=8, num_stages=3),
        c(block_n=128, num_warps=8, num_stages=2),
        c(block_n=64, block_k=64, split=8, num_stages=2),
        c(swap_ab=False, num_stages=2),
        c(block_n=64, block_k=64, split=4, num_stages=3, swap_ab=False),
        c(block_n=128, block_k=128, num_warps=8, num_stages=2, swap_ab=False),
        c(block_n=64, block_k=128, split=2, num_warps=2, num_stages=3),
        c(block_n=32, block_k=64, split=4, num_warps=2, num_stages=3),
    )
    for m, ns, k, bias in (
        (5, (2048, 1024, 1024), 1024, False),
        (64, (1024,), 3072, False),
        (64, (3072, 3072), 1024, True),
        (17, (1024,), 2048, False),
        (100, (256,), 512, True),
        (256, (512,), 1024, False),
    ):
        _check(m, ns, k, "cuda", configs, bias=bias, seed=m + k)
    _worked_example("cuda")
    _bad_inputs("cuda")
    _pdl_switch("cuda")


def _skip_without_pdl() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not _pdl_capable(torch.empty(0, device="cuda")):
        pytest.skip("programmatic dependent launch needs sm_90+ and Triton >= 3.3")


@pytest.mark.gpu
def test_gpu_pdl_changes_no_bit():
    """``pdl=True`` changes when the kernel starts, not what it computes: one split and split-K, either operand
    order, with and without a bias, groups past N in the last tile, whatever it prefetches."""
    _skip_without_pdl()
    mod = _mod()
    c = mod.FP4WConfig
    configs = (
        None,
        c(block_n=128, block_k=64, split=2),
        c(block_n=64, block_k=128, split=1),
        c(block_n=64, block_k=64, split=4, num_stages=3, swap_ab=False),
    )
    for m, ns, k, bias in ((64, (1024, 1024), 2560, True), (5, (2048,), 1024, False), (100, (272,), 512, True)):
        pk, _, _ = _weights(ns, k, "cuda", seed=m)
        x = _x_hat(m, k, "cuda", seed=m + 1)
        b = torch.randn(sum(ns), generator=torch.Generator().manual_seed(m)).to(torch.bfloat16).cuda()
        b = b if bias else None
        for cfg in configs:
            want = mod.fp4w_linear(x, pk, b, cfg, pdl=False)
            for prefetch in mod.PREFETCH_CHOICES:
                got = mod.fp4w_linear(x, pk, b, cfg, pdl=True, prefetch=prefetch)
                assert torch.equal(got, want), (m, ns, k, cfg, prefetch)


@pytest.mark.gpu
def test_gpu_pdl_chain_in_one_cuda_graph():
    """The decode step's MLP chain (fused residual add + RMSNorm, the gate/up GEMM with split-K, the SiLU product,
    the down GEMM), every launch with PDL, captured in one CUDA graph: each GEMM may start while the kernel that
    writes its input still runs, so a read of X̂ before ``griddepcontrol.wait`` would race. Replays must equal
    the chain run eagerly without PDL, bit for bit, also after new inputs were copied into the graph's buffers."""
    _skip_without_pdl()
    from minite_kernels.backends.triton.norm_quant import add_rms_norm_deq, silu_mul_deq

    mod = _mod()
    m, hidden, inter = 64, 1024, 1536
    gate_up, _, _ = _weights((inter, inter), hidden, "cuda", seed=11)
    down, _, _ = _weights((hidden,), inter, "cuda", seed=12)
    cfg_gu = mod.FP4WConfig(block_n=128, block_k=64, split=2)  # the 4B gate/up launch
    cfg_down = mod.FP4WConfig(block_n=64, block_k=128, split=1)
    g = torch.Generator().manual_seed(13)
    h = (3 * torch.randn(m, hidden, generator=g)).to(torch.bfloat16).cuda()
    y = torch.randn(m, hidden, generator=g).to(torch.bfloat16).cuda()
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()

    def chain(pdl: bool):
        h2, x_hat, _ = add_rms_norm_deq(h, y, w, 1e-6, pdl=pdl)
        gu = mod.fp4w_linear(x_hat, gate_up, None, cfg_gu, pdl=pdl)
        a_hat, _ = silu_mul_deq(gu[:, :inter], gu[:, inter:], pdl=pdl)
        return h2, gu, mod.fp4w_linear(a_hat, down, None, cfg_down, pdl=pdl)

    want = chain(False)
    assert all(torch.equal(a, b) for a, b in zip(chain(True), want))  # also compiles the PDL kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(True)
    for step in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(got, want)), step
        h.copy_((3 * torch.randn(m, hidden, generator=g)).to(torch.bfloat16))  # new inputs, same buffers
        y.copy_(torch.randn(m, hidden, generator=g).to(torch.bfloat16))
        want = chain(False)


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


#: the kernel's run-time arguments as the launcher passes them (pointers 16-byte aligned, as torch allocates)
_KERNEL_TYPES = {
    "x_ptr": "*bf16",
    "codes_ptr": "*u8",
    "scales_ptr": "*u8",
    "gain_ptr": "*fp32",
    "bias_ptr": "*bf16",
    "y_ptr": "*bf16",
    "part_ptr": "*fp32",
    "cnt_ptr": "*i32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "stride_xm": "i32",
}


def _tabled_launches():
    """Each distinct (configuration, K, activation rows per program) of the table at its buckets' row counts."""
    F = _mod()
    seen = {}
    for (n, k), row in F.TABLE.items():
        for m, cfg in row.items():
            if cfg is None:
                continue
            bk = cfg.block_k if k % cfg.block_k == 0 else 64
            key = (cfg, k, F._block_m(cfg, m, bk), bk)
            seen.setdefault(key, f"{n}x{k}@{m}")
    seen.setdefault((F.DEFAULT_CONFIG, 1024, 16, 128), "default@16")
    return sorted(seen.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("launch", [key for key, _ in _tabled_launches()], ids=[i for _, i in _tabled_launches()])
def test_compiled_mmas_stay_asynchronous(launch):
    """Compiled for sm_90 without a GPU: ptxas keeps the register-operand MMAs asynchronous for every tabled
    launch. With the K loop's trip count a run-time value it serialized them (advisory C7515), putting a wait
    after every MMA, so decode and MMA never overlapped."""
    from minite_kernels.backends.triton.offline import compile_offline, ptxas_messages

    cfg, k, bm, bk = launch
    split = cfg.split or 4
    constexprs = dict(
        K_PER_SPLIT=k // split,
        HAS_BIAS=False,
        SPLIT=split,
        BLOCK_M=bm,
        BLOCK_N=cfg.block_n,
        BLOCK_K=bk,
        SWAP_AB=cfg.swap_ab,
        INTERP=False,
    )
    asm = compile_offline(
        _mod()._fp4w_kernel,
        _KERNEL_TYPES,
        constexprs,
        warps=cfg.num_warps,
        stages=cfg.num_stages,
        divisible_by_16=("N", "K", "stride_xm"),
    )
    assert "wgmma.mma_async" in asm["ptx"]
    assert ptxas_messages(asm["ptx"]) == []


@pytest.mark.parametrize(
    "block_n,block_k,split,k,rows,swap_ab,bias,prefetch",
    [
        (128, 64, 2, 2560, 64, True, False, "slice"),  # the table's 4B gate/up launch (19456 x 2560 at 64 rows)
        (64, 128, 1, 1024, 64, True, True, "slice"),  # one split (6144 x 1024 at 64 rows), with a bias
        (64, 64, 4, 2048, 16, False, False, "slice"),  # the other operand order, split-K
        (128, 64, 2, 2560, 64, True, False, "head"),  # the 4B gate/up launch, its first pipeline stages
        (128, 64, 2, 2560, 64, True, False, "none"),  # and prefetching nothing
    ],
    ids=["gate_up_split_k", "one_split_bias", "swap_ab_off", "gate_up_head", "gate_up_none"],
)
def test_compiled_pdl_waits_before_reading(block_n, block_k, split, k, rows, swap_ab, bias, prefetch):
    """Compiled for sm_90 without a GPU, with ``PDL``: before ``griddepcontrol.wait`` the program issues one
    L2 bulk prefetch of its codes and one of its scales per 16-row group (2 * BLOCK_N / 16; none where it
    prefetches nothing) and touches global memory in no other way (no load, no asynchronous copy into shared
    memory: Triton's pipeliner keeps its prologue after the wait; no store or atomic), in the PTX and in the
    machine code ptxas makes of it; the register-operand MMAs stay asynchronous. Without ``PDL`` no grid
    dependency control and no prefetch are compiled."""
    from minite_kernels.backends.triton.offline import (
        compile_offline,
        first_global_access,
        first_global_sass,
        ptxas_messages,
        sass,
    )

    cx = {
        "K_PER_SPLIT": k // split,
        "HAS_BIAS": bias,
        "SPLIT": split,
        "BLOCK_M": rows,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "SWAP_AB": swap_ab,
        "INTERP": False,
    }

    prefetch_k = _mod()._prefetch_k(prefetch, k // split, block_k, 4)
    assert prefetch_k == {"slice": k // split, "head": min(k // split, 4 * block_k), "none": 0}[prefetch]

    def build(pdl: bool) -> dict:
        return compile_offline(
            _mod()._fp4w_kernel, _KERNEL_TYPES, dict(cx, PDL=pdl, PREFETCH_K=prefetch_k), warps=4, stages=4,
            divisible_by_16=("N", "K", "stride_xm"),
        )  # fmt: skip

    asm = build(True)
    on = asm["ptx"]
    wait = on.index("griddepcontrol.wait")
    assert on.count("griddepcontrol.wait") == 1 and wait < first_global_access(on)
    prefetches = [m.start() for m in re.finditer(r"cp\.async\.bulk\.prefetch\.L2\.global", on)]
    assert len(prefetches) == (2 * (block_n // 16) if prefetch_k else 0) and max(prefetches, default=0) < wait
    assert ptxas_messages(on) == []
    # and in the machine code: ptxas keeps every global access after the wait (ACQBULK), the prefetches before it
    ops = sass(asm["cubin"])
    waits = [i for i, op in enumerate(ops) if op.startswith("ACQBULK")]
    assert len(waits) == 1 and waits[0] < first_global_sass(ops)
    sass_prefetches = [i for i, op in enumerate(ops) if "UBLKPF.L2" in op]
    assert len(sass_prefetches) == len(prefetches) and max(sass_prefetches, default=0) < waits[0]
    off = build(False)["ptx"]
    assert "griddepcontrol" not in off and "prefetch" not in off

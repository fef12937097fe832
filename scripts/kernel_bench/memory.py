"""Sections ``copy`` (device copy bandwidth, the ceiling of the memory-bound kernels) and ``quantize`` (NVFP4
quantize of 8192x8192 bf16 as a fraction of it)."""
from __future__ import annotations

import torch
from kernel_bench.common import (
    RESULTS,
    bench,
    emit,
    measured_copy_gbps,
    section,
)


@section("copy")
def bench_copy(args):
    for m, k in ((8192, 8192), (32768, 16384)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ms = bench(lambda: y.copy_(x))
        nbytes = 2 * x.numel() * 2
        emit({"bench": "copy", "case": f"{m}x{k}_bf16", "ms": ms, "GBps": nbytes / ms / 1e6})
    args.copy_gbps = RESULTS[-2]["GBps"]  # the 8192x8192 one: same size as the quantize benchmark


@section("quantize")
def bench_quantize(args):
    from minite_kernels.backends.triton import quantize_nvfp4_triton
    from minite_kernels.formats import quantize_nvfp4

    copy_gbps = measured_copy_gbps(args)
    m = k = 8192
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * torch.exp(
        torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    )
    n = m * k
    packed_bytes = n // 2 + n // 16
    cases = [
        ("per_token_1x16", dict(per_token=True), 2 * n + packed_bytes + 4 * m, 2 * n + packed_bytes + 4 * m),
        (
            "per_token_1x16+qs",
            dict(per_token=True, write_qs=True),
            2 * n + packed_bytes + 2 * n,
            2 * n + packed_bytes + 2 * n,
        ),
        ("per_token_qs_only", dict(per_token=True, write_packed=False, write_qs=True), 4 * n, 4 * n),
        (
            "per_token_1x16+deq",  # what the training forward writes (packed + dequantized bf16 operand)
            dict(per_token=True, write_deq=True),
            2 * n + packed_bytes + 2 * n,
            2 * n + packed_bytes + 2 * n,
        ),
        (
            "per_tensor_16x16+deq",  # weight sync with the GEMM operand refreshed
            dict(per_token=False, tile16=True, write_deq=True),
            4 * n + packed_bytes,
            6 * n + packed_bytes,
        ),
        ("per_tensor_1x16", dict(per_token=False), 2 * n + packed_bytes, 4 * n + packed_bytes),
        ("per_tensor_16x16", dict(per_token=False, tile16=True), 2 * n + packed_bytes, 4 * n + packed_bytes),
    ]
    ref_ms = None
    for name, kw, useful, traffic in cases:
        ms = bench(lambda: quantize_nvfp4_triton(x, **kw))
        rec = {
            "bench": "quantize",
            "case": name,
            "shape": [m, k],
            "ms": ms,
            "useful_GBps": useful / ms / 1e6,
            "frac_copy_bw_useful": useful / ms / 1e6 / copy_gbps,
            "traffic_GBps": traffic / ms / 1e6,
            "frac_copy_bw_traffic": traffic / ms / 1e6 / copy_gbps,
            "copy_GBps": copy_gbps,
            "target_frac": 0.8,
        }
        if name in ("per_token_1x16", "per_tensor_1x16", "per_tensor_16x16"):
            scaling = "per_token" if "token" in name else "per_tensor"
            tile = (16, 16) if "16x16" in name else (1, 16)
            ref_ms = bench(lambda: quantize_nvfp4(x, scaling=scaling, tile=tile), rep=50, warmup=5)
            rec.update(emulated_torch_ms=ref_ms, speedup_vs_emulated=ref_ms / ms)
        emit(rec)
    # byte-exactness spot check on this very tensor (the tests do it exhaustively)
    d, s, a, *_ = quantize_nvfp4_triton(x, per_token=True)
    r = quantize_nvfp4(x, scaling="per_token")
    emit(
        {
            "bench": "quantize",
            "case": "exact_check_8192",
            "data_equal": bool(torch.equal(d, r.data)),
            "scales_equal": bool(torch.equal(s.view(torch.uint8), r.scales.view(torch.uint8))),
            "amax_equal": bool(torch.equal(a, r.amax)),
        }
    )

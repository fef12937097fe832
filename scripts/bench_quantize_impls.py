"""A/B of the Triton NVFP4 quantize formulations and weight-sync launch strategies, side by side (issue #6).

Prints one JSON line per case: ``impl`` v1 (one uint8 store per input word) vs v2 (whole 16-element blocks
per thread, 8-byte code stores) on 8192x8192 bf16 as a fraction of the copy bandwidth measured in the same
run (bytes read + written that the output needs); a sweep of v2's launch sizes; and weight sync over the 196
linears of a Qwen3-1.7B-shaped model: v1 per weight, v2 per weight, grouped (one amax + one quantize launch
for all weights) and grouped in L2-sized chunks.

    python scripts/bench_quantize_impls.py
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_kernels import _copy_gbps, _qwen3_1p7b_weights  # scripts/ is on sys.path when run as a script
from triton.testing import do_bench

from minite_kernels.backends.triton import WeightRequantizer
from minite_kernels.backends.triton import quantize as Q


def emit(**rec) -> None:
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)


def main() -> int:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = x.numel()
    copy_gbps = _copy_gbps(argparse.Namespace())
    emit(bench="copy", GBps=copy_gbps)
    packed = 2 * n + n // 2 + n // 16
    cases = {
        "per_token_packed": (dict(per_token=True), packed),
        "per_token_qs_only": (dict(per_token=True, write_packed=False, write_qs=True), 4 * n),
        "per_token_packed_deq": (dict(per_token=True, write_deq=True), packed + 2 * n),
        "per_tensor_1x16": (dict(per_token=False), packed),
        "per_tensor_16x16": (dict(per_token=False, tile16=True), packed),
    }
    for impl in ("v1", "v2"):
        Q._IMPL = impl
        for case, (kw, nbytes) in cases.items():
            ms = do_bench(lambda kw=kw: Q.quantize_nvfp4_triton(x, **kw))
            emit(bench="quantize", impl=impl, case=case, ms=ms, frac_copy_bw=nbytes / ms / 1e6 / copy_gbps)
    Q._IMPL = "v2"
    default = dict(Q.V2_CONFIG)
    for tpt in (8, 16, 32):
        for words in (2048, 4096, 8192):
            Q.V2_CONFIG.update(token_words_per_thread=tpt, token_program_words=words)
            ms = do_bench(lambda: Q.quantize_nvfp4_triton(x, per_token=True))
            emit(
                bench="quantize_sweep",
                tpt=tpt,
                words=words,
                ms=ms,
                frac_copy_bw=packed / ms / 1e6 / copy_gbps,
            )
    Q.V2_CONFIG.clear()
    Q.V2_CONFIG.update(default)
    for nb, warps in ((16, 4), (32, 4), (32, 8), (64, 4), (64, 8)):
        Q.V2_CONFIG.update(tile16_nb=nb, tile16_warps=warps, tensor_nb=nb, tensor_warps=warps)
        ms16 = do_bench(lambda: Q.quantize_nvfp4_triton(x, per_token=False, tile16=True))
        ms1 = do_bench(lambda: Q.quantize_nvfp4_triton(x, per_token=False))
        emit(
            bench="quantize_sweep_tensor",
            nb=nb,
            warps=warps,
            ms_16x16=ms16,
            ms_1x16=ms1,
            frac_traffic_16x16=(2 * n + packed) / ms16 / 1e6 / copy_gbps,
        )
    Q.V2_CONFIG.clear()
    Q.V2_CONFIG.update(default)
    x = None
    ws = _qwen3_1p7b_weights()
    nparam = sum(w.numel() for w in ws)
    variants = (
        ("v1", {}),
        ("v2", dict(grouped=False)),
        ("v2", {}),
        ("v2", dict(chunk_bytes=32 << 20)),
        ("v2", dict(chunk_bytes=128 << 20)),
    )
    for impl, kw in variants:
        Q._IMPL = impl
        sync = WeightRequantizer(ws, **kw)
        sync.sync()
        ms = do_bench(sync.sync)
        emit(
            bench="weight_sync",
            impl=impl,
            kw=str(kw),
            launches=sync.num_launches,
            ms=ms,
            ms_per_B_params=ms / (nparam / 1e9),
            frac_copy_bw_traffic=4.5625 * nparam / ms / 1e6 / copy_gbps,
            frac_copy_bw_useful=2.5625 * nparam / ms / 1e6 / copy_gbps,
        )
        del sync
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

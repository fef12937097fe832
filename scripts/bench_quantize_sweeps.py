"""Launch-size sweeps of the Triton NVFP4 quantize kernels and the weight-sync strategies (issue #6).

Prints one JSON line per case, as a fraction of the copy bandwidth measured in the same run (bytes read +
written that the output needs):

  ab          8192x8192 bf16, each output combination (per token / per tensor, packed, qs, deq), then a
              sweep of the per-token and per-tensor launch sizes (``quantize.BF16_CONFIG``)
  sync        weight sync over the 196 linears of a Qwen3-1.7B-shaped model: per weight, grouped (one amax +
              one quantize launch for all weights), grouped in L2-sized chunks
  learner     per-token [4096, K] activations (the learner's forward), packed + deq and packed, over the
              per-token launch sizes (``default`` marks the library's)
  sync_sweep  grouped weight sync over the amax / quantize launch sizes

    python scripts/bench_quantize_sweeps.py                            # ab + sync
    python scripts/bench_quantize_sweeps.py --only learner,sync_sweep

The output-combination cases of ``ab`` and all of ``learner`` are CUDA-graph replays with preallocated outputs
(GPU time only, no host launch cost); the ``ab`` launch-size sweeps and the weight-sync cases use
``do_bench`` (8192² inputs and whole-model syncs run long enough that the launch cost is hidden).
The first quantize formulation (v1), which this script compared against until it was removed, is in git
history; its numbers are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json

import torch
from kernel_bench.common import measured_copy_gbps, qwen3_1p7b_weights  # scripts/ is on sys.path
from timing import gpu_ms

from minite_kernels.backends.triton import WeightRequantizer
from minite_kernels.backends.triton import quantize as Q


def emit(**rec) -> None:
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)


#: learner activation shapes (4096 tokens x the K of each Qwen3-1.7B / 4B linear input)
LEARNER_K = (2048, 2560, 4096, 6144, 9728)


def _graph_ms(fn) -> float:
    """GPU time of ``fn`` (preallocated outputs) from CUDA-graph replay: no host launch cost in the number."""
    return gpu_ms(fn, graph=True, rep=100)


def bench_learner_shapes(copy_gbps: float) -> None:
    """Per-token quantize of [4096, K] bf16 activations, packed + BF16 ``deq`` (the learner's forward case)
    and packed only, over the per-token launch sizes."""
    default = dict(Q.BF16_CONFIG)
    for k in LEARNER_K:
        x = torch.randn(4096, k, device="cuda", dtype=torch.bfloat16)
        n = x.numel()
        for case, kw, nbytes in (
            ("packed_deq", {"write_deq": True}, 2 * n + n // 2 + n // 16 + 2 * n),
            ("packed", {}, 2 * n + n // 2 + n // 16),
        ):
            out = Q.quantize_nvfp4_triton(x, per_token=True, **kw)
            configs = [(tpt, words) for tpt in (8, 16, 32) for words in (1024, 2048, 4096, 8192)]
            for cfg in configs:
                Q.BF16_CONFIG.update(token_words_per_thread=cfg[0], token_program_words=cfg[1])
                ms = _graph_ms(
                    lambda x=x, out=out, kw=kw: Q.quantize_nvfp4_triton(x, per_token=True, out=out, **kw)
                )
                emit(
                    bench="quantize_learner",
                    K=k,
                    case=case,
                    tpt_words=cfg,
                    default=cfg == (default["token_words_per_thread"], default["token_program_words"]),
                    us=ms * 1e3,
                    frac_copy_bw=nbytes / ms / 1e6 / copy_gbps,
                )
                Q.BF16_CONFIG.update(default)
        del x, out


def bench_sync_sweep(copy_gbps: float) -> None:
    """Grouped weight sync (CUDA graph, Qwen3-1.7B linears) over the amax / quantize launch sizes."""
    default = dict(Q.BF16_CONFIG)
    ws = qwen3_1p7b_weights()
    nparam = sum(w.numel() for w in ws)
    for a_rows, a_w, a_warps in ((32, 512, 8), (64, 512, 8), (32, 1024, 8), (64, 1024, 16), (16, 512, 4)):
        for nb, warps in ((32, 8), (64, 8), (32, 4)):
            Q.BF16_CONFIG.update(
                amax_rows=a_rows, amax_block_w=a_w, amax_warps=a_warps, tile16_nb=nb, tile16_warps=warps
            )
            sync = WeightRequantizer(ws)
            sync.sync()
            ms = gpu_ms(sync.sync, rep=100)
            emit(
                bench="weight_sync_sweep",
                amax=(a_rows, a_w, a_warps),
                quant=(nb, warps),
                ms=ms,
                ms_per_B_params=ms / (nparam / 1e9),
                frac_copy_bw_traffic=4.5625 * nparam / ms / 1e6 / copy_gbps,
            )
            del sync
            Q.BF16_CONFIG.clear()
            Q.BF16_CONFIG.update(default)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="ab,sync", help="comma list of: ab, sync, learner, sync_sweep")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    copy_gbps = measured_copy_gbps(argparse.Namespace())
    if "learner" in only:
        bench_learner_shapes(copy_gbps)
    if "sync_sweep" in only:
        bench_sync_sweep(copy_gbps)
    if only & {"ab", "sync"}:
        ab_and_sync(copy_gbps, only)
    return 0


def ab_and_sync(copy_gbps: float, only: set) -> None:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = x.numel()
    emit(bench="copy", GBps=copy_gbps)
    packed = 2 * n + n // 2 + n // 16
    cases = {
        "per_token_packed": ({"per_token": True}, packed),
        "per_token_qs_only": ({"per_token": True, "write_packed": False, "write_qs": True}, 4 * n),
        "per_token_packed_deq": ({"per_token": True, "write_deq": True}, packed + 2 * n),
        "per_tensor_1x16": ({"per_token": False}, packed),
        "per_tensor_16x16": ({"per_token": False, "tile16": True}, packed),
    }
    for case, (kw, nbytes) in cases.items() if "ab" in only else ():
        out = Q.quantize_nvfp4_triton(x, **kw)
        ms = _graph_ms(lambda kw=kw, out=out: Q.quantize_nvfp4_triton(x, out=out, **kw))
        emit(bench="quantize", case=case, ms=ms, frac_copy_bw=nbytes / ms / 1e6 / copy_gbps)
        del out
    default = dict(Q.BF16_CONFIG)
    for tpt in (8, 16, 32) if "ab" in only else ():
        for words in (2048, 4096, 8192):
            Q.BF16_CONFIG.update(token_words_per_thread=tpt, token_program_words=words)
            ms = gpu_ms(lambda: Q.quantize_nvfp4_triton(x, per_token=True))
            emit(
                bench="quantize_sweep",
                tpt=tpt,
                words=words,
                ms=ms,
                frac_copy_bw=packed / ms / 1e6 / copy_gbps,
            )
    Q.BF16_CONFIG.clear()
    Q.BF16_CONFIG.update(default)
    for nb, warps in ((16, 4), (32, 4), (32, 8), (64, 4), (64, 8)) if "ab" in only else ():
        Q.BF16_CONFIG.update(tile16_nb=nb, tile16_warps=warps, tensor_nb=nb, tensor_warps=warps)
        ms16 = gpu_ms(lambda: Q.quantize_nvfp4_triton(x, per_token=False, tile16=True))
        ms1 = gpu_ms(lambda: Q.quantize_nvfp4_triton(x, per_token=False))
        emit(
            bench="quantize_sweep_tensor",
            nb=nb,
            warps=warps,
            ms_16x16=ms16,
            ms_1x16=ms1,
            frac_traffic_16x16=(2 * n + packed) / ms16 / 1e6 / copy_gbps,
        )
    Q.BF16_CONFIG.clear()
    Q.BF16_CONFIG.update(default)
    x = None
    if "sync" not in only:
        return
    ws = qwen3_1p7b_weights()
    nparam = sum(w.numel() for w in ws)
    variants = ({"grouped": False}, {}, {"chunk_bytes": 32 << 20}, {"chunk_bytes": 128 << 20})
    for kw in variants:
        sync = WeightRequantizer(ws, **kw)
        sync.sync()
        ms = gpu_ms(sync.sync)
        emit(
            bench="weight_sync",
            kw=str(kw),
            launches=sync.num_launches,
            ms=ms,
            ms_per_B_params=ms / (nparam / 1e9),
            frac_copy_bw_traffic=4.5625 * nparam / ms / 1e6 / copy_gbps,
            frac_copy_bw_useful=2.5625 * nparam / ms / 1e6 / copy_gbps,
        )
        del sync


if __name__ == "__main__":
    raise SystemExit(main())

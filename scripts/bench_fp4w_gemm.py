"""The packed-weight GEMM (``scripts/fp4w_gemm.py``) against the fast lane's
``torch.mm(X̂, Ŵᵀ)`` on the BF16 dequantized weight (cuBLAS; the same GEMM the BF16 recipe runs), at the
projections the CUDA-graph sampler runs per decode step (one layer of ``--model``: q/k/v packed, o, gate/up
packed, down).

All times are microseconds of CUDA-graph replay (GPU time, median), with weights streamed from HBM: each graph
cycles through enough distinct weight copies (``--cold-mb``) that no weight is still in the 50 MB L2 when it
comes back, as in a model's decode step.

1. ``fp4w_shape`` per shape and batch: ``mm_us`` (cuBLAS on Ŵ), ``fp4w_us`` (the launch defaults), and the
   sweep of launch configurations (``sweep_us``, keys ``n{BLOCK_N}k{BLOCK_K}s{split}w{warps}p{stages}``, and
   ``floor_...`` for the same launch without the decode arithmetic) with the best exact one; ``rel_l2``
   checks the defaults against cuBLAS first.
2. ``fp4w_layer`` per batch: the layer's four projections in sequence, cuBLAS against the defaults, which is what
   a decode step's 28 layers pay each.

    python scripts/bench_fp4w_gemm.py [--model qwen3-0.6b|qwen3-8b] [--batches 8,16,32,64]
        [--sweep [--sweep-batches 64]] [--rep 50] [--out fp4w.jsonl]
"""

from __future__ import annotations

import argparse
import json

import torch
from timing import gpu_us  # scripts/ is on sys.path when run as a script

#: (name, N, K) of one layer's projections as the sampler packs them
SHAPES = {
    "qwen3-0.6b": (("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)),
    "qwen3-8b": (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288)),
}
#: (decode, BLOCK_N, BLOCK_K, split, warps, stages) tried by --sweep; decode=False is the structure's timing
#: floor (the same loads and MMAs without the decode arithmetic)
SWEEP = tuple((d, *c) for d in (True, False) for c in (
    (32, 128, 1, 4, 3), (32, 128, 2, 4, 3), (32, 128, 4, 4, 3), (64, 128, 1, 4, 3), (64, 128, 2, 4, 3),
    (64, 128, 4, 4, 3), (32, 256, 2, 4, 3), (32, 128, 2, 8, 3), (64, 128, 1, 8, 3), (128, 128, 1, 8, 3),
    (128, 128, 2, 4, 3), (16, 128, 2, 4, 3)))




def _weights(n: int, k: int, copies: int, g: torch.Generator):
    """``copies`` distinct (Ŵ BF16, PackedFP4) pairs of one random weight shape."""
    from fp4w_gemm import PackedFP4

    from minite_kernels.backends.triton.quantize import dequantize_nvfp4_triton, quantize_nvfp4_triton

    out = []
    for _ in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        q = quantize_nvfp4_triton(w, per_token=False)
        pk = PackedFP4.empty(n, k, "cuda")
        pk.copy_rows_(0, q.data, q.scales, q.amax)
        out.append((dequantize_nvfp4_triton(q.data, q.scales, q.amax, per_token=False, dtype=torch.bfloat16), pk))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="8,16,32,64")
    p.add_argument("--model", default="qwen3-0.6b", choices=sorted(SHAPES), help="whose layer shapes")
    p.add_argument("--sweep", action="store_true", help="also time the launch configurations of SWEEP")
    p.add_argument("--sweep-batches", default="64", help="the batches --sweep runs at")
    p.add_argument("--rep", type=int, default=50, help="milliseconds of replays per timing")
    p.add_argument("--cold-mb", type=int, default=160, help="distinct weight bytes per graph (BF16 copies)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    a = p.parse_args()
    from fp4w_gemm import fp4w_linear  # this script's folder is on sys.path when it runs

    def emit(rec: dict) -> None:
        line = json.dumps(rec)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")

    g = torch.Generator(device="cuda").manual_seed(0)
    batches = [int(b) for b in a.batches.split(",")]
    sweep_batches = {int(b) for b in a.sweep_batches.split(",")}
    layer = {}
    shapes = SHAPES[a.model]
    for name, n, k in shapes:
        copies = max(2, -(-a.cold_mb * 2**20 // (2 * n * k)))
        layer[name] = ws = _weights(n, k, copies, g)
        for b in batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g)
            ref = torch.mm(x, ws[0][0].t())
            y = fp4w_linear(x, ws[0][1])
            rel = float((y.double() - ref.double()).norm() / ref.double().norm())
            rec = {"bench": "fp4w_shape", "model": a.model, "case": f"{name}_{n}x{k}_b{b}", "N": n, "K": k,
                   "batch": b, "copies": copies, "rel_l2": rel}
            rec["mm_us"] = gpu_us(lambda: [torch.mm(x, w.t()) for w, _ in ws], a.rep) / copies
            rec["fp4w_us"] = gpu_us(lambda: [fp4w_linear(x, pk) for _, pk in ws], a.rep) / copies
            rec["speedup"] = rec["mm_us"] / rec["fp4w_us"]
            if a.sweep and b in sweep_batches:
                sweep = {}
                for d, bn, bk, s, nw, st in SWEEP:
                    if k % (bk * s):
                        continue
                    kw = {"block_n": bn, "block_k": bk, "split": s, "num_warps": nw, "stages": st, "decode": d}
                    key = f"{'' if d else 'floor_'}n{bn}k{bk}s{s}w{nw}p{st}"
                    try:
                        sweep[key] = gpu_us(lambda: [fp4w_linear(x, pk, **kw) for _, pk in ws], a.rep) / copies
                    except Exception as e:  # a configuration that does not compile is reported, not fatal
                        sweep[key] = type(e).__name__
                best = min((v, c) for c, v in sweep.items() if isinstance(v, float) and not c.startswith("floor"))
                rec["sweep_us"], rec["best"], rec["best_us"] = sweep, best[1], best[0]
            emit(rec)
    for b in batches:
        xs = {name: torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g) for name, _, k in shapes}
        copies = min(len(ws) for ws in layer.values())

        def chain(fp4: bool, xs=xs, copies=copies):
            for c in range(copies):
                for name, _, _ in shapes:
                    w, pk = layer[name][c]
                    fp4w_linear(xs[name], pk) if fp4 else torch.mm(xs[name], w.t())

        rec = {"bench": "fp4w_layer", "model": a.model, "batch": b, "copies": copies}
        rec["mm_us"] = gpu_us(lambda: chain(False), a.rep) / copies
        rec["fp4w_us"] = gpu_us(lambda: chain(True), a.rep) / copies
        rec["speedup"] = rec["mm_us"] / rec["fp4w_us"]
        emit(rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

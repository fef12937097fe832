"""Packed-FP4 decode linear on the GPU: the fp16x2 pair kernel (``decode_linear_pairs``), the plane kernel
(``decode_linear``, the first formulation: ``scripts/decode_planes.py``) and cuBLAS BF16 ``F.linear``, side by
side at Qwen3-4B layer shapes (issue #6 item 3).
All times are microseconds of CUDA-graph replay (GPU time, median).

1. Per shape and batch (``decode_pairs``; skipped with ``--only-chain``): ``bf16_us``; ``pairs_us`` /
   ``planes_us``, what the backend runs (one activation-quantize launch plus the kernel; ``pairs_pdl_us``
   with programmatic dependent launch, ``pdl=True``, on sm_90+); ``pairs_gemv_us`` / ``planes_gemv_us``,
   the kernel alone. The
   same weight is read again and again here, and a packed weight of at most 14 MB stays in the H200's
   50 MB L2 while a BF16 one mostly does not: these per-linear numbers flatter the packed kernels. Each
   case checks the two kernels against each other (``rel_pairs_vs_planes``) and PDL on against off
   (``pdl_equal``). ``--sweep`` adds launch configurations.
2. Per batch, the whole block as one CUDA graph (``decode_pairs_chain``), in the model's launch order: q/k/v
   share one activation quantization, o one, gate/up one, down one (the backend quantizes a shared input
   once), and a small non-PDL kernel (``sep``, standing for the norm/attention/SiLU between the groups)
   before each group in both graphs, so that no PDL overlap crosses a group boundary the model does not
   have. Two copies of the block's weights are used in turn, so every weight comes from HBM, as in a model.
   ``speedup_chain = (bf16_chain_us - sep_us) / (pairs_chain_us - sep_us)`` (``sep_us``: the separators
   alone); ``speedup_chain_with_sep`` keeps them in. ``pairs_chain_prefetch_us`` /
   ``pairs_chain_noprefetch_us``: the default tiles with and without the register double buffer of the
   K loop (checked bit-identical first). ``--fused`` adds the block with q/k/v and gate/up
   concatenated into one weight each, for both (how vLLM and SGLang store them; cuBLAS is much faster on
   the fused shapes).
3. ``--cold-sweep``: per shape (fused ones included) and batch, cuBLAS and the pair kernel's launch
   configurations on weights streamed from HBM (128 MB of distinct weight copies per graph); keys
   ``{BLOCK_N}x{BLOCK_KB}w{warps}s{stages}``, or ``...r`` with the register double buffer.

    python scripts/bench_decode.py [--batches 1,2,4,8,16] [--only-chain] [--fused] [--sweep] [--cold-sweep]
        [--out decode.jsonl]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from timing import gpu_us  # scripts/ is on sys.path when run as a script

QWEN3_4B = (
    ("q_proj", 4096, 2560),
    ("k_proj", 1024, 2560),
    ("v_proj", 1024, 2560),
    ("o_proj", 2560, 4096),
    ("gate_proj", 9728, 2560),
    ("up_proj", 9728, 2560),
    ("down_proj", 2560, 9728),
)
#: (BLOCK_N, BLOCK_KB, warps, pipeline stages) tried by --sweep, at BLOCK_B = min(4, batch)
SWEEP = (
    (16, 32, 4, 1),
    (16, 32, 4, 2),
    (16, 32, 4, 3),
    (16, 32, 4, 4),
    (8, 32, 4, 3),
    (32, 32, 4, 3),
    (16, 64, 4, 2),
    (16, 16, 4, 4),
    (32, 32, 8, 3),
    (8, 64, 4, 2),
)




#: programmatic dependent launch can be timed here (sm_90+; set in main)
_PDL_OK = False
#: the block's linears grouped by shared input, in the model's order
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


#: the same block with q/k/v and gate/up concatenated into one weight each (how vLLM/SGLang store them)
FUSED_GROUPS = (("qkv_proj",), ("o_proj",), ("gate_up_proj",), ("down_proj",))


def _fuse(weights: dict) -> dict:
    """``weights`` plus ``qkv_proj`` and ``gate_up_proj``: BF16 and packed weights concatenated along N (the
    packed one keeps the first part's amax, so its values are for timing only)."""
    out = dict(weights)
    for fused, parts in (
        ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
        ("gate_up_proj", ("gate_proj", "up_proj")),
    ):
        w = torch.cat([weights[p][0] for p in parts])
        wd = torch.cat([weights[p][1][0] for p in parts])
        ws = torch.cat([weights[p][1][1] for p in parts])
        out[fused] = (w, (wd, ws, weights[parts[0]][1][2]))
    return out


def _chain(b: int, weights: dict, rep: int, g: torch.Generator, fused: bool = False) -> dict:
    """The Qwen3-4B block's 7 linears at batch ``b`` as one CUDA graph each way (see the module docstring),
    run on two copies of the block's weights in turn (so they come from HBM, not from the 50 MB L2), and
    reported per block."""
    from minite_kernels.backends.triton.decode import decode_linear_pairs, quantize_for_decode

    groups = FUSED_GROUPS if fused else GROUPS
    copies = (weights, {name: (w.clone(), tuple(t.clone() for t in p)) for name, (w, p) in weights.items()})
    ks = {name: w.shape[1] for name, (w, _) in weights.items()}
    xs = [torch.randn(b, ks[grp[0]], device="cuda", dtype=torch.bfloat16, generator=g) for grp in groups]
    sep_buf = torch.zeros(b, 2560, device="cuda", dtype=torch.bfloat16)

    def sep():
        sep_buf.add_(1.0)

    def bf16():
        for ws in copies:
            for x, grp in zip(xs, groups):
                sep()
                for name in grp:
                    F.linear(x, ws[name][0])

    def nvfp4(pdl, **kw):
        outs = []
        for ws in copies:
            for x, grp in zip(xs, groups):
                sep()
                o, xp = quantize_for_decode(x, pdl=pdl)
                for name in grp:
                    outs.append(decode_linear_pairs(xp, o.scales, o.amax, *ws[name][1], pdl=pdl, **kw))
        return outs

    same = all(torch.equal(a, c) for a, c in zip(nvfp4(False), nvfp4(True))) if _PDL_OK else None
    for pf in (False, True):  # the other K-loop buffering at the default tiles: same tiles, same bits
        alt = {"prefetch": pf, "stages": 1} if pf else {"prefetch": False}
        if not all(torch.equal(a, c) for a, c in zip(nvfp4(False), nvfp4(False, **alt))):
            raise AssertionError(f"prefetch={pf} changed the chain's result at batch {b}")
    tag = "fused_" if fused else ""
    rec = {
        "bench": "decode_pairs_chain",
        "case": f"qwen3_4b_block_{tag}chain_b{b}",
        "batch": b,
        "pdl_equal": same,
    }
    n = len(copies)
    rec["sep_us"] = gpu_us(lambda: [sep() for _ in range(n * len(groups))], rep) / n
    rec["bf16_chain_us"] = gpu_us(bf16, rep) / n
    rec["pairs_chain_us"] = gpu_us(lambda: nvfp4(False), rep) / n
    rec["pairs_chain_pdl_us"] = gpu_us(lambda: nvfp4(True), rep) / n if _PDL_OK else float("nan")
    rec["pairs_chain_prefetch_us"] = gpu_us(lambda: nvfp4(False, prefetch=True, stages=1), rep) / n
    rec["pairs_chain_noprefetch_us"] = gpu_us(lambda: nvfp4(False, prefetch=False), rep) / n
    net = rec["bf16_chain_us"] - rec["sep_us"]
    rec["speedup_chain"] = net / (rec["pairs_chain_us"] - rec["sep_us"])
    rec["speedup_chain_pdl"] = net / (rec["pairs_chain_pdl_us"] - rec["sep_us"])
    rec["speedup_chain_with_sep"] = rec["bf16_chain_us"] / rec["pairs_chain_us"]
    rec["speedup_chain_prefetch"] = net / (rec["pairs_chain_prefetch_us"] - rec["sep_us"])
    rec["speedup_chain_noprefetch"] = net / (rec["pairs_chain_noprefetch_us"] - rec["sep_us"])
    rec["target_speedup"] = 2.0
    return rec


#: (BLOCK_N, BLOCK_KB, warps, pipeline stages, register double buffer) tried by --cold-sweep
COLD_SWEEP = (
    (8, 64, 4, 2, False),
    (16, 32, 4, 1, False),
    (16, 32, 4, 3, False),
    (16, 64, 4, 2, False),
    (8, 64, 4, 3, False),
    (8, 128, 4, 2, False),
    (32, 32, 4, 3, False),
    (32, 64, 8, 2, False),
    (4, 128, 4, 2, False),
    (16, 32, 4, 1, True),
    (8, 64, 4, 1, True),
    (4, 128, 4, 1, True),
    (16, 64, 4, 1, True),
    (32, 32, 4, 1, True),
    (8, 32, 4, 1, True),
    (32, 32, 8, 1, True),
)
#: bytes of weights one cold measurement streams: 2.5x the H200's 50 MB L2, so no weight is re-read from L2
COLD_BYTES = 128 << 20


#: the cold sweep's shapes, fused first (v_proj and up_proj have k_proj's and gate_proj's shapes)
COLD_SHAPES = ("qkv_proj", "gate_up_proj", "o_proj", "down_proj", "q_proj", "k_proj", "gate_proj")


def _cold(fn_for_copy, copies: int, rep: int) -> float:
    """Microseconds per call of ``fn_for_copy(c)`` when ``copies`` different weights are used in turn in
    one graph (each weight leaves the L2 before it comes back)."""
    return gpu_us(lambda: [fn_for_copy(c) for c in range(copies)], rep) / copies


def _cold_sweep(weights: dict, batches, rep: int, g: torch.Generator, emit) -> None:
    """Per shape and batch: cuBLAS BF16 and the pair kernel's launch configurations on weights read from HBM
    (``COLD_BYTES`` of distinct weight copies per graph), not from the L2 that a repeated 14 MB weight
    stays in."""
    from minite_kernels.backends.triton.decode import decode_linear_pairs, quantize_for_decode

    for name in COLD_SHAPES:
        w, packed = weights[name]
        n, k = w.shape
        pbytes = n * k // 2 + n * k // 16
        cb = max(2, -(-COLD_BYTES // (2 * n * k)))
        cp = max(2, -(-COLD_BYTES // pbytes))
        ws_bf16 = [w] + [w.clone() for _ in range(cb - 1)]
        ws_fp4 = [packed] + [tuple(t.clone() for t in packed) for _ in range(cp - 1)]
        for b in batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g)
            q, xp = quantize_for_decode(x)
            rec = {"bench": "decode_pairs_cold", "case": f"{name}_{n}x{k}_b{b}", "batch": b, "N": n, "K": k}
            rec["bf16_cold_us"] = _cold(lambda c: F.linear(x, ws_bf16[c]), cb, rep)
            rec["pairs_cold_us"] = _cold(
                lambda c: decode_linear_pairs(xp, q.scales, q.amax, *ws_fp4[c], pdl=False), cp, rep
            )
            sweep = {}
            for bn, bkb, nw, st, pf in COLD_SWEEP:
                kw = {
                    "block_n": bn,
                    "block_kb": bkb,
                    "num_warps": nw,
                    "stages": st,
                    "prefetch": pf,
                    "pdl": False,
                }
                key = f"{bn}x{bkb}w{nw}{'r' if pf else f's{st}'}"
                try:
                    sweep[key] = _cold(
                        lambda c: decode_linear_pairs(xp, q.scales, q.amax, *ws_fp4[c], **kw), cp, rep
                    )
                except Exception as e:  # a configuration that does not compile is reported, not fatal
                    sweep[key] = type(e).__name__
            rec["pairs_cold_sweep_us"] = sweep
            best = min((v, c) for c, v in sweep.items() if isinstance(v, float))
            rec["best_config"], rec["best_us"] = best[1], best[0]
            rec["pairs_cold_TBps"] = pbytes / rec["pairs_cold_us"] / 1e6
            rec["best_TBps"] = pbytes / best[0] / 1e6
            rec["bf16_cold_TBps"] = 2 * n * k / rec["bf16_cold_us"] / 1e6
            rec["speedup_cold"] = rec["bf16_cold_us"] / rec["pairs_cold_us"]
            rec["speedup_cold_best"] = rec["bf16_cold_us"] / best[0]
            emit(rec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--rep", type=int, default=100)
    p.add_argument("--out", default=None)
    p.add_argument("--fused", action="store_true", help="also the chain with q/k/v and gate/up concatenated")
    p.add_argument("--only-chain", action="store_true", help="skip the per-linear cases (weights only)")
    p.add_argument("--cold-sweep", action="store_true", help="launch configurations on HBM-cold weights")
    args = p.parse_args()
    global _PDL_OK
    from minite_kernels.backends.triton import quantize_nvfp4_triton
    from minite_kernels.backends.triton._common import pdl_capable

    _PDL_OK = pdl_capable(torch.empty(0, device="cuda"))
    from decode_planes import decode_linear, quantize_planes  # the first formulation, the baseline

    from minite_kernels.backends.triton.decode import decode_linear_pairs, quantize_for_decode

    def emit(rec: dict) -> None:
        line = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()})
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(line + "\n")

    batches = [int(b) for b in args.batches.split(",")]
    totals: dict[tuple[int, str], float] = {}
    weights: dict[str, tuple] = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, n, k in QWEN3_4B:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        wd, ws, wa, *_ = quantize_nvfp4_triton(w, per_token=False, tile16=True)
        weights[name] = (w, (wd, ws, wa))
        for b in batches if not args.only_chain else ():
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g)
            qo, xpl = quantize_planes(x)
            qp, xpr = quantize_for_decode(x)

            def planes():
                o, xp = quantize_planes(x)
                return decode_linear(xp, o.amax, wd, ws, wa, x_perm=True)

            def pairs(pdl=None):
                o, xp = quantize_for_decode(x, pdl=pdl)
                return decode_linear_pairs(xp, o.scales, o.amax, wd, ws, wa, pdl=pdl)

            y_pl = decode_linear(xpl, qo.amax, wd, ws, wa, x_perm=True, out_dtype=torch.float32)
            y_pr = decode_linear_pairs(xpr, qp.scales, qp.amax, wd, ws, wa, out_dtype=torch.float32)
            rel = float((y_pr.double() - y_pl.double()).norm() / y_pl.double().norm())
            planes()
            pdl_equal = torch.equal(pairs(pdl=False), pairs(pdl=True)) if _PDL_OK else None
            torch.cuda.synchronize()
            rec = {
                "bench": "decode_pairs",
                "case": f"{name}_{n}x{k}_b{b}",
                "batch": b,
                "N": n,
                "K": k,
                "rel_pairs_vs_planes": rel,
                "pdl_equal": pdl_equal,
                "bf16_us": gpu_us(lambda: F.linear(x, w), args.rep),
                "planes_us": gpu_us(planes, args.rep),
                "pairs_us": gpu_us(pairs, args.rep),
                "pairs_pdl_us": gpu_us(lambda: pairs(pdl=True), args.rep) if _PDL_OK else float("nan"),
                "planes_gemv_us": gpu_us(lambda: decode_linear(xpl, qo.amax, wd, ws, wa, x_perm=True), args.rep),
                "pairs_gemv_us": gpu_us(
                    lambda: decode_linear_pairs(xpr, qp.scales, qp.amax, wd, ws, wa), args.rep
                ),
                "act_quant_pairs_us": gpu_us(lambda: quantize_for_decode(x), args.rep),
            }
            if args.sweep:
                sweep = {}
                for bn, bkb, nw, st in SWEEP:
                    kw = {"block_n": bn, "block_kb": bkb, "num_warps": nw, "stages": st}
                    try:
                        decode_linear_pairs(xpr, qp.scales, qp.amax, wd, ws, wa, **kw)
                        sweep[f"{bn}x{bkb}w{nw}s{st}"] = gpu_us(
                            lambda: decode_linear_pairs(xpr, qp.scales, qp.amax, wd, ws, wa, **kw), 40
                        )
                    except Exception as e:  # a configuration that does not compile is reported, not fatal
                        sweep[f"{bn}x{bkb}w{nw}s{st}"] = type(e).__name__
                rec["pairs_gemv_sweep_us"] = sweep
            wbytes = n * k // 2 + n * k // 16
            rec["pairs_weight_GBps"] = wbytes / rec["pairs_gemv_us"] / 1e3
            rec["speedup_pairs"] = rec["bf16_us"] / rec["pairs_us"]
            rec["speedup_planes"] = rec["bf16_us"] / rec["planes_us"]
            rec["target_speedup"] = 2.0
            emit(rec)
            for key in ("bf16_us", "planes_us", "pairs_us", "pairs_pdl_us", "pairs_gemv_us"):
                totals[(b, key)] = totals.get((b, key), 0.0) + rec[key]
    if args.cold_sweep:
        _cold_sweep(_fuse(weights), batches, 10, g, emit)
        return 0
    for b in batches:
        emit(_chain(b, weights, args.rep, g))
    if args.fused:
        fused = _fuse(weights)
        for b in batches:
            emit(_chain(b, fused, args.rep, g, fused=True))
    if args.only_chain:
        return 0
    for b in batches:
        rec = {"bench": "decode_pairs_block", "case": f"qwen3_4b_block_b{b}", "batch": b}
        rec.update({key: v for (bb, key), v in totals.items() if bb == b})
        rec["speedup_pairs"] = rec["bf16_us"] / rec["pairs_us"]
        rec["speedup_pairs_pdl"] = rec["bf16_us"] / rec["pairs_pdl_us"]
        rec["speedup_planes"] = rec["bf16_us"] / rec["planes_us"]
        rec["speedup_pairs_gemv_only"] = rec["bf16_us"] / rec["pairs_gemv_us"]
        emit(rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

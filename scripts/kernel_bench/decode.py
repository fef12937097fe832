"""Section ``decode``: the packed-FP4 pair decode linear at decode batch sizes against BF16 ``F.linear`` and the
first formulation (``scripts/decode_planes.py``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from kernel_bench.common import (
    QWEN3_4B,
    bench,
    emit,
    layer_shapes,
    section,
)


@section("decode")
def bench_decode(args):
    from decode_planes import decode_linear, quantize_planes  # the first formulation, the baseline

    from minite_kernels.backends.triton import decode_linear_pairs, quantize_for_decode, quantize_nvfp4_triton

    totals: dict[tuple, float] = {}
    for name, n, k in layer_shapes(QWEN3_4B):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wd, ws, wa, *_ = quantize_nvfp4_triton(w, per_token=False, tile16=True)
        for b in args.decode_batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)

            def ours():  # what the backend runs (MINITE_TRITON_DECODE=auto): one quantize launch + the pair kernel
                o, xp_ = quantize_for_decode(x)
                return decode_linear_pairs(xp_, o.scales, o.amax, wd, ws, wa)

            _d, _s, xa, _nf, xqs, _dq = quantize_nvfp4_triton(
                x, per_token=True, write_packed=False, write_qs=True
            )
            xp = quantize_planes(x)[1]  # fp16, plane-major
            ours()  # compile + allocate the split-K workspace outside graph capture
            decode_linear(xp, xa, wd, ws, wa, x_perm=True)
            decode_linear(xp, xa, wd, ws, wa, x_perm=True, one_dot=True)
            torch.cuda.synchronize()
            t_b = bench(lambda: F.linear(x, w), graph=True)
            t_o = bench(ours, graph=True)
            t_g = bench(lambda: decode_linear(xqs, xa, wd, ws, wa), graph=True)
            t_xp = bench(lambda: decode_linear(xp, xa, wd, ws, wa, x_perm=True), graph=True)
            t_od = bench(lambda: decode_linear(xp, xa, wd, ws, wa, x_perm=True, one_dot=True), graph=True)
            t_q = bench(lambda: quantize_planes(x), graph=True)
            sweep = {}
            if args.decode_sweep:
                if b <= 4:
                    cfgs = ((8, 64, 4), (16, 64, 4), (16, 32, 4), (32, 32, 4), (16, 128, 8), (32, 64, 8))
                else:
                    cfgs = ((64, 16, 4), (64, 32, 4), (128, 32, 4), (128, 16, 8))
                for bn_, bkw_, nw_ in cfgs:
                    for perm in (0, 1, 2) if b > 4 else (0, 1):
                        key = f"{bn_}x{bkw_}w{nw_}" + ("", "p", "o")[perm]
                        xin, xa_ = (xp, xa) if perm else (xqs, xa)
                        kw_ = dict(
                            block_n=bn_, block_kw=bkw_, num_warps=nw_, x_perm=perm > 0, one_dot=perm == 2
                        )
                        try:
                            decode_linear(xin, xa_, wd, ws, wa, **kw_)
                            sweep[key] = 1e3 * bench(
                                lambda: decode_linear(xin, xa_, wd, ws, wa, **kw_), graph=True, rep=40
                            )
                        except Exception as e:  # a config that does not compile is reported, not fatal
                            sweep[key] = f"{type(e).__name__}"
            wbytes_bf16 = 2 * n * k
            wbytes_fp4 = n * k // 2 + n * k // 16
            emit(
                {
                    "bench": "decode",
                    "case": f"{name}_{n}x{k}_b{b}",
                    "batch": b,
                    "N": n,
                    "K": k,
                    "bf16_us": 1e3 * t_b,
                    "ours_us": 1e3 * t_o,
                    "act_quant_us": 1e3 * t_q,
                    "gemv_us": 1e3 * t_g,
                    "gemv_xperm_us": 1e3 * t_xp,
                    "gemv_xperm_onedot_us": 1e3 * t_od,
                    "speedup": t_b / t_o,
                    "speedup_gemv_only": t_b / t_xp,
                    "bf16_weight_GBps": wbytes_bf16 / t_b / 1e6,
                    "ours_weight_GBps": wbytes_fp4 / t_xp / 1e6,
                    "gemv_sweep_us": sweep,
                    "target_speedup": 2.0,
                }
            )
            for key, t in (
                ("bf16", t_b),
                ("ours", t_o),
                ("gemv", t_g),
                ("xperm", t_xp),
                ("onedot", t_od),
            ):
                totals[(b, key)] = totals.get((b, key), 0.0) + t
        w = wd = ws = None
    for b in args.decode_batches:
        emit(
            {
                "bench": "decode_layer_total",
                "case": f"qwen3_4b_block_b{b}",
                "batch": b,
                "bf16_us": 1e3 * totals[(b, "bf16")],
                "ours_us": 1e3 * totals[(b, "ours")],
                "gemv_us": 1e3 * totals[(b, "gemv")],
                "gemv_xperm_us": 1e3 * totals[(b, "xperm")],
                "gemv_xperm_onedot_us": 1e3 * totals[(b, "onedot")],
                "speedup": totals[(b, "bf16")] / totals[(b, "ours")],
                "speedup_gemv_only": totals[(b, "bf16")] / totals[(b, "xperm")],
                "target_speedup": 2.0,
            }
        )

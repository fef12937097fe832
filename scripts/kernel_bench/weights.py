"""Sections ``weight_sync`` (re-quantize every linear of a Qwen3-1.7B-shaped model) and ``optim`` (AdamW that
records the amax, and the weight sync it feeds)."""
from __future__ import annotations

import time

import torch
from kernel_bench.common import (
    bench,
    emit,
    free,
    measured_copy_gbps,
    profile_step,
    qwen3_1p7b_weights,
    section,
)


@section("weight_sync")
def bench_weight_sync(args):
    from minite_kernels.backends.triton import WeightRequantizer
    from minite_kernels.formats import quantize_nvfp4

    copy_gbps = measured_copy_gbps(args)
    ws = qwen3_1p7b_weights()
    nparam = sum(w.numel() for w in ws)
    for graph in (True, False):
        for write_qs in (False, True):
            sync = WeightRequantizer(ws, cuda_graph=graph, write_qs=write_qs)
            sync.sync()
            ms = bench(sync.sync, rep=200)
            useful = nparam * (2 + 0.5625 + (2 if write_qs else 0))
            traffic = nparam * (4 + 0.5625 + (2 if write_qs else 0))
            emit(
                {
                    "bench": "weight_sync",
                    "case": f"qwen3_1.7b_linears_graph{int(graph)}_qs{int(write_qs)}",
                    "params_B": nparam / 1e9,
                    "num_weights": len(ws),
                    "ms": ms,
                    "ms_per_B_params": ms / (nparam / 1e9),
                    "frac_copy_bw_useful": useful / ms / 1e6 / copy_gbps,
                    "frac_copy_bw_traffic": traffic / ms / 1e6 / copy_gbps,
                    "copy_GBps": copy_gbps,
                    "target_frac": 0.8,
                }
            )
            del sync
            free()
    # the emulated torch reference, one pass over all weights
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for w in ws:
        quantize_nvfp4(w, tile=(16, 16))
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0)
    emit(
        {
            "bench": "weight_sync",
            "case": "emulated_torch_reference",
            "params_B": nparam / 1e9,
            "ms": ms,
            "ms_per_B_params": ms / (nparam / 1e9),
        }
    )


@section("optim")
def bench_optim(args):
    """AdamW on the 196 Qwen3-1.7B linears (bf16 params, grads, states), and weight sync fed by its amaxes.

    Optimizer: torch's fused AdamW, the same plus a separate amax read per weight (what a two-pass sync costs
    on top), and minite_kernels.optim.AdamW (amax recorded in the update pass). Weight sync: the requantizer
    with its own amax pass vs ``amax_from=`` the optimizer (one read per weight)."""
    from minite_kernels.backends.triton import WeightRequantizer
    from minite_kernels.optim import AdamW

    copy_gbps = measured_copy_gbps(args)
    params = [torch.nn.Parameter(w) for w in qwen3_1p7b_weights()]
    nparam = sum(p.numel() for p in params)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    hp = dict(lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ours = AdamW(params, **hp)
    ours.step()
    torch_fused = torch.optim.AdamW(params, **hp, fused=True)
    torch_fused.step()

    def torch_then_amax():
        torch_fused.step()
        return [p.detach().abs().amax() for p in params]

    times = {
        "torch_fused": bench(torch_fused.step, rep=100),
        "torch_fused_then_amax": bench(torch_then_amax, rep=100),
        "ours_with_amax": bench(ours.step, rep=100),
    }
    profile_step(torch_fused.step, "optim_torch_fused")
    profile_step(ours.step, "optim_ours_with_amax")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        ours.step()  # host time: returns once the launch is queued
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 10
    host = []
    for _ in range(10):
        t0 = time.perf_counter()
        ours.step()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    emit(
        {"bench": "optim_adamw", "case": "ours_host", "host_ms": 1e3 * sorted(host)[5], "wall_ms": 1e3 * wall}
    )
    if getattr(args, "optim_sweep", False):
        from minite_kernels.backends.triton import adamw as K

        default = (K.BLOCK, K.WARPS, K.ITERS)
        for block, warps in ((512, 4), (1024, 8), (2048, 16), (512, 8), (1024, 16), (4096, 8)):
            for iters in (1, 4, 16):
                K.BLOCK, K.WARPS, K.ITERS = block, warps, iters
                ours._pmaps.clear()
                ms = bench(ours.step, rep=60)
                emit(
                    {
                        "bench": "optim_sweep",
                        "block": block,
                        "warps": warps,
                        "iters": iters,
                        "ms": ms,
                        "frac_copy_bw": nparam * 14 / ms / 1e6 / copy_gbps,
                    }
                )
        K.BLOCK, K.WARPS, K.ITERS = default
        ours._pmaps.clear()
        from minite_kernels.backends.triton import quantize as Q

        saved = dict(Q.BF16_CONFIG)
        for nb, warps in ((2, 1), (4, 1), (8, 1), (4, 2), (8, 2), (16, 2), (16, 4), (32, 4), (32, 8)):
            Q.BF16_CONFIG.update(tile16_nb=nb, tile16_warps=warps)
            rq = WeightRequantizer(params, amax_from=ours)
            rq.sync()
            ms = bench(rq.sync, rep=100)
            emit(
                {
                    "bench": "sync_quant_sweep",
                    "tile16_nb": nb,
                    "warps": warps,
                    "amax_given": rq.amax_given,
                    "ms": ms,
                    "frac_copy_bw": nparam * 2.5625 / ms / 1e6 / copy_gbps,
                }
            )
            del rq
        Q.BF16_CONFIG.clear()
        Q.BF16_CONFIG.update(saved)
    step_bytes = nparam * 2 * 7  # read p, g, m, v; write p, m, v (bf16)
    for case, ms in times.items():
        emit(
            {
                "bench": "optim_adamw",
                "case": case,
                "params_B": nparam / 1e9,
                "ms": ms,
                "ratio_vs_torch_fused": ms / times["torch_fused"],
                "frac_copy_bw": step_bytes / ms / 1e6 / copy_gbps,
            }
        )
    ours.step()  # the weights now hold what ours wrote, with current amaxes
    own = WeightRequantizer(params)
    fed = WeightRequantizer(params, amax_from=ours)
    a, b = own.sync(), fed.sync()
    same = all(torch.equal(x.data, y.data) and torch.equal(x.amax, y.amax) for x, y in zip(a, b))
    for name, rq, traffic in (("own_amax_pass", own, 4.5625), ("amax_from_optimizer", fed, 2.5625)):
        ms = bench(rq.sync, rep=200)
        emit(
            {
                "bench": "weight_sync",
                "case": f"qwen3_1.7b_linears_{name}",
                "amax_given": rq.amax_given,
                "bytes_equal_to_own_amax_pass": same,
                "params_B": nparam / 1e9,
                "ms": ms,
                "ms_per_B_params": ms / (nparam / 1e9),
                "frac_copy_bw_useful": nparam * 2.5625 / ms / 1e6 / copy_gbps,
                "frac_copy_bw_traffic": nparam * traffic / ms / 1e6 / copy_gbps,
                "copy_GBps": copy_gbps,
                "target_frac": 0.8,
            }
        )

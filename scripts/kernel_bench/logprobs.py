"""Section ``logprobs``: fused log-probs + entropy over a 151,936-token vocabulary: peak memory and time against
the naive log-softmax."""
from __future__ import annotations

import torch
from kernel_bench.common import (
    bench,
    emit,
    free,
    section,
)


@section("logprobs")
def bench_logprobs(args):
    from minite_kernels.backends.triton import logprobs_and_entropy, logprobs_and_entropy_torch

    t_tok, h, v = args.lp_tokens, 2560, 151936
    g = torch.Generator(device="cuda").manual_seed(0)
    hid = torch.randn(t_tok, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    ids = torch.randint(0, v, (t_tok,), device="cuda", generator=g)

    def naive(hh, ww):
        logits = (hh @ ww.t()).float()
        logp_all = torch.log_softmax(logits, dim=-1)
        lp = logp_all.gather(-1, ids[:, None]).squeeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        return lp, ent

    def measure(fn, rep=5):
        free()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        free()
        ms = bench(fn, rep=rep * 100, warmup=100)
        return peak, ms

    fns = {
        "naive": lambda: naive(hid, w),
        "chunked_torch": lambda: logprobs_and_entropy_torch(hid, w, ids, chunk=4096),
        "fused_triton": lambda: logprobs_and_entropy(hid, w, ids, chunk=4096),
    }
    with torch.no_grad():
        res = {k: measure(f) for k, f in fns.items()}
        lp_n, ent_n = naive(hid, w)
        lp_f, ent_f = logprobs_and_entropy(hid, w, ids, chunk=4096)
        err = {
            "max_abs_logp_diff": (lp_n - lp_f).abs().max().item(),
            "max_abs_entropy_diff": (ent_n - ent_f).abs().max().item(),
        }
        del lp_n, ent_n, lp_f, ent_f
    for k, (peak, ms) in res.items():
        emit(
            {
                "bench": "logprobs_fwd",
                "case": k,
                "tokens": t_tok,
                "vocab": v,
                "hidden": h,
                "peak_extra_GB": peak / 1e9,
                "ms": ms,
                "mem_ratio_vs_naive": peak / res["naive"][0],
                "time_ratio_vs_naive": ms / res["naive"][1],
                "target_mem_ratio": 0.25,
                **(err if k == "fused_triton" else {}),
            }
        )
    # forward + backward (grad w.r.t. hidden and lm_head)
    hid_g = hid.clone().requires_grad_()
    w_g = w.clone().requires_grad_()
    glp = torch.randn(t_tok, device="cuda")

    def fb(fn):
        def run():
            lp, ent = fn()
            ((lp * glp).sum() + 0.01 * ent.sum()).backward()
            hid_g.grad = None
            w_g.grad = None

        return run

    fb_fns = {
        "naive": fb(lambda: naive(hid_g, w_g)),
        "fused_triton": fb(lambda: logprobs_and_entropy(hid_g, w_g, ids, chunk=4096)),
    }
    res = {}
    for k, f in fb_fns.items():
        try:
            res[k] = measure(f, rep=3)
        except torch.OutOfMemoryError as e:
            emit({"bench": "logprobs_fwd_bwd", "case": k, "error": f"OOM: {str(e)[:200]}"})
    for k, (peak, ms) in res.items():
        rec = {
            "bench": "logprobs_fwd_bwd",
            "case": k,
            "tokens": t_tok,
            "vocab": v,
            "peak_extra_GB": peak / 1e9,
            "ms": ms,
        }
        if "naive" in res:
            rec.update(mem_ratio_vs_naive=peak / res["naive"][0], time_ratio_vs_naive=ms / res["naive"][1])
        emit(rec)

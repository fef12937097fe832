"""Section ``model``: forward + backward of a random Qwen3-1.7B-shaped model, bf16 against the NVFP4 recipes;
interleaved rounds, host and device profiles."""
from __future__ import annotations

import copy
import sys
import time

import torch
from kernel_bench.common import (
    QWEN3_1P7B,
    bench,
    emit,
    free,
    profile_step,
    section,
)

from minite_kernels.options import options, set_env_option, set_options


@section("model")
def bench_model(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from minite_kernels import quantize_model

    c = QWEN3_1P7B
    cfg = Qwen3Config(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        intermediate_size=c["inter"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        head_dim=128,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    base.train()
    ids = torch.randint(0, c["vocab"], (1, args.seq), device="cuda")

    def step(model):
        def run():
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            for p in model.parameters():
                p.grad = None

        return run

    if args.host_profile:
        _host_profile(base, step)
        return
    if args.model_rounds > 1:
        _model_interleaved(base, step, args)
        if args.profile:  # GPU kernel time vs wall time of one step each (host- or GPU-bound?)
            profile_step(step(base), "model_bf16")
            m = copy.deepcopy(base)
            quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="triton")
            profile_step(step(m), "model_nvfp4_per_token_bf16_bwd")
        return
    res = {}
    res["bf16"] = bench(step(base), rep=2000, warmup=500)
    if args.profile:
        profile_step(step(base), "model_bf16")
    emit({"bench": "model", "case": "bf16", "seq": args.seq, "ms": res["bf16"]})
    for recipe in ("nvfp4_per_token_bf16_bwd", "nvfp4_per_token"):
        m = copy.deepcopy(base)
        rep = quantize_model(m, recipe, backend="triton")
        ms = bench(step(m), rep=2000, warmup=500)
        res[recipe] = ms
        if args.profile and recipe == "nvfp4_per_token_bf16_bwd":
            profile_step(step(m), f"model_{recipe}")
        emit(
            {
                "bench": "model",
                "case": recipe,
                "seq": args.seq,
                "ms": ms,
                "ratio_vs_bf16": ms / res["bf16"],
                "quantized_linears": getattr(rep, "num_quantized", None),
                "target_ratio": 1.10 if recipe == "nvfp4_per_token_bf16_bwd" else None,
            }
        )
        del m
        free()
    if args.model_emulated:
        m = copy.deepcopy(base)
        quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="emulated")
        ms = bench(step(m), rep=3000, warmup=1000)
        emit(
            {
                "bench": "model",
                "case": "nvfp4_per_token_bf16_bwd_emulated",
                "seq": args.seq,
                "ms": ms,
                "ratio_vs_bf16": ms / res["bf16"],
            }
        )


def _model_interleaved(base, step, args) -> None:
    """bf16 and ``nvfp4_per_token_bf16_bwd`` under each value of one environment switch (``--model-variants``,
    default ``MINITE_SAVE_ACTIVATIONS=dequantized,packed``), timed in alternation for ``--model-rounds`` rounds
    in one process (bf16 first, the NVFP4 variants in an order rotated every round): a host-bound step varies
    between runs (and lent machines), so only same-process, interleaved medians are compared. Also one step's
    peak memory per case. With a tiny ``--seq`` the GPU work is negligible and the times are host time."""
    import statistics

    from minite_kernels import quantize_model

    m = copy.deepcopy(base)
    quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="triton")
    var, _, vals = args.model_variants.partition("=")
    variants = [v for v in vals.split(",") if v]
    default = options()

    def label(v: str) -> str:
        if var == "MINITE_SAVE_ACTIVATIONS":  # the names earlier results used
            return f"nvfp4_per_token_bf16_bwd_save_{v}"
        return f"nvfp4_per_token_bf16_bwd[{var}={v}]"

    times: dict[str, list[float]] = {"bf16": []}
    for r in range(args.model_rounds):
        times["bf16"].append(bench(step(base), rep=600, warmup=100))
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            set_env_option(var, v)
            times.setdefault(label(v), []).append(bench(step(m), rep=600, warmup=100))
    peak_gb = {}
    for case, model, v in [("bf16", base, variants[0])] + [(label(v), m, v) for v in variants]:
        set_env_option(var, v)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(model)()
        torch.cuda.synchronize()
        peak_gb[case] = torch.cuda.max_memory_allocated() / 1e9
    set_options(**default.to_dict())
    ref = statistics.median(times["bf16"])
    for case, ts in times.items():
        med = statistics.median(ts)
        emit(
            {
                "bench": "model_interleaved",
                "case": case,
                "seq": args.seq,
                "rounds": args.model_rounds,
                "ms_median": med,
                "ms_rounds": [round(t, 2) for t in ts],
                "ratio_vs_bf16": med / ref,
                "peak_GB": peak_gb[case],
                "target_ratio": None if case == "bf16" else 1.10,
            }
        )
    del m
    free()


def _host_profile(base, step) -> None:
    """Where the host time of a step goes (run with a tiny ``--seq`` so the GPU never waits on it): per case,
    Python calls per step and the cProfile top functions, then the torch profiler's per-op host time, on
    stderr; one JSON line per case with the host ms per step and the Python call count."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from minite_kernels import quantize_model

    m = copy.deepcopy(base)
    quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="triton")
    for name, model in (("bf16", base), ("nvfp4_per_token_bf16_bwd", m)):
        run = step(model)
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            run()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 10 * 1e3
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            run()
        prof.disable()
        torch.cuda.synchronize()
        st = pstats.Stats(prof, stream=sys.stderr)
        print(f"--- {name}: cProfile of 5 steps", file=sys.stderr)
        st.sort_stats("tottime").print_stats(30)
        with profile(activities=[ProfilerActivity.CPU]) as tp:
            run()
            torch.cuda.synchronize()
        print(f"--- {name}: torch profiler, one step", file=sys.stderr)
        print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), file=sys.stderr)
        emit(
            {
                "bench": "host_profile",
                "case": name,
                "ms_per_step": ms,
                "python_calls_per_step": st.total_calls / 5,
            }
        )

"""What every section of ``scripts/bench_kernels.py`` shares: the model shapes, the JSON-line output, the
section wrapper (a failing section prints its error and lets the others run) and the copy-bandwidth ceiling."""
from __future__ import annotations

import gc
import json
import time
import traceback

import torch
from timing import gpu_ms

RESULTS: list[dict] = []
OUT_PATH: str | None = None

QWEN3_4B = dict(hidden=2560, inter=9728, q=4096, kv=1024)
QWEN3_1P7B = dict(hidden=2048, inter=6144, q=2048, kv=1024, layers=28, heads=16, kv_heads=8, vocab=151936)


def layer_shapes(cfg: dict) -> list[tuple[str, int, int]]:
    """(name, N=out_features, K=in_features) of one transformer block's linears."""
    h, i, q, kv = cfg["hidden"], cfg["inter"], cfg["q"], cfg["kv"]
    return [
        ("q_proj", q, h),
        ("k_proj", kv, h),
        ("v_proj", kv, h),
        ("o_proj", h, q),
        ("gate_proj", i, h),
        ("up_proj", i, h),
        ("down_proj", h, i),
    ]


#: linears whose input another linear of the block already quantized (q/k/v, gate/up)
SHARES_INPUT = ("k_proj", "v_proj", "up_proj")


def set_out(path: str | None) -> None:
    """Also append every JSON line to ``path``."""
    global OUT_PATH
    OUT_PATH = path


def emit(rec: dict) -> None:
    rec = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.items()}
    RESULTS.append(rec)
    line = json.dumps(rec)
    print(line, flush=True)
    if OUT_PATH:
        with open(OUT_PATH, "a") as fh:
            fh.write(line + "\n")


bench = gpu_ms  # median milliseconds of one call (graph=True: replayed from a CUDA graph)


def free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def section(name):
    def deco(fn):
        def run(args):
            t0 = time.time()
            try:
                fn(args)
            except Exception as e:  # a failing section must not hide the others
                emit({"bench": name, "case": "error", "error": f"{type(e).__name__}: {e}"[:800]})
                traceback.print_exc()
            finally:
                free()
                print(f"# section {name} took {time.time() - t0:.1f}s", flush=True)

        run.__name__ = name
        return run

    return deco



def measured_copy_gbps(args) -> float:
    """The 8192x8192 bf16 device copy's bandwidth (GB/s), measured once per run."""
    if getattr(args, "copy_gbps", None) is None:
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        args.copy_gbps = 4 * x.numel() / bench(lambda: y.copy_(x)) / 1e6
    return args.copy_gbps



def qwen3_1p7b_weights(device="cuda") -> list[torch.Tensor]:
    """Random bf16 weights of every linear of a Qwen3-1.7B-shaped model (196 matrices, 1.41 B values)."""
    ws = []
    for _ in range(QWEN3_1P7B["layers"]):
        for _name, n, k in layer_shapes(QWEN3_1P7B):
            ws.append(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
    return ws


def profile_step(fn, name: str) -> None:
    """One profiled step: wall time vs summed GPU kernel time (host-bound when wall >> GPU), top kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    # kernels only (device-side events, no GPU user annotations): anything else would count a kernel again
    events = [e for e in prof.key_averages()
              if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    gpu_us = sum(e.self_device_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:12]
    emit(
        {
            "bench": "profile",
            "case": name,
            "wall_ms": 1e3 * wall,
            "gpu_kernel_ms": gpu_us / 1e3,
            "gpu_busy_frac": gpu_us / 1e3 / (1e3 * wall),
            "top_gpu": [
                [e.key[:60], round(getattr(e, "self_device_time_total", 0) / 1e3, 3), e.count] for e in top
            ],
        }
    )

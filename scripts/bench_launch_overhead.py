"""Host cost of one activation quantization on CUDA (issue #6).

The model step is host-bound, so a kernel that is faster on the GPU can still make the step slower if its
launch costs more Python. This times, on the host only (a tiny input, so the GPU never holds the loop back),
microseconds per call of:

  kernel_out      ``quantize_nvfp4_triton(..., out=preallocated)``: the Triton launch and its argument set-up
  kernel_alloc    the same with its outputs allocated per call
  backend         ``TritonBackend.quantize``: what the module calls (cache check, kernel, operand object)
  torch_add       ``x.add_(0)``: one ATen launch, for scale

each with ``MINITE_TRITON_LAUNCH=cached`` (the default, ``launcher.py``) and ``jit`` (``JITFunction.run``
every call), alternating over ``--rounds`` rounds (best per mode), then the cProfile top functions of the
backend call.

    python scripts/bench_launch_overhead.py
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import torch

from minite_kernels.backends.triton import quantize as Q
from minite_kernels.backends.triton.backend import TritonBackend
from minite_kernels.options import set_options
from minite_kernels.recipes import resolve_recipe


def per_call_us(fn, n: int = 2000, repeats: int = 5) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    x = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16)
    spec = resolve_recipe("nvfp4_per_token_bf16_bwd")[0].fprop.a
    be = TritonBackend("cuda")
    out = Q.quantize_nvfp4_triton(x, per_token=True, write_deq=True)

    def backend_call():
        be.clear_cache()
        return be.quantize(x, spec)

    cases = {
        "kernel_out": lambda: Q.quantize_nvfp4_triton(x, per_token=True, write_deq=True, out=out),
        "kernel_alloc": lambda: Q.quantize_nvfp4_triton(x, per_token=True, write_deq=True),
        "backend": backend_call,
        "torch_add": lambda: x.add_(0),
    }
    res: dict = {}
    for r in range(args.rounds):
        for mode in ("cached", "jit") if r % 2 == 0 else ("jit", "cached"):
            set_options(launch=mode)
            for name, fn in cases.items():
                us = per_call_us(fn, n=1000, repeats=3)
                res.setdefault(mode, {})[name] = min(us, res.get(mode, {}).get(name, float("inf")))
    set_options(launch="cached")
    res["jit_over_cached_us"] = {n: res["jit"][n] - res["cached"][n] for n in cases}
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        backend_call()
    prof.disable()
    torch.cuda.synchronize()
    print("--- cProfile, 500 backend calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    print(json.dumps({"bench": "launch_overhead", "shape": list(x.shape), "us_per_call": res}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

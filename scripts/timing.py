"""Timing for the benchmark scripts, so that every script measures the same way.

- :func:`gpu_ms`: the median milliseconds of one call of ``fn`` on the GPU, by Triton's ``do_bench`` (CUDA events,
  L2 flushed between repetitions) or, with ``graph=True``, by ``do_bench_cudagraph``: the calls are captured in a
  CUDA graph and replayed, so that kernels of a few microseconds are timed without their launch cost.
- :func:`gpu_us`: the same with ``graph=True``, in microseconds, for the decode-sized kernels.
- :func:`interleaved_ms`: several candidates timed one call each in turn, so that a load change on a shared machine
  hits all of them alike (CUDA events on a GPU, ``perf_counter`` on the CPU).

    from timing import gpu_us        # scripts/ is on sys.path when a script runs
    us = gpu_us(lambda: torch.mm(x, w.t()), rep=200)
"""
from __future__ import annotations

import time


def gpu_ms(fn, *, graph: bool = False, rep: int = 200, warmup: int = 25) -> float:
    """Median milliseconds of one call of ``fn`` (``rep`` and ``warmup`` in milliseconds, as Triton takes them)."""
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def gpu_us(fn, rep: int = 200) -> float:
    """Median microseconds of one call of ``fn``, replayed from a CUDA graph."""
    return 1e3 * gpu_ms(fn, graph=True, rep=rep)


def interleaved_ms(cands: dict, *, iters: int, warmup: int, device: str) -> dict[str, list[float]]:
    """Warm up every candidate, then time one call of each in turn, ``iters`` times: ``{name: [ms per call]}``."""
    import torch

    cuda = device.startswith("cuda")
    for fn in cands.values():
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(iters):
        for name, fn in cands.items():
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                samples[name].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t0) * 1e3)
    return samples

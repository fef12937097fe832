"""Kernel tables for the benchmark scripts: run a function under torch.profiler and summarise where the time went.

On CUDA the table lists GPU time per kernel name and the GPU-busy fraction of the wall time (busy < 1: the host,
or synchronisation, holds the GPU back). On CPU it lists the operators' self CPU time, so the same call works in
the CPU smoke tests.

    from profile_table import profiled
    out, summary = profiled(device, fn, "runs/prof", "rollout_bf16")   # writes runs/prof/profile_rollout_bf16.json
"""
from __future__ import annotations

import json
import pathlib
import time


def kernel_rows(events, cuda: bool) -> list[dict]:
    """``[{kernel, calls, ms}]`` of a profile's averaged events: on CUDA the kernels, by device time. A GPU user
    annotation (``Optimizer.step#AdamW.step``, a ``record_function`` span) also has a CUDA device type, and its time
    is that of the kernels inside it, so it is left out; counting it would count those kernels twice. On the CPU
    every operator, by self time (annotations included: self time counts nothing twice)."""
    import torch

    rows = []
    for e in events:
        if cuda:
            us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            keep = e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        else:
            us, keep = e.self_cpu_time_total, True
        if keep and us:
            rows.append({"kernel": e.key[:120], "calls": e.count, "ms": us / 1e3})
    return rows


def profiled(dev, fn, out_dir: str | pathlib.Path | None, tag: str, *, top: int = 40):
    """``(fn(), summary)``: summary = ``{"wall_s", "busy_s", "busy_frac", "kernels": [{kernel, calls, ms}]}``
    (GPU kernels on CUDA, CPU operators by self time elsewhere); also written to ``out_dir/profile_<tag>.json``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t0
    rows = kernel_rows(prof.key_averages(), cuda)
    rows.sort(key=lambda r: -r["ms"])
    busy = sum(r["ms"] for r in rows) / 1e3
    summary = {"wall_s": wall, "busy_s": busy, "busy_frac": busy / wall if wall else None,
               "what": "gpu kernels" if cuda else "cpu operators (self time)", "kernels": rows[:top]}
    if out_dir is not None:
        d = pathlib.Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"profile_{tag}.json").write_text(json.dumps(summary, indent=1))
    return out, summary

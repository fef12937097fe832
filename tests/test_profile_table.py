"""scripts/profile_table.py: which profiler events make the kernel table, and so the GPU-busy time."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from minite_test_support import load_script

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def _event(key, device_type, device_us, self_cpu_us=0.0, annotation=False):
    return SimpleNamespace(key=key, device_type=device_type, device_time_total=device_us,
                           self_cpu_time_total=self_cpu_us, count=1, is_user_annotation=annotation)


def test_cuda_rows_are_kernels_without_the_annotations_that_span_them():
    events = [
        _event("ampere_bf16_gemm", CUDA, 300.0),
        _event("elementwise_kernel", CUDA, 100.0),
        # the optimizer's record_function span on the GPU timeline: the two kernels above again
        _event("Optimizer.step#AdamW.step", CUDA, 400.0, annotation=True),
        _event("aten::mm", CPU, 0.0, self_cpu_us=50.0),
    ]
    rows = load_script("profile_table").kernel_rows(events, cuda=True)
    assert [(r["kernel"], r["ms"]) for r in rows] == [("ampere_bf16_gemm", 0.3), ("elementwise_kernel", 0.1)]


def test_cpu_rows_are_operators_by_self_time():
    events = [_event("aten::mm", CPU, 0.0, self_cpu_us=50.0),
              _event("Optimizer.step#AdamW.step", CPU, 0.0, self_cpu_us=20.0, annotation=True),
              _event("aten::empty", CPU, 0.0, self_cpu_us=0.0)]
    rows = load_script("profile_table").kernel_rows(events, cuda=False)
    assert [(r["kernel"], r["ms"]) for r in rows] == [("aten::mm", 0.05), ("Optimizer.step#AdamW.step", 0.02)]


@pytest.mark.gpu
def test_a_profiled_optimizer_step_counts_each_kernel_once():
    """On a real CUDA profile the AdamW step's ``record_function`` span is a CUDA-typed user annotation; the table
    leaves it out, so its total is the kernels' own device time."""
    from torch.profiler import ProfilerActivity, profile

    p = torch.nn.Parameter(torch.randn(1024, 1024, device="cuda"))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], foreach=True)
    opt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        opt.step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    spans = [e for e in events if e.device_type == CUDA and e.is_user_annotation]
    assert any(e.key.startswith("Optimizer.step") for e in spans), [e.key for e in spans]
    rows = load_script("profile_table").kernel_rows(events, cuda=True)
    assert rows and not any(r["kernel"].startswith("Optimizer.step") for r in rows)
    kernels_ms = sum(e.self_device_time_total for e in events
                     if e.device_type == CUDA and not e.is_user_annotation) / 1e3
    assert sum(r["ms"] for r in rows) == pytest.approx(kernels_ms, rel=1e-6)

"""The local engine's per-step GPU memory metrics (``trainers/engines/local/runtime.gpu_memory``)."""
from __future__ import annotations

import pytest
import torch

from trainers.engines.local.runtime import gpu_memory


def test_no_gpu_memory_metrics_off_cuda():
    assert gpu_memory(torch.device("cpu")) == {}


@pytest.mark.gpu
def test_gpu_memory_reports_the_steps_peak_then_restarts_it():
    dev = torch.device("cuda")
    gpu_memory(dev)  # restart the peak
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)  # 268 MB
    del x
    m = gpu_memory(dev)
    assert m["perf/gpu_peak_allocated_gb"] >= 0.268 and m["perf/gpu_reserved_gb"] >= 0.268  # freed, still cached
    assert gpu_memory(dev)["perf/gpu_peak_allocated_gb"] < m["perf/gpu_peak_allocated_gb"]  # the peak restarted

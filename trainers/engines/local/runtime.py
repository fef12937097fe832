"""The process and run directory around the engine: the environment echoed into ``run_meta.json``, torch's CPU
threads, device-synchronized timing of the step's phases, and updates of ``run_meta.json``."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import time
from typing import Any

import torch

from trainers.checkpoint import atomic_write_text

ENV_ECHO_PREFIXES = ("MINITE_", "WANDB_MODE", "WANDB_PROJECT", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES",
                     "VERL_", "OMP_NUM_THREADS", "DISABLE_BACKWARD_QUANT", "PYTORCH_")


def env_snapshot() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_ECHO_PREFIXES)}


def choose_cpu_threads(requested: int | None, device: torch.device) -> int:
    """Set torch's CPU threads: `requested`, else 1 on a CPU whose load already fills its cores, else torch's
    default. Returns the number in use."""
    if requested:
        torch.set_num_threads(requested)
    elif device.type == "cpu" and hasattr(os, "getloadavg"):
        cores = os.cpu_count() or 1
        if cores > 1 and os.getloadavg()[0] >= cores:
            print(f"[trainers] CPU busy (load {os.getloadavg()[0]:.1f} on {cores} cores): using 1 torch thread "
                  "(set trainer.cpu_threads to override)", file=sys.stderr)
            torch.set_num_threads(1)
    return torch.get_num_threads()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_memory(device: torch.device) -> dict[str, float]:
    """On CUDA, this step's peak of allocated memory and what the caching allocator holds now, in GB (what a
    study's ``gpu_gb_per_run`` must cover, less the CUDA context); else nothing. Restarts the peak counter."""
    if device.type != "cuda":
        return {}
    out = {"perf/gpu_peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9,
           "perf/gpu_reserved_gb": torch.cuda.memory_reserved(device) / 1e9}
    torch.cuda.reset_peak_memory_stats(device)
    return out


@contextlib.contextmanager
def timed(store: dict[str, float], key: str, device: torch.device):
    _sync(device)
    t0 = time.perf_counter()
    yield
    _sync(device)
    store[key] = store.get(key, 0.0) + time.perf_counter() - t0


def _write_meta(run_dir: pathlib.Path, updates: dict[str, Any]) -> None:
    path = run_dir / "run_meta.json"
    meta = json.loads(path.read_text()) if path.is_file() else {}
    meta.update(updates)
    atomic_write_text(path, json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")

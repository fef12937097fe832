"""The minite engine's own OS thread inside verl's actor worker.

verl's actor worker is a Ray asyncio actor, and Ray runs such an actor's synchronous calls (``__ray_call__``,
``init_model``) on boost fibers with small fixed stacks. The engine's first batches compile (``torch.compile``,
Triton) and capture CUDA graphs, whose native stacks are deep: on an H100 the worker died with SIGSEGV in
``boost::fibers::algo::round_robin::pick_next`` right after Inductor lowered the sampler's fused functions (the
trace of ray-project/ray#46086). So every engine call runs on one dedicated thread with an ordinary stack, on
the caller's CUDA device, and the caller waits for it; a call made on that thread runs directly. One thread also
keeps the CUDA graphs' capture and their replays on the same thread.
"""
from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
THREAD_NAME = "minite-engine"
_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        return _executor


def on_engine_thread() -> bool:
    return threading.current_thread().name.startswith(THREAD_NAME)


def run_on_engine_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the engine thread (directly when already there), on the caller's CUDA device and
    under its grad mode (both are per thread in torch); its exception is raised here."""
    if on_engine_thread():
        return fn(*args, **kwargs)
    import torch

    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    grad = torch.is_grad_enabled()

    def call() -> T:
        if device is not None:
            torch.cuda.set_device(device)
        with torch.set_grad_enabled(grad):
            return fn(*args, **kwargs)

    return _pool().submit(call).result()

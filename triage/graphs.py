"""Run a tensor function on inputs padded up to a shape bucket, replayed as a CUDA graph per bucket.

Why: the fused TRIAGE pass (``triage.fused``) is a few hundred small kernels. On a GPU the host launching
them is most of its cost, while the kernels themselves keep the GPU busy for a fraction of the wall time.
A CUDA graph replays the same kernels with one launch, so the pass costs its GPU time, and it computes what
the eager pass computes on the same (padded) inputs, bit for bit.

Shapes: a graph has fixed shapes, while a trainer's micro-batches vary in rows and response length. So each
input is copied into a zero-filled static buffer of its bucket's shape, and a graph is kept per bucket:

    bucket(n)  = the smallest m >= n with at most three significant bits (at most 25% padding):
                 1, 2, ..., 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ..., 256, 320, 384, 448, 512, 640, ...
    bucket(n, multiple) rounds that up to a multiple (e.g. of the segment lengths).

    Worked example: bucket(48) = 48 (110000), bucket(1000) = 1024, bucket(300, 128) = 384 (300 -> 320 -> 384).

The caller's function must give the padded positions no influence (the TRIAGE pass masks them out). Then its
results are those of an eager call on zero-padded inputs, whatever sizes were met before: the bits depend on
the input only, so a resumed run computes what the uninterrupted one did.

A bucket's first call runs eagerly on the padded buffers; its second call captures the graph, so a shape met
once costs no capture. Entries are kept least-recently-used, at most :data:`MAX_ENTRIES`; each graph holds its
own memory pool (about the eager pass's peak for its bucket).

The returned tensors are the graph's output buffers: the next call of the same bucket overwrites them. Use
them at once and keep only fresh tensors.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

#: buckets kept per cache (least recently used dropped first)
MAX_ENTRIES = 16


def bucket(n: int, multiple: int = 1) -> int:
    """Smallest ``m >= n`` with at most three significant bits, then rounded up to a multiple of ``multiple``."""
    if n < 1 or multiple < 1:
        raise ValueError(f"bucket needs n >= 1 and multiple >= 1, got n={n}, multiple={multiple}")
    step = 1 << max(0, (n - 1).bit_length() - 3)
    m = -(-n // step) * step
    return -(-m // multiple) * multiple


def usable(device: torch.device) -> bool:
    """Whether a graph may be captured and replayed here: on CUDA, outside ``torch.compile`` tracing and outside
    another stream capture (a caller capturing its whole step records the eager kernels instead)."""
    if device.type != "cuda":
        return False
    if torch.compiler.is_compiling():
        return False
    return not torch.cuda.is_current_stream_capturing()


class _Entry:
    __slots__ = ("calls", "capture_failed", "graph", "loaded", "out", "statics")

    def __init__(self, statics: list[torch.Tensor]):
        self.statics = statics
        self.loaded: tuple | None = None  # input shapes now in the buffers (the rest is zeros)
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Any = None
        self.capture_failed = False


class PaddedGraphs:
    """A cache of static input buffers and CUDA graphs, one per key (the caller's bucket and settings)."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def captured(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.graph is not None

    def clear(self) -> None:
        self._entries.clear()

    def run(
        self,
        key: Hashable,
        fn: Callable[..., Any],
        inputs: Sequence[torch.Tensor],
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[torch.dtype],
    ) -> Any:
        """``fn(*buffers)`` where buffer ``i`` has ``shapes[i]`` and ``dtypes[i]``, holds ``inputs[i]`` in its
        leading corner and zeros elsewhere. ``key`` must determine ``fn``, the shapes and the dtypes."""
        entry = self._entries.pop(key, None)
        if entry is None:
            device = inputs[0].device
            entry = _Entry([torch.zeros(s, dtype=d, device=device) for s, d in zip(shapes, dtypes)])
            while len(self._entries) >= self.max_entries:
                self._entries.popitem(last=False)
        self._entries[key] = entry
        self._load(entry, inputs)
        entry.calls += 1
        if entry.graph is None and entry.calls >= 2 and not entry.capture_failed and usable(inputs[0].device):
            self._capture(entry, fn)
        if entry.graph is not None:
            entry.graph.replay()
            return entry.out
        return fn(*entry.statics)

    @staticmethod
    def _load(entry: _Entry, inputs: Sequence[torch.Tensor]) -> None:
        shapes = tuple(tuple(x.shape) for x in inputs)
        if entry.loaded != shapes:  # other sizes than last time: clear what the last inputs left in the padding
            for buf in entry.statics:
                buf.zero_()
            entry.loaded = shapes
        for buf, x in zip(entry.statics, inputs):
            buf[tuple(slice(0, n) for n in x.shape)].copy_(x)

    @staticmethod
    def _capture(entry: _Entry, fn: Callable[..., Any]) -> None:
        device = entry.statics[0].device
        with torch.cuda.device(device):
            # warm-up on a side stream: lazy initialisation (library handles, workspaces) happens outside the capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(*entry.statics)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: another thread's CUDA calls (a data loader's copies) do not break this capture
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    out = fn(*entry.statics)
            except torch.OutOfMemoryError:
                entry.capture_failed = True
                warnings.warn("TRIAGE: no memory to capture a CUDA graph for this shape; it runs eagerly",
                              RuntimeWarning, stacklevel=3)
                return
        entry.graph, entry.out = graph, out

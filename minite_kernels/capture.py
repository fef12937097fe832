"""CUDA-graph capture helpers for code that must run both eagerly and inside a captured graph.

Reading a device tensor on the host (``bool(t.any())``, ``.item()``) synchronises, and a synchronisation inside
``torch.cuda.graph`` capture aborts the capture. Code with a rare slow path (non-finite input, say) asks
:func:`any_or_capturing` instead: eagerly it reads the mask; while capturing it answers True, so the graph
records the slow path, which must therefore be exact on input that does not need it (a ``torch.where`` that keeps
every finite value, for example).

:class:`HostTrips` finds what would break a capture without a GPU: run the code under it (with :func:`capturing`
patched to True) and it lists the calls that make a tensor from host data (a host-to-device copy on CUDA) or read
one on the host.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def any_or_capturing(mask: torch.Tensor) -> bool:
    """``bool(mask.any())``, or True without reading ``mask`` while a CUDA graph is being captured."""
    return True if capturing() else bool(mask.any())


class HostTrips(TorchFunctionMode):
    """Records the torch calls a CUDA graph capture refuses: ``torch.tensor``/``as_tensor`` of host data (not of
    a tensor, which ``as_tensor`` passes through) and ``bool``/``item``/``tolist``/``cpu``/``numpy`` (host reads),
    by name, in ``seen``."""

    FROM_HOST = frozenset({"tensor", "as_tensor"})
    NAMES = FROM_HOST | {"__bool__", "item", "tolist", "cpu", "numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.NAMES and not (name in self.FROM_HOST and args and isinstance(args[0], torch.Tensor)):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))

"""CUDA-graph capture helpers for code that must run both eagerly and inside a captured graph.

Reading a device tensor on the host (``bool(t.any())``, ``.item()``) synchronises, and a synchronisation inside
``torch.cuda.graph`` capture aborts the capture. Code with a rare slow path (non-finite input, say) asks
:func:`any_or_capturing` instead: eagerly it reads the mask; while capturing it answers True, so the graph
records the slow path, which must therefore be exact on input that does not need it (a ``torch.where`` that keeps
every finite value, for example).
"""
from __future__ import annotations

import torch


def capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def any_or_capturing(mask: torch.Tensor) -> bool:
    """``bool(mask.any())``, or True without reading ``mask`` while a CUDA graph is being captured."""
    return True if capturing() else bool(mask.any())

""""Did you mean" for a bad name: the one helper behind every error that lists the valid choices.

Standard library only (``minite_kernels.recipes`` and config code import it without torch). Example:
``did_you_mean("nvfp4_per_tokn", ["bf16", "nvfp4_per_token"])`` is ``"; did you mean 'nvfp4_per_token'?"``, and
``""`` when nothing is close (difflib's similarity ratio below ``cutoff``; 0 always suggests the nearest).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(value: object, choices: Iterable[object], cutoff: float = 0.6) -> str | None:
    """The choice most similar to ``value`` (compared as strings), or None when none reaches ``cutoff``."""
    match = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=cutoff)
    return match[0] if match else None


def did_you_mean(value: object, choices: Iterable[object], cutoff: float = 0.6) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""``."""
    match = closest(value, choices, cutoff)
    return "" if match is None else f"; did you mean {match!r}?"

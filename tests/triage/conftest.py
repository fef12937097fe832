"""Fixtures for the host read-back (GPU sync) tests of the TRIAGE fast path, usable on a CPU."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def force_sync_free(monkeypatch):
    """Take the GPU (sync-free) code path on the CPU too."""
    import triage.fused
    import triage.quantile

    monkeypatch.setattr(triage.fused, "avoid_host_sync", lambda device: True)
    monkeypatch.setattr(triage.quantile, "avoid_host_sync", lambda device: True)


class ReadBackCounter:
    """Counts every Python-level way a tensor value reaches the host (each is a GPU sync on CUDA)."""

    NAMES = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "cpu", "numpy")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, orig))
        for name in ("nonzero", "masked_select", "unique"):
            monkeypatch.setattr(torch, name, self._wrap(f"torch.{name}", getattr(torch, name)))
        getitem = torch.Tensor.__getitem__

        def checked_getitem(t, idx):
            parts = idx if isinstance(idx, tuple) else (idx,)
            if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                self.calls.append("bool-mask indexing")
            return getitem(t, idx)

        monkeypatch.setattr(torch.Tensor, "__getitem__", checked_getitem)

    def _wrap(self, name, orig):
        def f(*args, **kwargs):
            self.calls.append(name)
            return orig(*args, **kwargs)

        return f


@pytest.fixture
def read_backs(monkeypatch):
    """``read_backs()`` starts counting; its ``.calls`` lists every read-back since."""
    return lambda: ReadBackCounter(monkeypatch)

"""Packed projections for the decode step: a layer's q/k/v weights as one [Nq + 2 Nkv, H] matrix and its
gate/up weights as one [2 I, H] matrix, so the step runs one GEMM where the model runs three (two).

At decode batch sizes each projection GEMM is short and costs about one kernel's latency whatever its size
(a few microseconds for a 2-6 MB weight on an H200), so three launches cost about three times one::

    [q | k | v] = x [Wq; Wk; Wv]ᵀ (+ [bq; bk; bv])        [g | u] = x [Wg; Wu]ᵀ

Only plain ``nn.Linear`` projections are packed (a minite-quantized linear keeps its own weight scales and
kernels). The packed copies are extra memory (``nbytes``), allocated once so that captured graphs read fixed
addresses, and refreshed from the live parameters by :meth:`PackedLinears.refresh` before every batch's
decode (one device copy per weight), so they follow the optimizer's in-place updates.

Example: Qwen3-0.6B packs 28 x (4096 + 6144) x 1024 bf16 weights: 0.59 GB, copied in about 0.3 ms.
"""
from __future__ import annotations

import torch
from torch import nn


def _plain(*mods) -> bool:
    return all(type(m) is nn.Linear for m in mods)


class PackedLinears:
    """Per layer ``(qkv, gate_up)``: ``(weight, bias or None, split sizes)`` or None where not packed."""

    def __init__(self, view) -> None:
        self.layers: list[tuple] = []
        self._sources: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
        for layer in view.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = gu = None
            if _plain(a.q_proj, a.k_proj, a.v_proj):
                qkv = self._pack([a.q_proj, a.k_proj, a.v_proj])
            if hasattr(mlp, "gate_proj") and _plain(mlp.gate_proj, mlp.up_proj):
                gu = self._pack([mlp.gate_proj, mlp.up_proj])
            self.layers.append((qkv, gu))

    def _pack(self, mods: list[nn.Linear]) -> tuple:
        ws = [m.weight for m in mods]
        w = torch.empty((sum(x.shape[0] for x in ws), ws[0].shape[1]), dtype=ws[0].dtype, device=ws[0].device)
        self._sources.append((w, ws))
        b = None
        if any(m.bias is not None for m in mods):
            bs = [m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=w.dtype, device=w.device)
                  for m in mods]
            b = torch.empty(w.shape[0], dtype=w.dtype, device=w.device)
            self._sources.append((b, bs))
        return w, b, [x.shape[0] for x in ws]

    @property
    def any(self) -> bool:
        return any(q is not None or g is not None for q, g in self.layers)

    @property
    def nbytes(self) -> int:
        return sum(dst.numel() * dst.element_size() for dst, _ in self._sources)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the live parameters into the packed buffers (same addresses every time)."""
        for dst, srcs in self._sources:
            o = 0
            for s in srcs:
                dst[o:o + s.shape[0]].copy_(s)
                o += s.shape[0]

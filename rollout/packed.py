"""Packed projections for the decode step: a layer's q/k/v weights as one [Nq + 2 Nkv, H] matrix and its
gate/up weights as one [2 I, H] matrix, so the step runs one GEMM where the model runs three (two).

At decode batch sizes each projection GEMM is short and costs about one kernel's latency whatever its size
(a few microseconds for a 2-6 MB weight on an H200), so three launches cost about three times one::

    [q | k | v] = x [Wq; Wk; Wv]ᵀ (+ [bq; bk; bv])        [g | u] = x [Wg; Wu]ᵀ

Two kinds of group are packed:

- plain ``nn.Linear`` projections: the packed matrix is a copy of the weights;
- minite-quantized linears that share one fast-lane plan (``minite_kernels.modules.fast_lane``: a W4A4 NVFP4
  forward on the Triton backend, BF16 weights): the packed matrix is their dequantized weights
  Ŵ = deq(Q(W)), and the group runs the lane's own math, ``deq(Q_token(x)) [Ŵq; Ŵk; Ŵv]ᵀ``, with one
  activation quantization for the shared input. That is each module's forward on more than
  ``DECODE_MAX_ROWS`` rows; at fewer rows (where the modules run the packed-FP4 decode kernel) and whenever
  ``fast_lane.call_ok`` refuses the input, :meth:`Packed.__call__` returns None and the modules run.

Other linears are not packed, except that a sampler fusing the NVFP4 activation quantization into the ops
before the GEMMs (``down=True``) also keeps each lane-eligible down projection's Ŵ as a one-module group. The
packed copies are extra memory (``nbytes``), allocated once so that
captured graphs read fixed addresses, and refreshed from the live parameters (or the modules' current
quantized weights) by :meth:`PackedLinears.refresh` before every batch's decode (one device copy per
weight), so they follow the optimizer's in-place updates and the weight sync.

Example: Qwen3-0.6B packs 28 x (4096 + 6144) x 1024 bf16 weights: 0.59 GB, copied in about 0.3 ms.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def _plain(*mods) -> bool:
    return all(type(m) is nn.Linear for m in mods)


def _shared_lane(mods) -> tuple | None:
    """The one fast-lane plan all ``mods`` run (same recipe, backend and quantizer objects), else None."""
    from minite_kernels.modules.functional import module_lane
    from minite_kernels.modules.linear import Linear

    if not all(isinstance(m, Linear) for m in mods):
        return None
    w = mods[0].weight
    if any(m.weight.dtype != torch.bfloat16 or m.weight.device != w.device or m.in_features != mods[0].in_features
           for m in mods):
        return None
    lanes = [module_lane(m, w.device) for m in mods]
    if lanes[0] is None or any(lane is None or any(a is not b for a, b in zip(lane, lanes[0])) for lane in lanes):
        return None
    return lanes[0]


@dataclass
class Packed:
    """One packed group: ``weight`` [sum N, K], ``bias`` or None, the ``splits`` of its output and, for a
    quantized group, the shared fast-lane plan (``lane``)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    splits: list[int]
    lane: tuple | None = None

    def takes_deq(self, like: torch.Tensor) -> bool:
        """Whether the group, given an input with ``like``'s rows, dtype and device ([..., K]), runs the lane's
        GEMM on X̂ (so :meth:`from_deq` may take an X̂ made elsewhere) rather than its modules."""
        if self.lane is None:
            return False
        from minite_kernels.modules.fast_lane import deq_ok

        return deq_ok(self.lane, like.reshape(-1, like.shape[-1]), self.weight)

    def from_deq(self, x_hat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The group's outputs from X̂ = deq(Q_token(x)) [rows, K] made elsewhere, shaped ``shape[:-1] + [N]``
        (only where :meth:`takes_deq` holds: the same values as ``self(x)``)."""
        from minite_kernels.modules.fast_lane import deq_linear

        y = deq_linear(x_hat, self.weight, self.bias)
        return y.reshape(*shape[:-1], y.shape[-1])

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """The group's concatenated outputs for ``x`` [..., K], or None where the modules must run."""
        if self.lane is None:
            return F.linear(x, self.weight, self.bias)
        from minite_kernels.modules.fast_lane import call_ok, dequantized_linear

        x2d = x.reshape(-1, x.shape[-1])
        if not call_ok(self.lane, x2d, self.weight):
            return None
        y, _ = dequantized_linear(self.lane, x2d, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class PackedLinears:
    """Per layer ``(qkv, gate_up)``: a :class:`Packed` group or None where not packed. With ``down=True``, also
    ``down[i]``: layer i's down projection as a one-module group when it is on the NVFP4 fast lane (so that the
    decode step can hand it an X̂ made with the SiLU product, ``backends/triton/norm_quant.py``), else None."""

    def __init__(self, view, *, down: bool = False) -> None:
        self.layers: list[tuple] = []
        self.down: list[Packed | None] | None = [] if down else None
        self._sources: list[tuple] = []  # (packed buffer, source modules or tensors, lane or None)
        for layer in view.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = self._group([a.q_proj, a.k_proj, a.v_proj])
            gu = self._group([mlp.gate_proj, mlp.up_proj]) if hasattr(mlp, "gate_proj") else None
            self.layers.append((qkv, gu))
            if self.down is not None:
                self.down.append(self._group([mlp.down_proj], lane_only=True))

    def _group(self, mods: list, *, lane_only: bool = False) -> Packed | None:
        lane = None
        if lane_only or not _plain(*mods):
            lane = _shared_lane(mods)
            if lane is None:
                return None
        ws = [m.weight for m in mods]
        w = torch.empty((sum(x.shape[0] for x in ws), ws[0].shape[1]), dtype=ws[0].dtype, device=ws[0].device)
        self._sources.append((w, mods, lane))
        b = None
        if any(m.bias is not None for m in mods):
            bs = [m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=w.dtype, device=w.device)
                  for m in mods]
            b = torch.empty(w.shape[0], dtype=w.dtype, device=w.device)
            self._sources.append((b, bs, None))
        return Packed(w, b, [x.shape[0] for x in ws], lane)

    @property
    def any(self) -> bool:
        return any(q is not None or g is not None for q, g in self.layers)

    @property
    def quantized_groups(self) -> int:
        return sum(1 for _, _, lane in self._sources if lane is not None)

    @property
    def nbytes(self) -> int:
        return sum(dst.numel() * dst.element_size() for dst, _, _ in self._sources)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the live parameters (a quantized group: its modules' current Ŵ) into the packed buffers (same
        addresses every time)."""
        for dst, srcs, lane in self._sources:
            if lane is not None:
                from minite_kernels.modules.fast_lane import lane_weight

                srcs = [lane_weight(lane, m._weight_cache, m.weight) for m in srcs]
            elif srcs and isinstance(srcs[0], nn.Module):
                srcs = [m.weight for m in srcs]
            o = 0
            for s in srcs:
                dst[o:o + s.shape[0]].copy_(s)
                o += s.shape[0]

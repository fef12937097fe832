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
before the GEMMs (``down=True``) also keeps each lane-eligible down projection's Ŵ as a one-module group.

**FP4 weights** (``fp4``): a quantized group can hold its weight as the NVFP4 bytes themselves (an
:class:`~minite_kernels.backends.triton.fp4w.FP4Weight`: E2M1 codes, E4M3 scales and each linear's decode factor,
0.5625 bytes per value) instead of the BF16 Ŵ, and run ``minite_kernels.backends.triton.fp4w`` on it: the
decode step then reads 3.6x fewer weight bytes. With FP4 weights the o and down projections become one-module
groups too (``o[i]``, ``down[i]``), so every lane linear of the step reads packed bytes, and no BF16 copy of a
quantized weight is kept. ``fp4="auto"`` takes FP4 for a group where the kernel's measured table
(``fp4w.TABLE``) prefers it at 64 rows (a rollout batch), on a device where the kernel runs; ``True`` wherever it runs.
The numerics are the activation's ``X̂`` as today times the exact ``e2m1 · s`` products, with the per-tensor
factor in the fp32 epilogue (``fp4w``'s docstring bounds the difference from ``X̂ Ŵᵀ``).

The packed copies are extra memory (``nbytes``), allocated once so that
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
    from minite_kernels import Linear, module_lane

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
    """One packed group: ``weight`` [sum N, K] (None for an FP4 group), ``bias`` or None, the ``splits`` of its
    output, for a quantized group the shared fast-lane plan (``lane``), and for an FP4 group its packed
    NVFP4 weight (``fp4``)."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    splits: list[int]
    lane: tuple | None = None
    fp4: object | None = None

    def _gemm(self, x_hat: torch.Tensor) -> torch.Tensor:
        """``Y`` of the group from X̂ [rows, K]: the FP4 kernel on the packed weight, or the lane's GEMM on Ŵ."""
        if self.fp4 is not None:
            from minite_kernels.backends.triton import fp4w_linear

            return fp4w_linear(x_hat, self.fp4, self.bias)
        from minite_kernels import lane_deq_linear as deq_linear

        return deq_linear(x_hat, self.weight, self.bias)

    @property
    def in_features(self) -> int:
        return self.fp4.shape[1] if self.fp4 is not None else self.weight.shape[1]

    def takes_deq(self, like: torch.Tensor) -> bool:
        """Whether the group, given an input with ``like``'s rows, dtype and device ([..., K]), runs the lane's
        GEMM on X̂ (so :meth:`from_deq` may take an X̂ made elsewhere) rather than its modules."""
        if self.lane is None:
            return False
        from minite_kernels import lane_deq_ok as deq_ok

        x2d = like.reshape(-1, like.shape[-1])
        return deq_ok(self.lane, x2d, self.weight if self.weight is not None else x2d)  # FP4: the model's dtype

    def from_deq(self, x_hat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The group's outputs from X̂ = deq(Q_token(x)) [rows, K] made elsewhere, shaped ``shape[:-1] + [N]``
        (only where :meth:`takes_deq` holds: the same values as ``self(x)``)."""
        y = self._gemm(x_hat)
        return y.reshape(*shape[:-1], y.shape[-1])

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """The group's concatenated outputs for ``x`` [..., K], or None where the modules must run."""
        if self.lane is None:
            return F.linear(x, self.weight, self.bias)
        from minite_kernels import lane_call_ok as call_ok

        x2d = x.reshape(-1, x.shape[-1])
        if not call_ok(self.lane, x2d, self.weight if self.weight is not None else x2d):  # FP4: the model's dtype
            return None
        recipe, _, quantizer = self.lane
        y = self._gemm(quantizer.quantize_token_deq(x2d, recipe.fprop.a).deq)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class PackedLinears:
    """Per layer ``(qkv, gate_up)``: a :class:`Packed` group or None where not packed. With ``down=True`` or FP4
    groups, also ``down[i]``: layer i's down projection as a one-module group when it is on the NVFP4 fast lane
    (so that the decode step can hand it an X̂ made with the SiLU product, ``backends/triton/norm_quant.py``, or
    run it on FP4 weights), else None; with FP4 groups, ``o[i]`` likewise for the o projection (else ``o`` is
    None). ``fp4``: "auto", True or False (module docstring)."""

    def __init__(self, view, *, down: bool = False, fp4: bool | str = "auto") -> None:
        if fp4 not in ("auto", True, False):
            raise ValueError(f"fp4 must be 'auto', True or False, got {fp4!r}")
        self.fp4_mode = fp4
        self.layers: list[tuple] = []
        self._sources: list[tuple] = []  # (packed buffer, source modules or tensors, lane or None)
        for layer in view.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = self._group([a.q_proj, a.k_proj, a.v_proj])
            gu = self._group([mlp.gate_proj, mlp.up_proj]) if hasattr(mlp, "gate_proj") else None
            self.layers.append((qkv, gu))
        has_fp4 = any(g is not None and g.fp4 is not None for pair in self.layers for g in pair)
        self.o: list[Packed | None] | None = None
        self.down: list[Packed | None] | None = None
        if has_fp4:  # one-module groups only where they hold FP4 bytes: a BF16 copy would only cost memory
            self.o = [self._group([layer.self_attn.o_proj], lane_only=True, fp4_only=True) for layer in view.layers]
        if down or has_fp4:
            self.down = [self._group([layer.mlp.down_proj], lane_only=True, fp4_only=not down)
                         if hasattr(layer.mlp, "down_proj") else None for layer in view.layers]

    def _use_fp4(self, lane: tuple, rows: list[int], k: int, device: torch.device) -> bool:
        if self.fp4_mode is False:
            return False
        # a lane exists only on the Triton backend, so Triton imports here
        from minite_kernels.backends.triton import FP4W_GROUP_ROWS, FP4W_K_TILE, kernel_device_ok, prefers_fp4

        recipe = lane[0]
        b = recipe.fprop.b
        if b.format != "nvfp4" or b.rht or b.stochastic_rounding or k % FP4W_K_TILE:
            return False
        if any(r % FP4W_GROUP_ROWS for r in rows):  # the layout packs whole 16-row groups of each linear
            return False
        if not kernel_device_ok(torch.empty(0, device=device)):
            return False
        return self.fp4_mode is True or prefers_fp4(sum(rows), k)

    def _group(self, mods: list, *, lane_only: bool = False, fp4_only: bool = False) -> Packed | None:
        """A group of ``mods`` (None where they cannot be one); ``lane_only``: only on the NVFP4 fast lane;
        ``fp4_only``: only with FP4 weights."""
        lane = None
        if lane_only or not _plain(*mods):
            lane = _shared_lane(mods)
            if lane is None:
                return None
        ws = [m.weight for m in mods]
        n, k, dev = sum(x.shape[0] for x in ws), ws[0].shape[1], ws[0].device
        fp4 = None
        use_fp4 = lane is not None and self._use_fp4(lane, [x.shape[0] for x in ws], k, dev)
        if fp4_only and not use_fp4:
            return None
        if use_fp4:
            from minite_kernels.backends.triton import FP4Weight

            fp4 = FP4Weight.empty(n, k, dev)
            self._sources.append((fp4, mods, lane))
            w = None
        else:
            w = torch.empty((n, k), dtype=ws[0].dtype, device=dev)
            self._sources.append((w, mods, lane))
        b = None
        if any(m.bias is not None for m in mods):
            bs = [m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=ws[0].dtype, device=dev)
                  for m in mods]
            b = torch.empty(n, dtype=ws[0].dtype, device=dev)
            self._sources.append((b, bs, None))
        return Packed(w, b, [x.shape[0] for x in ws], lane, fp4)

    @property
    def any(self) -> bool:
        return any(q is not None or g is not None for q, g in self.layers)

    @property
    def quantized_groups(self) -> int:
        return sum(1 for _, _, lane in self._sources if lane is not None)

    @property
    def fp4_groups(self) -> int:
        return sum(1 for dst, _, _ in self._sources if not isinstance(dst, torch.Tensor))

    @property
    def nbytes(self) -> int:
        return sum(dst.nbytes if not isinstance(dst, torch.Tensor) else dst.numel() * dst.element_size()
                   for dst, _, _ in self._sources)

    def quantized_weight_bytes(self) -> tuple[int, int]:
        """(bytes the decode step reads for the quantized groups' weights as held here, the same weights'
        BF16 bytes): FP4 groups 0.5625 bytes per value plus a 4-byte factor per row, Ŵ groups 2."""
        held = bf16 = 0
        for dst, mods, lane in self._sources:
            if lane is None:
                continue
            numel = sum(m.weight.numel() for m in mods)
            bf16 += 2 * numel
            held += dst.nbytes if not isinstance(dst, torch.Tensor) else dst.numel() * dst.element_size()
        return held, bf16

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the live parameters (a quantized group: its modules' current Ŵ, or for an FP4 group their
        current NVFP4 bytes) into the packed buffers (same addresses every time)."""
        for dst, srcs, lane in self._sources:
            if not isinstance(dst, torch.Tensor):  # FP4Weight
                from minite_kernels import WeightCache, lane_qweight

                row = 0
                for m in srcs:
                    q = lane_qweight(lane, WeightCache.of(m), m.weight)
                    row = dst.copy_rows_(row, q.data, q.scales, q.amax)
                continue
            if lane is not None:
                from minite_kernels import WeightCache, lane_weight

                srcs = [lane_weight(lane, WeightCache.of(m), m.weight) for m in srcs]
            elif srcs and isinstance(srcs[0], nn.Module):
                srcs = [m.weight for m in srcs]
            o = 0
            for s in srcs:
                dst[o:o + s.shape[0]].copy_(s)
                o += s.shape[0]

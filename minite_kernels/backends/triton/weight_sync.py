"""Weight sync: re-quantize every linear weight of a model after an optimizer step (report §6.5).

The report measured 55 s of conversion and synchronization per step; here it is one amax pass plus one
quantize pass (``quantize.py`` / ``quantize_bf16.py``; NVFP4 per-tensor amax, 16x16 tiles by default, the
recipe's weight format) with all output buffers allocated once::

    amax_g = max |W_g|                       (one grouped launch over all weights g)
    W_g -> (codes, E4M3 tile scales, amax_g)   (one grouped launch over all weights, quantize.py formulas)

Grouped (``grouped=True``, the default): the two launches cover the whole list. A device table holds, per
weight, its base addresses (input, codes, scales, qs, deq, amax, nonfinite), shape and row stride, and the
first index of its tiles in a flat work list; a tile map gives each program its weight (programs
``start_g .. start_g + tiles_g - 1`` belong to weight g). Each amax program atomically maxes its partial
amax into ``scratch[g]``; the quantize launch starts after the amax launch, so every weight's amax is final.
This replaces 2 launches per weight (392 for Qwen3-1.7B's 196 linears, many of them small, each with its
own ramp-up and tail) with 2 launches + 1 memset, and the kernels are the BF16 fast path's (whole 16-element
blocks per thread, 8-byte code stores). ``chunk_bytes`` splits the list into consecutive chunks (amax +
quantize per chunk) so that a chunk's second read can hit L2; ``grouped=False`` is the previous
per-weight sequence (A/B timing). Weights the grouped kernels cannot take (not bf16, rows not 16-byte
aligned, > 2^31 words) use the per-weight path.

On CUDA the whole sequence is captured once into a CUDA graph and replayed each step: the weights are
updated in place by the optimizer (their addresses must not change), so the graph reads the new values.

Bytes per parameter and step: 2 (amax read) + 2 (quantize read) + 0.5625 (packed write) [+ 2 with the
BF16 ``qs`` GEMM operand], reported by ``scripts/bench_kernels.py`` against the device copy bandwidth.

``amax_from=optimizer`` (``minite_kernels.optim.AdamW``, whose step writes max|W| of each weight as it
updates it) replaces the amax pass by a gather of those amaxes: one read per weight, 2.5625 B/param. The
amaxes are used only while every grouped weight is unchanged since the optimizer's step wrote it (version
counters, checked on the host each sync); otherwise that sync runs the amax pass as before
(``amax_given`` reports which). The codes are the same bytes either way: the amax is exact.
Worked example (Qwen3-1.7B, 1.41 B params): 4.5625 B/param = 6.43 GB per sync, i.e. 1.6 ms at 4 TB/s.
Measured on the H200 (benchmarks/RESULTS.md): with the optimizer's amax 1.08 ms (0.76 ms per billion
parameters, 84% of the copy bandwidth on its 2.5625 B/param); with its own amax pass 1.76 ms (92% on the
4.5625 B/param it moves); per weight 3.9 ms.

Example::

    sync = WeightRequantizer([m.weight for m in linears])
    after each optimizer.step():  quantized = sync.sync()   # list of NVFP4Tensor, same buffers every step
"""

from __future__ import annotations

import torch
import triton

from . import quantize as _q
from ._common import interpret_mode
from .quantize import QuantOut, quantize_nvfp4_triton
from .tensor import TritonNVFP4Tensor


class WeightRequantizer:
    """Re-quantizes a fixed list of 2-D weights into preallocated NVFP4 buffers (optionally a CUDA graph).

    ``write_deq`` / ``write_qs`` also refresh the BF16 GEMM operands (dequantized values / exact ``q*s_b``) in
    the same launch; ``quantized`` holds one :class:`TritonNVFP4Tensor` per weight (same objects every step).
    ``grouped`` (default True; byte-identical to the per-weight sequence, GPU-verified on the H200) runs all
    weights in two launches; ``grouped=False`` is the per-weight sequence (A/B timing). ``chunk_bytes``
    (grouped only) bounds the weight bytes per amax+quantize launch pair. ``amax_from`` (grouped only): an
    optimizer that records each weight's amax (``minite_kernels.optim.AdamW``); its amaxes replace the amax
    pass while they are current.
    """

    def __init__(
        self,
        weights: list[torch.Tensor],
        *,
        tile16: bool = True,
        write_qs: bool = False,
        write_deq: bool = False,
        cuda_graph: bool = True,
        grouped: bool = True,
        chunk_bytes: int | None = None,
        amax_from=None,
    ) -> None:
        if not weights:
            raise ValueError("WeightRequantizer needs at least one weight")
        for i, w in enumerate(weights):
            if w.dim() != 2 or w.shape[1] % 16 or (tile16 and w.shape[0] % 16):
                raise ValueError(
                    f"weight {i} has shape {tuple(w.shape)}: needs 2-D with K % 16 == 0"
                    + (" and rows % 16 == 0 (16x16 tiles)" if tile16 else "")
                )
            if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                raise TypeError(f"weight {i} has dtype {w.dtype}; valid: bfloat16, float16, float32")
        if chunk_bytes is not None and chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes={chunk_bytes}: must be a positive number of bytes, or None")
        self.weights = list(weights)
        self.tile16 = tile16
        self.write_qs = write_qs
        self.write_deq = write_deq
        self.grouped = bool(grouped)
        dev = weights[0].device
        self._bufs: list[tuple[QuantOut, torch.Tensor]] = []
        for w in self.weights:
            m, k = w.shape
            out = QuantOut(
                torch.empty((m, k // 2), dtype=torch.uint8, device=dev),
                torch.empty((m, k // 16), dtype=torch.uint8, device=dev),
                torch.empty((1,), dtype=torch.float32, device=dev),
                torch.empty((1,), dtype=torch.bool, device=dev),
                torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_qs else None,
                torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_deq else None,
            )
            self._bufs.append((out, torch.zeros(2, dtype=torch.int32, device=dev)))
        self.quantized = [
            TritonNVFP4Tensor(
                data=o.data,
                scales=o.scales.view(torch.float8_e4m3fn),
                amax=o.amax,
                shape=w.shape,
                scaling="per_tensor",
                tile=(16, 16) if tile16 else (1, 16),
                orig_dtype=w.dtype,
                nonfinite=o.nonfinite,
                qs=o.qs,
                deq=o.deq,
                # the objects are refreshed in place every sync: a qs recomputed from the codes must not be kept
                qs_transient=not write_qs,
            )
            for w, (o, _) in zip(self.weights, self._bufs)
        ]
        self.qs = [o.qs for o, _ in self._bufs]
        self._graphs: dict[bool, torch.cuda.CUDAGraph] = {}
        self._use_graph = bool(cuda_graph) and dev.type == "cuda"
        self._groups: list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, int, torch.Tensor]] = []
        self._single = list(range(len(self.weights)))
        self._grouped_idx: list[int] = []
        self._scratch = None
        self._amax_from = amax_from
        self._amax_src: tuple | None = None
        self.amax_given = False  # whether the last sync took the amaxes from ``amax_from``
        if self.grouped:
            self._build_groups(chunk_bytes)
        if amax_from is not None:
            if not self.grouped:
                raise ValueError("amax_from needs grouped=True (the per-weight path computes its own amax)")
            self._bind_amax()

    @property
    def num_params(self) -> int:
        return sum(w.numel() for w in self.weights)

    @property
    def num_launches(self) -> int:
        """Kernel launches (and memsets or gathers) per sync, as the last sync ran."""
        per_weight = 3 if self._single else 0  # scratch memset + amax + quantize (bf16 path)
        per_group = 1 if self.amax_given else 2
        return per_group * len(self._groups) + (1 if self._groups else 0) + per_weight * len(self._single)

    @staticmethod
    def _groupable(w: torch.Tensor) -> bool:
        return (
            w.dtype == torch.bfloat16
            and w.shape[0] > 0
            and w.stride(1) == 1
            and w.stride(0) % 8 == 0
            and w.data_ptr() % 16 == 0
            and w.shape[0] * w.stride(0) // 2 < 2**31
        )

    def _build_groups(self, chunk_bytes: int | None) -> None:
        # the tile maps below depend on the launch sizes: keep the ones they were built with
        self._cfg = cfg = dict(_q.BF16_CONFIG)
        idx = [i for i, w in enumerate(self.weights) if self._groupable(w)]
        self._single = [i for i in range(len(self.weights)) if i not in set(idx)]
        self._grouped_idx = idx
        if not idx:
            return
        chunks: list[list[int]] = [[]]
        size = 0
        for i in idx:
            nbytes = self.weights[i].numel() * 2
            if chunk_bytes is not None and chunks[-1] and size + nbytes > chunk_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += nbytes
        dev = self.weights[0].device
        self._scratch = torch.zeros(len(idx), dtype=torch.int32, device=dev)
        a_rows, a_w = cfg["amax_rows"], cfg["amax_block_w"]
        q_bm = 16 if self.tile16 else cfg["tensor_block_m"]
        q_nb = cfg["tile16_nb"] if self.tile16 else cfg["tensor_nb"]
        first = 0
        for chunk in chunks:
            rows, a_counts, q_counts = [], [], []
            a_start = q_start = 0
            for i in chunk:
                w = self.weights[i]
                out, _ = self._bufs[i]
                m, k = w.shape
                kw = k // 2
                a_tw, q_tw = triton.cdiv(kw, a_w), triton.cdiv(kw // 8, q_nb)
                a_n, q_n = triton.cdiv(m, a_rows) * a_tw, triton.cdiv(m, q_bm) * q_tw
                rows.append(
                    [
                        w.data_ptr(),
                        out.data.data_ptr(),
                        out.scales.data_ptr(),
                        out.qs.data_ptr() if out.qs is not None else 0,
                        out.deq.data_ptr() if out.deq is not None else 0,
                        out.amax.data_ptr(),
                        out.nonfinite.data_ptr(),
                        m,
                        kw,
                        w.stride(0) // 2,
                        q_tw,
                        q_start,
                        a_tw,
                        a_start,
                        0,
                        0,
                    ]
                )
                a_counts.append(a_n)
                q_counts.append(q_n)
                a_start += a_n
                q_start += q_n
            table = torch.tensor(rows, dtype=torch.int64, device=dev)
            g = torch.arange(len(chunk), dtype=torch.int32, device=dev)
            amap = torch.repeat_interleave(g, torch.tensor(a_counts, device=dev))
            qmap = torch.repeat_interleave(g, torch.tensor(q_counts, device=dev))
            scratch = self._scratch[first : first + len(chunk)]
            self._groups.append((table, amap, a_start, qmap, q_start, scratch))
            first += len(chunk)

    def _bind_amax(self) -> None:
        """Index the grouped weights' slots in the optimizer's amax buffer (``optim.AdamW.amax_slots``)."""
        grouped = self._grouped_weights = [self.weights[i] for i in self._grouped_idx]
        try:
            self._amax_src = self._amax_from.amax_slots(grouped) if grouped else None
        except ValueError as e:
            raise ValueError(
                f"amax_from: every weight must be one of the optimizer's parameters ({e})"
            ) from None

    def _amax_ready(self) -> bool:
        """The optimizer's amaxes are usable: same buffer as when bound, every grouped weight unchanged
        since its last step (otherwise this sync computes the amaxes itself)."""
        src = self._amax_src
        if src is None:
            return False
        if src[0] is not self._amax_from.amax_buffer():
            self._bind_amax()
            self._graphs.clear()
        return self._amax_from.amax_current(self._grouped_weights)

    def _run_grouped(self, amax_given: bool = False) -> None:
        from .quantize_bf16 import _grouped_amax_kernel, _grouped_quant_kernel

        cfg = self._cfg
        if amax_given:  # the optimizer wrote max|W| with the update: gather instead of re-reading W
            bits, index = self._amax_src
            torch.index_select(bits, 0, index, out=self._scratch)
        else:
            self._scratch.zero_()
        for table, amap, n_a, qmap, n_q, scratch in self._groups:
            if not amax_given:
                _grouped_amax_kernel[(n_a,)](
                    table,
                    amap,
                    scratch,
                    A_ROWS=cfg["amax_rows"],
                    BLOCK_M=cfg["amax_block_m"],
                    BLOCK_W=cfg["amax_block_w"],
                    num_warps=cfg["amax_warps"],
                )
            _grouped_quant_kernel[(n_q,)](
                table,
                qmap,
                scratch,
                BLOCK_M=16 if self.tile16 else cfg["tensor_block_m"],
                NB=cfg["tile16_nb"] if self.tile16 else cfg["tensor_nb"],
                TILE16=self.tile16,
                WRITE_QS=self.write_qs,
                WRITE_DEQ=self.write_deq,
                RNE_INT=interpret_mode(),
                num_warps=cfg["tile16_warps"] if self.tile16 else cfg["tensor_warps"],
            )

    def _run(self, amax_given: bool = False) -> None:
        if self._groups:
            self._run_grouped(amax_given)
        for i in self._single:
            out, scratch = self._bufs[i]
            quantize_nvfp4_triton(
                self.weights[i],
                per_token=False,
                tile16=self.tile16,
                write_packed=True,
                write_qs=self.write_qs,
                write_deq=self.write_deq,
                out=out,
                scratch=scratch,
            )

    def sync(self) -> list:
        """Re-quantize all weights now; returns the (reused) TritonNVFP4Tensor list. With ``amax_from``, the
        amax pass is skipped whenever the optimizer's amaxes are current (``amax_given`` says which)."""
        given = self._amax_ready()
        self.amax_given = given
        if not self._use_graph:
            self._run(given)
            return self.quantized
        graph = self._graphs.get(given)
        if graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._run(given)  # compiles the kernels outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._run(given)
            self._graphs[given] = graph
        graph.replay()
        return self.quantized

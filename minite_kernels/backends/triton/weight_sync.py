"""Weight sync: re-quantize every linear weight of a model after an optimizer step (report §6.5).

The report measured 55 s of conversion and synchronization per step; here it is one amax pass plus one
quantize pass per weight (``quantize.py``; NVFP4 per-tensor amax, 16x16 tiles by default, the recipe's
weight format), with all output buffers allocated once. On CUDA the whole sequence of launches is
captured once into a CUDA graph and replayed each step: the weights are updated in place by the optimizer,
so the graph reads the new values; replay removes the ~2 launches x number-of-linears of CPU overhead.

Bytes per parameter and step: 2 (amax read) + 2 (quantize read) + 0.5625 (packed write) [+ 2 with the
BF16 ``qs`` GEMM operand], reported by ``scripts/bench_weight_sync.py`` against the device copy bandwidth.

Example::

    sync = WeightRequantizer([m.weight for m in linears])
    after each optimizer.step():  quantized = sync.sync()   # list of NVFP4Tensor, same buffers every step
"""

from __future__ import annotations

import torch

from .quantize import QuantOut, quantize_nvfp4_triton


class WeightRequantizer:
    """Re-quantizes a fixed list of 2-D weights into preallocated NVFP4 buffers (optionally a CUDA graph).

    ``write_deq`` / ``write_qs`` also refresh the BF16 GEMM operands (dequantized values / exact ``q*s_b``) in
    the same launch; ``quantized`` holds one :class:`TritonNVFP4Tensor` per weight (same objects every step).
    """

    def __init__(
        self,
        weights: list[torch.Tensor],
        *,
        tile16: bool = True,
        write_qs: bool = False,
        write_deq: bool = False,
        cuda_graph: bool = True,
    ) -> None:
        from .backend import TritonNVFP4Tensor

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
        self.weights = list(weights)
        self.tile16 = tile16
        self.write_qs = write_qs
        self.write_deq = write_deq
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
            )
            for w, (o, _) in zip(self.weights, self._bufs)
        ]
        self.qs = [o.qs for o, _ in self._bufs]
        self._graph = None
        self._use_graph = bool(cuda_graph) and dev.type == "cuda"

    @property
    def num_params(self) -> int:
        return sum(w.numel() for w in self.weights)

    def _run(self) -> None:
        for w, (out, scratch) in zip(self.weights, self._bufs):
            quantize_nvfp4_triton(
                w,
                per_token=False,
                tile16=self.tile16,
                write_packed=True,
                write_qs=self.write_qs,
                write_deq=self.write_deq,
                out=out,
                scratch=scratch,
            )

    def sync(self) -> list:
        """Re-quantize all weights now; returns the (reused) TritonNVFP4Tensor list."""
        if not self._use_graph:
            self._run()
            return self.quantized
        if self._graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._run()  # compiles the kernels outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._run()
            self._graph = graph
        self._graph.replay()
        return self.quantized

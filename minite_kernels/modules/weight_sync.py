"""Model-level weight sync: after each optimizer step, re-quantize every quantized linear's fprop weight in a
few grouped launches and hand the results to the modules (report §6.5, the step the report measured at 55 s).

Without it, each module re-quantizes its own weight on its next forward (two launches per weight, from the
weight cache). With it, all eligible weights go through one grouped re-quantizer per tile shape (the Triton
backend's ``WeightRequantizer``: one amax launch + one quantize launch, replayed as a CUDA graph), and each
module receives its quantized weight through ``set_quantized_weight``. Given ``minite_kernels.optim.AdamW`` as
the optimizer, the amax launch is replaced by the amaxes its step recorded, so every weight is read once.

Eligible: dense modules (``Linear``, ``LayerNormLinear``) whose recipe quantizes the fprop weight as NVFP4
per tensor with 1x16 or 16x16 tiles, round to nearest, no RHT, and whose backend for that spec has a grouped
re-quantizer that takes the weight (``Backend.grouped_sync_refusal`` / ``weight_requantizer``: the Triton
backend, for a 2-D BF16 weight on a kernel device). The others keep re-quantizing on their next forward;
``skipped`` lists them with the reason. The codes are the bytes the module's backend would produce (the same
kernels), so outputs do not change.

Example::

    sync = ModelWeightSync(model, optimizer)
    ...; optimizer.step(); sync.sync()   # -> {"perf/grouped_sync_weights": 196.0, ...}
"""

from __future__ import annotations

import torch

from minite_kernels.modules.functional import _route_quantize
from minite_kernels.modules.linear import QuantizedLinearMixin


def _why_not(module: torch.nn.Module) -> str | None:
    """None if ``module``'s fprop weight can be synced in a grouped launch, else the reason."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return "not a dense 2-D weight (grouped experts re-quantize per expert on their forward)"
    spec = module.qlinear_params.fprop.b
    if not spec.quantized:
        return f"recipe {module.qlinear_params.name!r} keeps the fprop weight in BF16"
    if spec.format != "nvfp4" or spec.scaling != "per_tensor" or spec.tile not in ((1, 16), (16, 16)):
        return f"fprop weight spec {spec.summary()} is not NVFP4 per-tensor 1x16/16x16"
    if spec.rht or spec.stochastic_rounding:
        return f"fprop weight spec {spec.summary()} uses RHT or stochastic rounding"
    return _quantizer(module).grouped_sync_refusal(w)


def _quantizer(module: torch.nn.Module):
    """The backend that quantizes ``module``'s fprop weight."""
    return _route_quantize(module.backend_for(module.weight.device), module.qlinear_params.fprop.b)


class ModelWeightSync:
    """Grouped re-quantization of a model's quantized linear weights (see the module docstring).

    ``optimizer``: if it records amaxes (``minite_kernels.optim.AdamW``) and owns every synced weight, its
    amaxes replace the amax pass whenever they are current. ``cuda_graph``: replay each re-quantizer's launches
    as a CUDA graph.
    """

    def __init__(self, model: torch.nn.Module, optimizer=None, *, cuda_graph: bool = True) -> None:
        self.skipped: list[tuple[str, str]] = []
        #: the skipped modules that do quantize their fprop weight: they re-quantize it on their next forward
        #: (empty: after :meth:`sync` every quantized weight is current, and no forward is needed for it)
        self.unsynced: list[str] = []
        by_weight: dict[int, tuple[torch.Tensor, list]] = {}
        for name, m in model.named_modules():
            if not isinstance(m, QuantizedLinearMixin):
                continue
            why = _why_not(m)
            if why is not None:
                self.skipped.append((name, why))
                if m.qlinear_params.fprop.b.quantized:
                    self.unsynced.append(name)
                continue
            by_weight.setdefault(id(m.weight), (m.weight, []))[1].append(m)  # tied weights: quantized once
        groups: dict[tuple, list] = {}
        for w, mods in by_weight.values():
            tile16 = mods[0].qlinear_params.fprop.b.tile == (16, 16)
            backend = _quantizer(mods[0])
            groups.setdefault((tile16, w.device, id(backend)), (backend, []))[1].append((w, mods))
        owned = {id(p) for g in getattr(optimizer, "param_groups", ()) for p in g["params"]}
        self._syncs: list[tuple[object, list]] = []
        for (tile16, _dev, _b), (backend, items) in groups.items():
            weights = [w for w, _ in items]
            amax_from = None
            if hasattr(optimizer, "amax_slots") and all(id(w) in owned for w in weights):
                amax_from = optimizer
            rq = backend.weight_requantizer(weights, tile16=tile16, cuda_graph=cuda_graph, amax_from=amax_from)
            self._syncs.append((rq, [mods for _, mods in items]))

    @property
    def num_weights(self) -> int:
        return sum(len(rq.weights) for rq, _ in self._syncs)

    def sync(self) -> dict[str, float]:
        """Re-quantize every synced weight now and install it in its modules; returns metrics."""
        given = 0
        for rq, module_lists in self._syncs:
            quantized = rq.sync()
            given += len(rq.weights) if rq.amax_given else 0
            for q, mods in zip(quantized, module_lists):
                for m in mods:
                    m.set_quantized_weight(q)
        return {
            "perf/grouped_sync_weights": float(self.num_weights),
            "perf/sync_amax_from_optimizer": float(given),
        }

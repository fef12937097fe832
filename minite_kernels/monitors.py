"""Numerical monitors: per-layer tensor statistics and NVFP4 quantization health, every N steps (report §4.4, §7.3).

Report §4.4: low-precision failures can emerge late in training, so we inspect activation, weight, output and
gradient minima, maxima, means and norms by module and step, and save tensors to reproduce anomalies.
:class:`TensorMonitor` attaches forward hooks (and, on the outputs, gradient hooks) to the modules of any
``nn.Module`` whose qualified name matches a glob, and records for each tensor kind
(``input`` = first positional input, ``output``, ``weight``, ``grad_output`` = gradient w.r.t. the output)::

    monitor/<layer>/<kind>/{amax, min, max, mean, norm, nonfinite_frac}
    monitor/<layer>/<kind>/nvfp4_{underflow_frac, saturation_frac, zero_scale_frac, rel_l2, snr_db}

with the NVFP4 statistics of :func:`quantization_stats` (computed by quantizing the tensor with the
reference quantizer, ``formats.quantize_nvfp4``):

- ``underflow_frac``: nonzero inputs that decode to exactly 0, over the nonzero inputs;
- ``saturation_frac``: elements whose rounding the E2M1 clamp changed, ``|x · enc| >= 7`` (an E2M1 grid
  continuing past 6 would round them to 8), in blocks with a nonzero scale, over all elements. With TE's scale
  rule ``|x · enc| <= 6 · (1 + 2^-4)`` for normal E4M3 scales, so this flags coarse subnormal block scales;
  ``|x · enc|`` slightly above 6 from the fp32 rounding of ``enc`` is not counted;
- ``zero_scale_frac``: blocks with a nonzero maximum whose E4M3 scale underflowed to 0, over all blocks;
- ``rel_l2``, ``snr_db``: report §2.3 (``minite_kernels.metrics``) of the dequantized tensor vs the original.

Worked example: x = [1e-3, 1, 0 x 14 | 2688, 0 x 15] under per-tensor NVFP4: S_enc = 2688/2688 = 1, the first
block's scale is e4m3(1/6) = 0.171875 and enc = 5.818, so 1e-3 scales to 0.0058 < 0.25 and decodes to 0:
underflow_frac = 1/3 (one of three nonzero inputs).

Cost: hooks return immediately on inactive steps; on an active step (``step % every == 0``) each watched
tensor is reduced a few times and quantized once. When a module runs several times in one step
(micro-batches), ``amax``/``max`` keep the maximum, ``min`` the minimum, the rest the mean over calls.
Tensors with NaN/Inf are counted in ``nonfinite_frac`` (NVFP4 statistics are skipped for them) and, with
``dump_dir``, saved atomically (``torch.save`` to a temp file, then ``os.replace``) to reproduce the anomaly.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from typing_extensions import Self

from . import metrics
from .formats import apply_rht, quantize_nvfp4

KINDS = ("input", "output", "weight", "grad_output")
DEFAULT_NVFP4: Mapping[str, Any] = MappingProxyType({"scaling": "per_tensor"})
DEFAULT_WEIGHT_NVFP4: Mapping[str, Any] = MappingProxyType({"tile": (16, 16)})
_MAX_STATS = ("amax", "max")
_MIN_STATS = ("min",)


def quantization_stats(x: torch.Tensor, **nvfp4_kwargs: Any) -> dict[str, float]:
    """NVFP4 health of ``x`` (quantized along its last dim with ``quantize_nvfp4(x, **nvfp4_kwargs)``).

    Returns ``{underflow_frac, saturation_frac, zero_scale_frac, rel_l2, snr_db}`` as floats (see the module
    docstring). With ``rht=True`` the statistics are taken in the transformed domain, where quantization happens.
    """
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
    q = quantize_nvfp4(x2, **nvfp4_kwargs)
    ref = apply_rht(x2).to(torch.float32) if q.rht else x2
    deq = q.dequantize()
    m, k = ref.shape
    nonzero = ref != 0
    n_nonzero = int(nonzero.sum())
    underflow = int((nonzero & (deq == 0)).sum())
    enc = q.encode_factors()  # [M, K//16]
    scaled = ref.view(m, k // 16, 16) * enc.unsqueeze(-1)
    live = (q.scales_f32() != 0).unsqueeze(-1)
    saturated = int(((scaled.abs() >= 7.0) & live).sum())
    vmax = ref.abs().view(m, k // 16, 16).amax(-1)
    zero_scale = int(((q.scales_f32() == 0) & (vmax > 0)).sum())
    return {
        "underflow_frac": underflow / n_nonzero if n_nonzero else 0.0,
        "saturation_frac": saturated / ref.numel() if ref.numel() else 0.0,
        "zero_scale_frac": zero_scale / vmax.numel() if vmax.numel() else 0.0,
        "rel_l2": metrics.rel_l2(ref, deq) if ref.numel() else 0.0,
        "snr_db": metrics.snr_db(ref, deq) if ref.numel() else math.inf,
    }


def tensor_stats(x: torch.Tensor, nvfp4: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Basic statistics of ``x`` (fp64 reductions) plus, when ``nvfp4`` is a kwargs dict and the last dim is a
    multiple of 16 and ``x`` is finite, :func:`quantization_stats` under the ``nvfp4_`` prefix."""
    x = x.detach()
    if x.numel() == 0:
        return {}
    xd = x.to(torch.float64)
    finite = torch.isfinite(xd)
    n_bad = int((~finite).sum())
    xf = xd[finite] if n_bad else xd.reshape(-1)
    out: dict[str, float] = {"nonfinite_frac": n_bad / x.numel()}
    if xf.numel():
        out.update(
            amax=float(xf.abs().max()),
            min=float(xf.min()),
            max=float(xf.max()),
            mean=float(xf.mean()),
            norm=float(torch.linalg.vector_norm(xf)),
        )
    if nvfp4 is not None and not n_bad and x.dim() >= 1 and x.shape[-1] % 16 == 0 and x.is_floating_point():
        out.update({f"nvfp4_{k}": v for k, v in quantization_stats(x, **nvfp4).items()})
    return out


def _save_atomic(obj: Any, path: str) -> None:
    from minite_util.fileio import atomic_path

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _looks_like_linear(module: nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2


class TensorMonitor:
    """Record per-layer tensor statistics every ``every`` steps (see the module docstring).

    Args:
        model: any ``nn.Module``.
        include / exclude: glob patterns on qualified module names (``fnmatch``; e.g. ``"*.mlp.*"``).
        every: record on steps where ``step % every == 0`` (call :meth:`step` once per optimizer step).
        kinds: subset of ``("input", "output", "weight", "grad_output")``.
        nvfp4: ``quantize_nvfp4`` kwargs for inputs/outputs/gradients (default per-tensor 1x16), or None to
            skip NVFP4 statistics.
        weight_nvfp4: kwargs for weights (default per-tensor 16x16 tiles, the recipe default), or None.
        module_filter: which modules qualify (default: those with a 2-D ``weight``, i.e. linear-like).
        dump_dir: where to save tensors holding NaN/Inf (``step<N>_<layer>_<kind>.pt``), or None.
        prefix: metric namespace (``"monitor"``).

    Usage::

        mon = TensorMonitor(model, include=["*layers.0.*"], every=10)
        for batch in data:
            loss = model(batch).sum(); loss.backward(); opt.step()
            wandb.log(mon.collect(), step=mon.current_step); mon.step()
        mon.detach()
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        include: Iterable[str] = ("*",),
        exclude: Iterable[str] = (),
        every: int = 1,
        kinds: Iterable[str] = KINDS,
        nvfp4: Mapping[str, Any] | None = DEFAULT_NVFP4,
        weight_nvfp4: Mapping[str, Any] | None = DEFAULT_WEIGHT_NVFP4,
        module_filter: Callable[[nn.Module], bool] = _looks_like_linear,
        dump_dir: str | os.PathLike[str] | None = None,
        prefix: str = "monitor",
    ) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r} must be a positive integer (record every N steps)")
        self.kinds = tuple(kinds)
        for k in self.kinds:
            if k not in KINDS:
                raise ValueError(f"kinds: {k!r} is not a tensor kind; choose from {list(KINDS)}")
        self.include, self.exclude = list(include), list(exclude)
        self.every = every
        self.nvfp4 = None if nvfp4 is None else dict(nvfp4)
        self.weight_nvfp4 = None if weight_nvfp4 is None else dict(weight_nvfp4)
        self.dump_dir = os.fspath(dump_dir) if dump_dir is not None else None
        self.prefix = prefix
        self.current_step = 0
        self.modules = {
            name: mod
            for name, mod in model.named_modules()
            if name
            and module_filter(mod)
            and any(fnmatch.fnmatchcase(name, p) for p in self.include)
            and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)
        }
        if not self.modules:
            names = [n for n, m in model.named_modules() if n and module_filter(m)]
            raise ValueError(
                f"TensorMonitor: no module matches include={self.include} exclude={self.exclude}; "
                f"candidate modules: {names[:10]}{' ...' if len(names) > 10 else ''}"
            )
        self._records: dict[str, list[float]] = defaultdict(list)
        self._handles: list[Any] = []
        self.dumped: list[str] = []
        self.attach()

    # ------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> bool:
        return self.current_step % self.every == 0

    def attach(self) -> None:
        if self._handles:
            return
        for name, mod in self.modules.items():
            self._handles.append(mod.register_forward_hook(self._make_hook(name)))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def step(self) -> None:
        """Advance to the next step (call once per optimizer step)."""
        self.current_step += 1

    def collect(self) -> dict[str, float]:
        """Return the statistics recorded since the last call (reduced over calls) and clear them."""
        out: dict[str, float] = {}
        for key, vals in self._records.items():
            stat = key.rsplit("/", 1)[-1]
            if stat in _MAX_STATS:
                out[key] = max(vals)
            elif stat in _MIN_STATS:
                out[key] = min(vals)
            else:
                out[key] = sum(vals) / len(vals)
        self._records.clear()
        return out

    # ------------------------------------------------------------------ hooks
    def _record(self, layer: str, kind: str, x: torch.Tensor, step: int) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return
        with torch.no_grad():
            stats = tensor_stats(x, self.weight_nvfp4 if kind == "weight" else self.nvfp4)
        for stat, val in stats.items():
            self._records[f"{self.prefix}/{layer}/{kind}/{stat}"].append(val)
        if self.dump_dir is not None and stats.get("nonfinite_frac", 0.0) > 0:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", layer)
            path = os.path.join(self.dump_dir, f"step{step}_{safe}_{kind}.pt")
            _save_atomic(x.detach().cpu(), path)
            self.dumped.append(path)

    def _make_hook(self, layer: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not self.active:
                return
            step = self.current_step
            if "input" in self.kinds and args and isinstance(args[0], torch.Tensor):
                self._record(layer, "input", args[0], step)
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            if "output" in self.kinds and isinstance(out, torch.Tensor):
                self._record(layer, "output", out, step)
            if "weight" in self.kinds:
                self._record(layer, "weight", module.weight, step)
            if "grad_output" in self.kinds and isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda g: self._record(layer, "grad_output", g, step))

        return hook

"""Backend factory with lazy imports (report §4.2: operator imports are deferred to the factory branch).

``get_backend("auto")`` routes every GEMM to the first backend, in the order
``te > flashinfer > triton > emulated``, that is available on the device and supports that GEMM's operand
specs; ``plan_recipe`` explains the choice per GEMM (used by ``python -m minite_kernels doctor``).
Nothing here imports triton, TransformerEngine or FlashInfer until a backend is requested.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

from minite_kernels.backends.base import (
    Backend,
    BackendUnavailable,
    QuantizedOperand,
    capability_str,
    cuda_capability,
    dequantize_operand,
    native_fp4_gate,
)
from minite_kernels.recipes import GEMM_OPERANDS, GEMMS, OperandSpec, PrecisionRecipe
from minite_util.choices import did_you_mean

__all__ = [
    "BACKEND_NAMES",
    "NAMED_ONLY",
    "AutoBackend",
    "Backend",
    "BackendUnavailable",
    "backend_class",
    "backend_status",
    "dequantize_operand",
    "get_backend",
    "plan_recipe",
]

#: concrete backends in "auto" preference order
BACKEND_NAMES = ("te", "flashinfer", "triton", "emulated")
#: backends "auto" never routes to, used by name: "strict" is what precision.alignment=strict runs
#: (``minite_kernels/backends/strict.py``)
NAMED_ONLY = ("strict",)
_CLASSES = {
    "emulated": ("minite_kernels.backends.emulated", "EmulatedBackend"),
    "strict": ("minite_kernels.backends.strict", "StrictBackend"),
    "triton": ("minite_kernels.backends.triton", "TritonBackend"),
    "te": ("minite_kernels.backends.te", "TEBackend"),
    "flashinfer": ("minite_kernels.backends.flashinfer", "FlashInferBackend"),
}
ALIASES = {
    "reference": "emulated",
    "torch": "emulated",
    "transformer_engine": "te",
    "transformer-engine": "te",
}


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    valid = ("auto",) + BACKEND_NAMES + NAMED_ONLY
    if key not in valid:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(valid)}"
                         f"{did_you_mean(key, valid + tuple(ALIASES), cutoff=0.0)}")
    return key


def backend_class(name: str) -> type[Backend]:
    """Import and return a backend class; :class:`BackendUnavailable` (with the reason) if it cannot import."""
    key = _canonical(name)
    if key == "auto":
        return AutoBackend
    module_name, attr = _CLASSES[key]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise BackendUnavailable(f"{key}: module {module_name} is not part of this installation") from e
        raise BackendUnavailable(
            f"{key}: cannot import {module_name} ({e.name or e} is not installed)"
        ) from e
    except Exception as e:  # a broken optional dependency must not break the factory
        raise BackendUnavailable(f"{key}: importing {module_name} failed: {type(e).__name__}: {e}") from e
    cls = getattr(module, attr, None)
    if cls is None:
        raise BackendUnavailable(f"{key}: {module_name} has no {attr}")
    return cls


def _device(device: Any) -> torch.device:
    if device is None:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def backend_status(name: str, device: Any = None) -> tuple[bool, str]:
    """(ok, reason) for one backend on ``device`` without raising."""
    try:
        cls = backend_class(name)
    except BackendUnavailable as e:
        return False, str(e)
    try:
        return cls.availability(_device(device))
    except Exception as e:  # noqa: BLE001 - availability must never crash doctor
        return False, f"{name}: availability check failed: {type(e).__name__}: {e}"


@functools.cache
def _instance(key: str, device: torch.device) -> Backend:
    cls = backend_class(key)
    ok, why = cls.availability(device)
    if not ok:
        raise BackendUnavailable(f"backend {key!r} is not available on {device}: {why}")
    return cls(device)


def get_backend(name: str = "auto", device: Any = None) -> Backend:
    """A backend instance for ``device`` (default: the current CUDA device, else CPU); cached per (name, device).

    ``"auto"`` routes per GEMM (see module doc). An explicit name raises :class:`BackendUnavailable` with
    the reason if that backend cannot run here.
    """
    return _instance(_canonical(name), _device(device))


class AutoBackend(Backend):
    """Routes each quantize/GEMM to the first available backend that supports it (te > flashinfer > triton >
    emulated); the emulated backend supports everything, so routing always succeeds."""

    name = "auto"

    def __init__(self, device: Any = None) -> None:
        super().__init__(_device(device))
        self.status: dict[str, tuple[bool, str]] = {}
        self.candidates: list[Backend] = []
        for key in BACKEND_NAMES:
            if key != "emulated" and self.device.type != "cuda":  # GPU backends are not even imported
                ok, why = False, f"{key}: needs a CUDA device; tensors are on {self.device}"
            else:
                ok, why = backend_status(key, self.device)
            self.status[key] = (ok, why)
            if ok:
                self.candidates.append(_instance(key, self.device))

    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        return True, "auto: routes each GEMM to the best available backend (emulated always works)"

    def with_kernels(self, kernels) -> AutoBackend:
        """The same routing over the candidates bound to ``kernels`` (``Backend.with_kernels``), memoised per
        choice."""
        views = self.__dict__.setdefault("_views", {})
        view = views.get(kernels)
        if view is None:
            view = object.__new__(type(self))
            view.__dict__.update(self.__dict__)
            view.candidates = [b.with_kernels(kernels) for b in self.candidates]
            views[kernels] = view
        return view

    def plan_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[Backend, str]:
        """(backend, reason) for one GEMM; the reason also says why faster backends were not used."""
        refused: list[str] = []
        for b in self.candidates:
            ok, why = b.supports_gemm(a_spec, b_spec)
            if ok:
                notes = [why]
                if b.name not in ("te", "flashinfer"):
                    native_ok, native_why = native_fp4_gate(
                        self.device if self.device.type == "cuda" else None
                    )
                    if not native_ok:
                        notes.append(native_why)
                notes += refused
                return b, "; ".join(notes)
            refused.append(f"{b.name} cannot: {why}")
        raise BackendUnavailable(
            f"no backend supports {a_spec.summary()} x {b_spec.summary()}"
        )  # pragma: no cover

    def clear_cache(self) -> None:
        """Forget what the routed backends remember of their last input (the Triton backend's shared-input
        quantization): needed before and after a CUDA-graph capture, whose pool must own what stays alive."""
        for b in self.candidates:
            clear = getattr(b, "clear_cache", None)
            if clear is not None:
                clear()

    def plan_quantize(self, spec: OperandSpec) -> Backend:
        for b in self.candidates:
            if b.supports_quantize(spec)[0]:
                return b
        raise BackendUnavailable(f"no backend can quantize {spec.summary()}")  # pragma: no cover

    def quantize(self, x2d, spec, *, generator=None) -> QuantizedOperand:
        return self.plan_quantize(spec).quantize(x2d, spec, generator=generator)

    def qgemm_nt(
        self, a2d, b2d, a_spec, b_spec, *, out_dtype=None, b_quantized=None, generator=None, a_quantized=None
    ):
        if not a_spec.quantized and not b_spec.quantized:
            return super().qgemm_nt(
                a2d,
                b2d,
                a_spec,
                b_spec,
                out_dtype=out_dtype,
                b_quantized=b_quantized,
                a_quantized=a_quantized,
            )
        backend, _ = self.plan_gemm(a_spec, b_spec)
        return backend.qgemm_nt(
            a2d,
            b2d,
            a_spec,
            b_spec,
            out_dtype=out_dtype,
            b_quantized=b_quantized,
            generator=generator,
            a_quantized=a_quantized,
        )

    def _quantize(self, x2d, spec, *, generator=None):  # pragma: no cover - quantize() is overridden
        return self.plan_quantize(spec)._quantize(x2d, spec, generator=generator)

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype):  # pragma: no cover - qgemm_nt() is overridden
        return self.plan_gemm(a_spec, b_spec)[0]._gemm(qa, qb, a_spec, b_spec, out_dtype=out_dtype)


def plan_recipe(recipe: PrecisionRecipe, backend: str = "auto", device: Any = None) -> list[dict]:
    """For each GEMM of ``recipe``: which backend runs it on ``device`` and why.

    Returns ``[{"gemm", "operands", "spec", "backend", "reason", "ok", "te_quantizer"}, ...]``; ``ok=False``
    when the requested backend cannot run that GEMM; ``te_quantizer`` holds the TE quantizer arguments the
    ``te`` backend would use for each quantized operand (None for a BF16 operand).
    """
    dev = _device(device)
    rows = []
    try:
        impl = get_backend(backend, dev)
    except BackendUnavailable as e:
        impl, err = None, str(e)
    for g in GEMMS:
        spec = recipe.gemm(g)
        a_name, b_name = GEMM_OPERANDS[g]
        row = {"gemm": g, "operands": f"A={a_name}, B={b_name}", "spec": spec.summary()}
        if not spec.quantized:
            row.update(
                backend="torch",
                reason="BF16 GEMM (no quantization): torch.matmul in the parameter dtype",
                ok=True,
            )
        elif impl is None:
            row.update(backend=_canonical(backend), reason=err, ok=False)
        elif isinstance(impl, AutoBackend):
            b, why = impl.plan_gemm(spec.a, spec.b)
            row.update(backend=b.name, reason=why, ok=True)
        else:
            ok, why = impl.supports_gemm(spec.a, spec.b)
            row.update(backend=impl.name, reason=why, ok=ok)
        if spec.quantized:
            from minite_kernels.backends.te import te_quantizer_kwargs

            row["te_quantizer"] = {
                side: te_quantizer_kwargs(op) if op.quantized else None
                for side, op in (("a", spec.a), ("b", spec.b))
            }
        rows.append(row)
    return rows


def device_summary(device: Any = None) -> dict:
    """torch/CUDA facts for doctor."""
    dev = _device(device)
    cap = cuda_capability(dev) if dev.type == "cuda" else None
    native_ok, native_why = native_fp4_gate(dev if dev.type == "cuda" else None)
    return {
        "device": str(dev),
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(dev) if cap is not None else None,
        "capability": capability_str(cap),
        "native_fp4": native_ok,
        "native_fp4_reason": native_why,
    }

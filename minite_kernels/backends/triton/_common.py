"""Shared helpers of the Triton backend: availability, interpreter detection, the programmatic dependent launch
switch and launch options, one-time fallback warnings."""

from __future__ import annotations

import os
import warnings

import torch

from minite_kernels.formats.nvfp4 import DECODE_FACTOR_MAX, TE_ORDER_AMAX_MAX  # noqa: F401 (for the kernels)
from minite_kernels.options import FIELDS, options

#: fp32 constants used by the kernels (the same values the reference ``minite_kernels.formats`` uses)
FLT_MAX = 3.4028234663852886e38
SIXTH = 0.1666666716337204  # fl(1/6): the fp32 nearest to 1/6
INV_2688 = 0.00037202381645329297  # fl(1/2688)
INV_2688_SQ = 1.3840171675383317e-07  # fl(1/2688**2), used only in GEMM epilogues (tolerance-checked)

_WARNED: set[str] = set()


#: read once, when the backend's kernel modules are imported: that is when ``@triton.jit`` makes each kernel an
#: interpreted or a compiled function, so a later change of the variable changes no kernel, and nor does it here
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return _INTERPRET


def kernel_device_ok(x: torch.Tensor) -> bool:
    """Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter."""
    return x.is_cuda or (interpret_mode() and x.device.type == "cpu")


PDL_MODES = FIELDS["pdl"][1]
#: what an FP4-weight GEMM launched with PDL prefetches into L2 before it waits, per ``options().pdl``
PDL_PREFETCH = {"on": "slice", "head": "head", "bare": "none"}


def pdl_mode() -> str:
    """``options().pdl``: any value but ``off`` launches the decode path's kernels (the pair kernels, the
    FP4-weight GEMM and the fused norm/SiLU quantizers before it) with programmatic dependent launch where the GPU
    has it (sm_90+; not under the interpreter). The values differ only in what an FP4-weight GEMM asks the L2 for
    before it waits (:data:`PDL_PREFETCH`): ``on`` its whole weight slice, ``head`` the slice's first pipeline
    stages, ``bare`` nothing. Off by default: measured, it helps only while a block's packed weights fit the L2,
    and costs time once they come from HBM, as they do in a real model (``benchmarks/RESULTS.md``: the pair
    kernels on the H200; the FP4-weight GEMM in the 4B rollout on an H100, with each of the three prefetches)."""
    return options().pdl


_PDL_CAPABLE: dict[int, bool] = {}


def pdl_capable(x: torch.Tensor) -> bool:
    """Whether ``x``'s device can launch kernels with programmatic dependent launch: a CUDA (not ROCm) GPU
    of compute capability 9.0 or newer, Triton with grid dependency control, not the interpreter."""
    if not x.is_cuda or torch.version.hip is not None or interpret_mode():
        return False
    idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
    ok = _PDL_CAPABLE.get(idx)
    if ok is None:
        try:
            from triton.language.extra.cuda import gdc_wait  # noqa: F401

            ok = torch.cuda.get_device_capability(idx)[0] >= 9
        except ImportError:
            ok = False
        _PDL_CAPABLE[idx] = ok
    return ok


def pdl_enabled(x: torch.Tensor) -> bool:
    """:func:`pdl_capable` and ``MINITE_TRITON_PDL`` other than ``off``."""
    return pdl_mode() != "off" and pdl_capable(x)  # the memoised switch first: off is the common case


def pdl_on(x: torch.Tensor, pdl: bool | None) -> bool:
    """Whether a kernel on ``x``'s device is compiled with grid dependency control: ``pdl``, or
    :func:`pdl_enabled` where it is None; asked for where :func:`pdl_capable` says no, an error."""
    on = pdl_enabled(x) if pdl is None else bool(pdl)
    if on and not pdl_capable(x):
        raise ValueError(
            "programmatic dependent launch needs a CUDA GPU of compute capability 9.0+ and Triton >= 3.3 "
            f"(not the interpreter); pass pdl=None or False on {x.device}"
        )
    return on


def _pdl_launch(x: torch.Tensor, pdl: bool | None) -> dict:
    """The ``PDL`` constexpr and the ``launch_pdl`` launch option of a kernel launched with programmatic
    dependent launch on ``x``'s device (:func:`pdl_on`), or nothing."""
    return {"PDL": True, "launch_pdl": True} if pdl_on(x, pdl) else {}


def warn_once(key: str, message: str) -> None:
    """Emit ``message`` as a RuntimeWarning the first time ``key`` is seen in this process."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def triton_import_status() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the installation
        return False, f"triton is not importable ({type(e).__name__}: {e}); pip install 'minite-rl[gpu]'"
    return True, f"triton {triton.__version__}"


def patch_interpreter_for_numpy2() -> None:
    """Triton 3.6's CPU interpreter turns loop bounds into ``int(ndarray)``, which NumPy >= 2.4 refuses for
    1-element arrays; re-register ``__index__`` with ``.item()``. Only used under ``TRITON_INTERPRET=1``."""
    try:
        from triton.runtime import interpreter as _interp
    except Exception:  # pragma: no cover
        return
    if getattr(_interp, "_minite_patched", False):
        return
    original = _interp._patch_lang_tensor

    def _patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interp._patch_lang_tensor = _patched
    _interp._minite_patched = True


if interpret_mode():
    patch_interpreter_for_numpy2()

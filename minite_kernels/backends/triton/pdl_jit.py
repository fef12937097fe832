"""Programmatic dependent launch (PDL) as device functions, shared by the kernels that use it
(``decode_kernels.py``, ``fp4w.py``, ``norm_quant.py``).

PDL (sm_90+) lets a kernel launched with the PDL attribute start while the kernel before it on the stream still
runs, once every program of that kernel has executed ``griddepcontrol.launch_dependents``
(:func:`gdc_launch_dependents`) or exited. The dependent then waits with ``griddepcontrol.wait``
(:func:`gdc_wait`) until the previous kernel has finished and its writes are visible. The rule that keeps it
correct: before the wait a kernel may touch only weight-side addresses (data no kernel of the step writes; here
only through L2 prefetches, :func:`_prefetch_l2`, and the pair kernel's first weight tile); every read of data a
previous kernel writes, and every global write, comes after the wait. A kernel that triggers early but is not
itself launched with PDL needs no wait: it started after its predecessor finished.

The host side (whether PDL is on, the launch options) is ``_common.pdl_enabled`` / ``_common._pdl_launch``.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # Hopper grid dependency control (PTX griddepcontrol), in Triton since 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: pdl_capable() is False there, PDL never compiles

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass


#: ``cp.async.bulk.prefetch.L2`` of ``$2`` bytes at address ``$1``, issued by thread 0 of the program only
#: (skipped when ``$2 <= 0``). A prefetch moves no data into registers, so it cannot read a stale value:
#: the loads after ``griddepcontrol.wait`` still read what the previous kernel wrote (the L2 is coherent)
_PREFETCH_ASM = tl.constexpr(
    "{ .reg .pred p, q; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; setp.gt.s32 q, $2, 0; "
    "and.pred p, p, q; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
)


@triton.jit
def _prefetch_l2(base, start, end):
    """Ask the L2 for the bytes ``[start, end)`` after pointer ``base``, the range shrunk inward to 16-byte
    boundaries as the bulk prefetch needs (no byte outside it is touched; nothing when it is empty)."""
    a = base.to(tl.int64)
    lo = (a + start + 15) // 16 * 16
    hi = (a + end) // 16 * 16
    tl.inline_asm_elementwise(
        _PREFETCH_ASM, "=r,l,r", [lo, (hi - lo).to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1
    )


__all__ = ["_PREFETCH_ASM", "_prefetch_l2", "gdc_launch_dependents", "gdc_wait"]

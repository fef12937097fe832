"""Strict alignment on CPU: every reduction on the token path computed in fp64 and rounded once.

Sampler and learner run the same weights and formats through different shapes (one decode row against a
full sequence, a KV-cache attention against a causal one), and a float reduction's result depends on its
order, which kernels choose by shape. That rounding noise flips NVFP4 codes and the flips cascade (report
§2.2). In fp64 the noise is ~1e-16 relative, far below an fp32 or bf16 rounding step, so computing each
reduction in fp64 and rounding its result once to the input's dtype gives the same bits whatever the shape,
except when the exact value lies within ~1e-16 of a rounding boundary (about 2^-29 of the values)::

    y = round_to_dtype( reduce_fp64( upcast(inputs) ) )      for linear, matmul, attention, softmax, mean, ...

Elementwise ops need nothing: they round once per element in any order. Quantizers are already row-local
(per-token scales), and max is exact.

:class:`StrictMode` is a ``TorchFunctionMode``: inside ``with StrictMode():`` the ops of :data:`REDUCTIONS` on
fp32 / bf16 / fp16 tensors run that way, whoever calls them (HF modules, minite's emulated GEMM, the
learner's log-softmax). The forward is covered; autograd's backward kernels are not (they do not affect the
log-probs that sampler and learner compare). It is a CPU mode: on CUDA it would hit fp64 at 1/60 of the
tensor-core rate.

Worked example: sum([1e8, 1, -1e8]) in fp32 is 0 or 1 depending on the order; in fp64 it is exactly 1 in any
order, then rounded once to fp32: 1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_LOW = (torch.float32, torch.bfloat16, torch.float16)

#: ops whose result depends on a reduction order (Tensor methods and functions alike)
REDUCTIONS = {
    F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
    torch.bmm, torch.Tensor.bmm, torch.addmm, torch.baddbmm, torch.einsum,
    F.scaled_dot_product_attention,
    F.softmax, torch.softmax, torch.Tensor.softmax, F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax,
    torch.logsumexp, torch.Tensor.logsumexp,
    torch.sum, torch.Tensor.sum, torch.mean, torch.Tensor.mean, torch.var, torch.Tensor.var,
    torch.cumsum, torch.Tensor.cumsum, torch.norm, torch.Tensor.norm,
}


def _dtype_of(args) -> torch.dtype | None:
    """The common low-precision float dtype of the tensor arguments (None: leave the op alone)."""
    dt = None
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            if a.dtype not in _LOW or (dt is not None and a.dtype != dt):
                return None
            dt = a.dtype
    return dt


def _up(a):
    return a.double() if isinstance(a, torch.Tensor) and a.dtype in _LOW else a


def strict_active() -> bool:
    """Whether a :class:`StrictMode` is active on this thread (code that replays work later, such as an
    activation-checkpoint recompute in backward, uses it to replay under the same mode)."""
    from torch.overrides import _get_current_function_mode_stack

    return any(isinstance(m, StrictMode) for m in _get_current_function_mode_stack())


class StrictMode(TorchFunctionMode):
    """Inside it, the :data:`REDUCTIONS` on low-precision CPU tensors compute in fp64 and round once."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in REDUCTIONS:
            flat = [*args, *kwargs.values()]
            dt = _dtype_of(flat)
            if dt is not None and not any(isinstance(a, torch.Tensor) and a.is_cuda for a in flat):
                kw = {k: _up(v) for k, v in kwargs.items() if k != "dtype"}
                out = func(*[_up(a) for a in args], **kw)
                want = kwargs.get("dtype") or dt
                return out.to(want) if isinstance(out, torch.Tensor) else out
        return func(*args, **kwargs)

"""Strict alignment: every reduction on the token path computed so that a row's bits do not depend on its batch.

Sampler and learner run the same weights and formats through different shapes (one decode row against a
full sequence, a KV-cache attention against a causal one), and a float reduction's result depends on its
order, which kernels choose by shape. That rounding noise flips NVFP4 codes and the flips cascade (report
§2.2, ``docs/``). :class:`StrictMode` removes it in one of two ways, per op and device:

- ``fp64`` (CPU): each reduction in fp64, its result rounded once to the input's dtype. The fp64 noise is
  ~1e-16 relative, far below an fp32 or bf16 rounding step, so the bits are the same whatever the shape, except
  when the exact value lies within ~1e-16 of a rounding boundary (about 2^-29 of fp32 values)::

      y = round_to_dtype( reduce_fp64( upcast(inputs) ) )

- ``kernels`` (CUDA): the batch-invariant Triton kernels of ``backends/triton/batch_invariant.py``, one fixed
  reduction order per output element, for the ops that carry the token path: ``F.linear`` and 2-d matmuls,
  ``scaled_dot_product_attention`` (boolean or 0/-inf masks whose valid keys per query are one run, as causal and
  padding masks are), and sum / mean / softmax / log_softmax / logsumexp over the last dim. The other
  :data:`REDUCTIONS` (batched matmuls, einsum, other dims) fall back to fp64, on the GPU too. fp64 alone would be
  strict on a GPU as well, but at 1/15 of the bf16 tensor-core rate on an H200.

Elementwise ops need nothing: they round once per element in any order. Quantizers are already row-local
(per-token scales), and max is exact.

Inside ``with StrictMode():`` the ops of :data:`REDUCTIONS` on fp32 / bf16 / fp16 tensors run that way, whoever
calls them (HF modules, minite's emulated GEMM, the learner's log-softmax). Under autograd the kernels' outputs
carry the gradient of PyTorch's own op (recomputed in backward): the forward is strict, the backward is the
ordinary one (it does not affect the log-probs that sampler and learner compare).

Worked example: sum([1e8, 1, -1e8]) in fp32 is 0 or 1 depending on the order; in fp64 it is exactly 1 in any
order, then rounded once to fp32: 1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from minite_kernels.capture import capturing

_LOW = (torch.float32, torch.bfloat16, torch.float16)
#: how reductions are made order-free: per device (``auto``), always fp64, or always the Triton kernels
KERNELS = ("auto", "fp64", "triton")

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
_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm}
_SUMS = {torch.sum: False, torch.Tensor.sum: False, torch.mean: True, torch.Tensor.mean: True}
_ROW_FNS = {F.softmax: "softmax", torch.softmax: "softmax", torch.Tensor.softmax: "softmax",
            F.log_softmax: "log_softmax", torch.log_softmax: "log_softmax", torch.Tensor.log_softmax: "log_softmax",
            torch.logsumexp: "logsumexp", torch.Tensor.logsumexp: "logsumexp"}


#: what ``precision.backend`` may be under strict alignment, and the minite backend each runs the linears on
BACKENDS = {"auto": "strict", "strict": "strict", "emulated": "emulated"}


def linear_backend(requested: str = "auto") -> str:
    """The minite backend quantized linears run on under strict alignment. ``auto``: ``strict``, the emulated
    backend's dequantized GEMM (which :class:`StrictMode` makes batch-invariant) with the Triton quantizer where
    it runs (``backends/strict.py``); ``emulated``: the pure-PyTorch reference throughout."""
    if requested not in BACKENDS:
        raise ValueError(f"strict alignment runs the linears on backend {', '.join(BACKENDS)}; got {requested!r}")
    return BACKENDS[requested]


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


def _active() -> StrictMode | None:
    """The innermost active :class:`StrictMode` of this thread, or None."""
    from torch.overrides import _get_current_function_mode_stack

    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, StrictMode)]
    return modes[-1] if modes else None


def strict_active() -> bool:
    """Whether a :class:`StrictMode` is active on this thread (code that replays work later, such as an
    activation-checkpoint recompute in backward, uses it to replay under the same mode)."""
    return _active() is not None


class StrictMode(TorchFunctionMode):
    """Inside it, the :data:`REDUCTIONS` on low-precision tensors are order-free: fp64 rounded once on CPU, the
    batch-invariant kernels on CUDA (``kernels``: ``auto``; ``fp64`` or ``triton`` force one way everywhere,
    ``triton`` on CPU tensors only under Triton's interpreter, for tests)."""

    def __init__(self, kernels: str = "auto") -> None:
        super().__init__()
        if kernels not in KERNELS:
            raise ValueError(f"unknown StrictMode kernels {kernels!r}; valid: {', '.join(KERNELS)}")
        self.kernels = kernels

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in REDUCTIONS:
            flat = [*args, *kwargs.values()]
            dt = _dtype_of(flat)
            if dt is not None:
                if self._use_kernels(flat):
                    out = _kernel_op(func, args, kwargs)
                    if out is not NotImplemented:
                        return out
                kw = {k: _up(v) for k, v in kwargs.items() if k != "dtype"}
                out = func(*[_up(a) for a in args], **kw)
                want = kwargs.get("dtype") or dt
                return out.to(want) if isinstance(out, torch.Tensor) else out
        return func(*args, **kwargs)

    def _use_kernels(self, flat) -> bool:
        if self.kernels == "fp64":
            return False
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in flat)
        if self.kernels == "auto":
            return cuda
        if not cuda:
            from minite_kernels.backends.triton._common import interpret_mode

            if not interpret_mode():
                raise RuntimeError("StrictMode(kernels='triton') on CPU tensors runs the Triton kernels in Triton's "
                                   "interpreter only (TRITON_INTERPRET=1); use kernels='auto' or 'fp64' on CPU")
        return True


# ---------------------------------------------------------------------------------------------- kernel ops
class _RefGrad(torch.autograd.Function):
    """Forward: ``fast(*xs)``; backward: the gradient of ``ref(*xs)``, PyTorch's own op, recomputed."""

    @staticmethod
    def forward(ctx, fast, ref, *xs):
        ctx.ref = ref
        ctx.save_for_backward(*xs)
        return fast(*xs)

    @staticmethod
    def backward(ctx, grad):
        xs = ctx.saved_tensors
        need = ctx.needs_input_grad[2:]
        with torch.enable_grad(), torch._C.DisableTorchFunction():
            leaves = [x.detach().requires_grad_(n) for x, n in zip(xs, need)]
            out = ctx.ref(*leaves)
            wanted = [x for x, n in zip(leaves, need) if n]
            got = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        return (None, None, *[next(got) if n else None for n in need])


def _run(fast, ref, *xs: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return _RefGrad.apply(fast, ref, *xs)
    return fast(*xs)


def _kernel_op(func, args, kwargs):
    """The batch-invariant kernel for this call, or NotImplemented (then fp64)."""
    from minite_kernels.backends.triton import batch_invariant as bi

    if func is F.linear:
        x, w = args[0], (args[1] if len(args) > 1 else kwargs["weight"])
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        if w.dim() != 2 or x.dim() < 1:
            return NotImplemented
        if b is None:
            return _run(bi.linear, F.linear, x, w)
        if b.dim() != 1:
            return NotImplemented
        return _run(bi.linear, F.linear, x, w, b)
    if func in _MATMULS:
        a, b = args[0], args[1]
        if b.dim() != 2 or a.dim() < 1 or (func in (torch.mm, torch.Tensor.mm) and a.dim() != 2):
            return NotImplemented
        return _run(lambda x, m: bi.linear(x, m.t()), torch.matmul, a, b)
    if func is torch.addmm:
        c, a, b = args[:3]
        if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1 or c.dim() != 1 or a.dim() != 2:
            return NotImplemented
        return _run(lambda bias, x, m: bi.linear(x, m.t(), bias), torch.addmm, c, a, b)
    if func is F.scaled_dot_product_attention:
        return _sdpa(bi, *args, **kwargs)
    if func in _SUMS:
        return _sum(bi, func, _SUMS[func], args, kwargs)
    if func in _ROW_FNS:
        return _row_fn(bi, func, _ROW_FNS[func], args, kwargs)
    return NotImplemented


def _last_dim(x: torch.Tensor, dim) -> bool:
    """``dim`` names only x's last dim (an int, or a one-element list / tuple)."""
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    return isinstance(dim, int) and x.dim() >= 1 and dim % x.dim() == x.dim() - 1


def _sum(bi, func, mean: bool, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dtype = kwargs.get("dtype") or x.dtype
    if (dim is None or not _last_dim(x, dim) or len(args) > 3 or set(kwargs) - {"dim", "keepdim", "dtype"}
            or dtype not in _LOW):
        return NotImplemented
    n = x.shape[-1]

    def fast(t):
        s = bi.rows(t, "sum", torch.float32)
        return (s / n if mean else s).to(dtype)

    out = _run(fast, lambda t: func(t, dim=-1, dtype=dtype), x)
    return out.unsqueeze(-1) if keepdim else out


def _row_fn(bi, func, op: str, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if op == "logsumexp":
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if dim is None or not _last_dim(x, dim) or set(kwargs) - {"dim", "keepdim"}:
            return NotImplemented
        out = _run(lambda t: bi.rows(t, op), lambda t: torch.logsumexp(t, -1), x)
        return out.unsqueeze(-1) if keepdim else out
    dtype = kwargs.get("dtype") or (args[3] if func in (F.softmax, F.log_softmax) and len(args) > 3 else None)
    if dim is None or not _last_dim(x, dim) or set(kwargs) - {"dim", "dtype", "_stacklevel"}:
        return NotImplemented
    if func in (torch.softmax, torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax) and len(args) > 2:
        dtype = dtype or args[2]
    if dtype is not None and dtype not in _LOW:
        return NotImplemented
    ref_fn = F.softmax if op == "softmax" else F.log_softmax
    return _run(lambda t: bi.rows(t, op, dtype), lambda t: ref_fn(t, dim=-1, dtype=dtype), x)


def key_ranges(attn_mask: torch.Tensor | None, is_causal: bool, lq: int, lk: int, device
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's valid keys as one run ``[lo, hi)``: int32 [b, h, Lq] (size-1 where the mask broadcasts).

    ``attn_mask``: SDPA's mask, boolean (True = attend) or additive (0 = attend, -inf or the dtype's minimum =
    not), broadcastable to [B, H, Lq, Lk]; ``is_causal``: query i attends keys <= i (SDPA's top-left rule).
    A query with no valid key gets lo = hi = 0 (output 0). A mask whose valid keys are not one run per query
    (a gap, an additive bias) is refused, outside CUDA-graph capture where it cannot be checked.
    """
    i = torch.arange(lq, device=device)
    if attn_mask is None:
        hi = (i + 1).clamp(max=lk) if is_causal else torch.full_like(i, lk)
        return torch.zeros(1, 1, lq, dtype=torch.int32, device=device), hi.to(torch.int32).view(1, 1, lq)
    m = attn_mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.dtype == torch.bool:
        valid = m
    else:
        valid = m == 0
        if not capturing() and bool(((m != 0) & (m > torch.finfo(m.dtype).min / 2)).any()):
            raise ValueError("strict attention takes boolean masks or additive ones of 0 and -inf (or the dtype's "
                             "minimum); this mask adds other biases to the scores")
    if is_causal:
        valid = valid & (torch.arange(lk, device=device) <= i[:, None])
    valid = valid.expand(*valid.shape[:2], lq, lk)
    v = valid.to(torch.int8)
    any_ = valid.any(-1)
    lo = torch.where(any_, v.argmax(-1), 0)
    hi = torch.where(any_, lk - v.flip(-1).argmax(-1), 0)
    if not capturing() and bool((valid.sum(-1) != hi - lo).any()):
        raise ValueError("strict attention needs each query's valid keys to be one contiguous run (causal and "
                         "padding masks are); this mask has gaps")
    return lo.to(torch.int32), hi.to(torch.int32)


def _sdpa(bi, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise ValueError(f"strict attention runs without dropout (dropout_p={dropout_p})")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return NotImplemented
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
    lq, lk, d = query.shape[-2], key.shape[-2], query.shape[-1]
    lo, hi = key_ranges(attn_mask, is_causal, lq, lk, query.device)
    s = d ** -0.5 if scale is None else scale

    def ref(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=enable_gqa)

    return _run(lambda q, k, v: bi.attention(q, k, v, lo, hi, s), ref, query, key, value)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """The strict form of ``rollout.attention.decode_attention``: ``q [B, Hkv, rep, D]`` (one new
    token per row) over the cache ``k`` / ``v [B, Hkv, S, D]``, row b attending slots ``[start[b], end)``.
    The same program as that token's row in the learner's full causal pass (``batch_invariant.attention``) where
    the active StrictMode runs the kernels; where it runs fp64 (CPU), SDPA over the valid slots, in fp64."""
    from minite_kernels.backends.triton import batch_invariant as bi

    mode = _active()
    if mode is not None and not mode._use_kernels([q]):
        slots = torch.arange(k.shape[2], device=q.device)
        mask = (slots >= start.view(-1, 1)) & (slots < end.reshape(1, 1))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale)
    b, hkv, rep, d = q.shape
    lo = start.view(b, 1, 1)
    hi = end.reshape(1, 1, 1)
    o = bi.attention(q.reshape(b, hkv * rep, 1, d), k, v, lo, hi, scale)
    return o.view(b, hkv, rep, d)

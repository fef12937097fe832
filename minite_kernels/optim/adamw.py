"""AdamW whose step also records max|θ| of every parameter, so that NVFP4 weight sync reads each weight once.

Weight sync (report §6.5) quantizes every linear weight after each optimizer step. NVFP4's per-tensor scale
needs ``amax = max|W|`` before the first code can be written, so a standalone re-quantizer reads every
weight twice (an amax pass, then the quantize pass): 4.56 bytes of traffic per BF16 parameter instead of
2.56. The optimizer already reads and writes every weight, so it can produce the amax at no extra traffic;
``WeightRequantizer(..., amax_from=optimizer)`` then skips its amax pass (one read per weight).

The update is torch's AdamW (decoupled weight decay), computed in fp32 and rounded once to the parameter's
dtype (as ``torch.optim.AdamW(fused=True)`` does), with correctly rounded square roots and divisions; the
Triton kernel and the PyTorch reference below agree bit for bit (tested under the interpreter and on the H200
against the reference on x86 CPUs, whose vectorized ``lerp``/``addcmul`` fuse into FMAs as the kernel does),
and both stay within a few fp32 ulps of ``torch.optim.AdamW`` (whose CPU square root is 1-ulp accurate, not
correctly rounded)::

    θ ← θ·(1 − γλ)
    m ← m + (1 − β₁)(g − m)                     (torch's ``lerp``)
    v ← β₂·v + (1 − β₂)·g²
    θ ← θ − γ/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)
    amax(θ) = max |θ|                           (of the stored, rounded values)

Worked example (one fp32 parameter, first step, γ = 0.1, λ = 0, β = (0.9, 0.999), ε = 0): θ = 1, g = 2 →
m = 0.2, v = 0.004, m̂ = 2, v̂ = 4, θ ← 1 − 0.1·2/2 = 0.9, amax = 0.9.

The state (``step``, ``exp_avg``, ``exp_avg_sq``) and the parameter groups have ``torch.optim.AdamW``'s
layout, so checkpoints load either way. Unsupported AdamW options (``amsgrad``, ``maximize``,
``capturable``, ``differentiable``, ``fused``) raise.

Execution: on CUDA with Triton, parameters that share (dtype, state dtype, step) run in one grouped launch
(``backends/triton/adamw.py``); anything else (CPU, misaligned or non-contiguous tensors) takes the pure
PyTorch reference below, with the amax from ``abs().amax()``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch.autograd.graph import increment_version

_UNSUPPORTED = ("amsgrad", "maximize", "capturable", "differentiable", "fused")


def adamw_reference_(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> torch.Tensor:
    """One AdamW step in place (fp32 math, one rounding to each tensor's dtype); returns max|θ| (fp32, 0-d)."""
    pf, gf, mf, vf = (t if t.dtype == torch.float32 else t.float() for t in (p, g, m, v))
    bc1 = 1 - beta1**step
    bc2_sqrt = math.sqrt(1 - beta2**step)
    pf.mul_(1 - lr * weight_decay)
    mf.lerp_(gf, 1 - beta1)
    vf.mul_(beta2).addcmul_(gf, gf, value=1 - beta2)
    sqrt_v = vf.double().sqrt().float()  # correctly rounded (torch's CPU float32 sqrt is within 1 ulp)
    denom = (sqrt_v / bc2_sqrt).add_(eps)
    pf.addcdiv_(mf, denom, value=-(lr / bc1))
    for dst, src in ((p, pf), (m, mf), (v, vf)):
        if dst is not src:
            dst.copy_(src)
    return p.detach().abs().amax().float()


def _triton_usable(device: torch.device) -> bool:
    """The grouped kernel can run for tensors on ``device``: CUDA with Triton importable, or CPU under Triton's
    interpreter (``TRITON_INTERPRET=1``, tests). Never imports the Triton backend on machines without Triton."""
    if device.type not in ("cuda", "cpu"):
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means no Triton here
        return False
    if device.type == "cpu":
        from minite_kernels.backends.triton._common import interpret_mode

        return interpret_mode()
    return True


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (same arguments, state and checkpoints) whose ``step()`` also records the amax
    of every parameter it updates, in the same pass over the weights on CUDA.

    ``amax(p)``: max|p| after the last step (fp32, 0-d device tensor). ``amax_slots(params)`` gives the
    buffer and index that ``WeightRequantizer(amax_from=...)`` gathers from; ``amax_current(params)`` says
    whether every one of them still holds the values the last step wrote (no in-place change since).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        **kw,
    ) -> None:
        bad = [k for k in _UNSUPPORTED if kw.get(k)]
        if bad:
            raise ValueError(
                f"minite_kernels.optim.AdamW does not support {', '.join(bad)}=True; use torch.optim.AdamW "
                "for those options (valid here: lr, betas, eps, weight_decay, foreach)"
            )
        unknown = set(kw) - set(_UNSUPPORTED) - {"foreach"}
        if unknown:
            raise TypeError(f"unexpected argument(s) {sorted(unknown)}; valid: lr, betas, eps, weight_decay")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kw)
        self._slots: dict[int, int] = {}
        self._amax_bits: torch.Tensor | None = None
        self._versions: list[int] = []
        self._pmaps: dict[tuple, torch.Tensor] = {}
        self._step_views: dict[int, tuple] = {}
        self.kernel_launches = 0
        self.reference_params = 0

    # --- amax bookkeeping ------------------------------------------------------------------------
    def _ensure_slots(self) -> torch.Tensor:
        n = sum(len(g["params"]) for g in self.param_groups)
        if self._amax_bits is None or len(self._slots) != n:
            params = [p for g in self.param_groups for p in g["params"]]
            self._slots = {id(p): i for i, p in enumerate(params)}
            dev = params[0].device if params else torch.device("cpu")
            self._amax_bits = torch.zeros(n, dtype=torch.int32, device=dev)
            self._versions = [-1] * n
        return self._amax_bits

    def _slot(self, p: torch.Tensor) -> int:
        self._ensure_slots()
        try:
            return self._slots[id(p)]
        except KeyError:
            raise ValueError("tensor is not a parameter of this optimizer") from None

    def amax(self, p: torch.Tensor) -> torch.Tensor:
        """max|p| as written by the last step (0-d fp32 on the parameters' device)."""
        return self._ensure_slots()[self._slot(p)].view(torch.float32)

    def amax_buffer(self) -> torch.Tensor:
        """The int32 buffer of amax bits, one slot per parameter (replaced only when parameters are added)."""
        return self._ensure_slots()

    def amax_slots(self, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(int32 buffer of amax bits, index of ``params`` in it): gathering gives their amaxes; the buffer
        keeps its address for the optimizer's lifetime (CUDA-graph safe)."""
        bits = self._ensure_slots()
        index = torch.tensor([self._slot(p) for p in params], dtype=torch.long, device=bits.device)
        return bits, index

    def amax_current(self, params: Sequence[torch.Tensor]) -> bool:
        """True when every parameter is unchanged since this optimizer's last step wrote it (its version
        counter is the one recorded then), so its recorded amax is exact."""
        self._ensure_slots()
        versions, slots = self._versions, self._slots
        return all(id(p) in slots and versions[slots[id(p)]] == p._version for p in params)

    # --- the step --------------------------------------------------------------------------------
    def _bump_step(self, p: torch.Tensor, state: dict) -> int:
        """state["step"] += 1, returned as an int. The step lives in a 0-d CPU float tensor (torch's layout); an
        ATen add on it costs ~7 µs of host time per parameter, so it is read and written through a cached
        1-element NumPy view of the same memory. A replaced tensor (``load_state_dict``) gets a new view."""
        st = state["step"]
        cached = self._step_views.get(id(p))
        if cached is None or cached[0] is not st:
            if st.device.type != "cpu" or st.dtype not in (torch.float32, torch.float64) or st.requires_grad:
                st += 1
                return int(st.item())
            cached = self._step_views[id(p)] = (st, st.view(1).numpy())
        view = cached[1]
        t = int(view[0]) + 1
        view[0] = t
        return t

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        bits = self._ensure_slots()
        kernel_dev = bits.device.type if _triton_usable(bits.device) else None
        for group in self.param_groups:
            beta1, beta2 = (float(b) for b in group["betas"])
            lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            batches: dict[tuple, list] = {}
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                t = self._bump_step(p, state)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                row = _kernel_row(p, g, m, v, kernel_dev) if kernel_dev is not None else None
                if row is not None:
                    batches.setdefault((p.dtype, m.dtype, t), []).append((p, m, v, row))
                    continue
                amax = adamw_reference_(
                    p, g, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd, step=t
                )
                slot = self._slot(p)
                bits[slot] = amax.to(bits.device).view(torch.int32)
                self._versions[slot] = p._version
                self.reference_params += 1
            for (p_dtype, s_dtype, t), items in batches.items():
                self._launch(items, p_dtype, s_dtype, t, lr, beta1, beta2, eps, wd)
        return loss

    def _launch(self, items, p_dtype, s_dtype, t, lr, beta1, beta2, eps, wd) -> None:
        from minite_kernels.backends.triton import adamw as K

        bits, slots_of, span = self._amax_bits, self._slots, K.BLOCK * K.ITERS
        rows, counts, slots, start = [], [], [], 0
        for p, _m, _v, (pp, gp, mp, vp, n) in items:
            programs = -(-n // span)
            slot = slots_of[id(p)]
            slots.append(slot)
            rows.append((pp, gp, mp, vp, n, start, slot, 0))
            counts.append(programs)
            start += programs
        dev = bits.device
        table = torch.tensor(rows, dtype=torch.int64).to(dev, non_blocking=True)
        key = (dev, tuple(counts))
        pmap = self._pmaps.get(key)  # program -> row map: fixed while the batch's sizes are
        if pmap is None:
            pmap = torch.repeat_interleave(torch.arange(len(items), dtype=torch.int32), torch.tensor(counts))
            pmap = self._pmaps[key] = pmap.to(dev)
        if len(slots) == len(slots_of):
            bits.zero_()
        else:
            bits.index_fill_(0, torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True), 0)
        scalars = torch.tensor(
            [1 - lr * wd, 1 - beta1, beta2, 1 - beta2, -(lr / (1 - beta1**t)), math.sqrt(1 - beta2**t), eps],
            dtype=torch.float32,
        ).to(dev, non_blocking=True)
        K.launch_adamw_amax(table, pmap, bits, start, scalars, p_dtype, s_dtype)
        self.kernel_launches += 1
        # the kernel wrote through raw pointers: tell autograd and the weight caches (version counters)
        increment_version([x for p, m, v, _row in items for x in (p, m, v)])
        versions = self._versions
        for (p, _m, _v, _row), slot in zip(items, slots):
            versions[slot] = p._version


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _kernel_row(p, g, m, v, dev_type: str) -> tuple | None:
    """(addresses of p, g, m, v, numel) if the grouped kernel takes this parameter: a float dtype shared with
    its gradient, states of one float dtype, all four contiguous on the kernel device, 16-byte aligned."""
    dt = p.dtype
    if (
        dt not in _FLOATS
        or g.dtype is not dt
        or m.dtype is not v.dtype
        or m.dtype not in _FLOATS
        or p.is_cuda != (dev_type == "cuda")
        or not (p.is_contiguous() and g.is_contiguous() and m.is_contiguous() and v.is_contiguous())
    ):
        return None
    ptrs = (p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr())
    if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) % 16:
        return None
    return (*ptrs, p.numel())

"""The quantized linear's two autograd functions: dense (Linear, LayerNormLinear) and grouped (GroupedLinear).

Report §4.3: fprop, dgrad and wgrad each follow their own GEMM spec of the recipe. For one group
(a dense layer is one group; an MoE layer has one group per expert, rows sorted by expert)::

    fprop  Y  = Q(X) · Q(W)ᵀ                       (+ bias)
    dgrad  dX = Q(dY) · Q(W_b)                      qgemm_nt(dY, W_bᵀ)
    wgrad  dW = Q(dYᵀ) · Q(X_bᵀ)ᵀ                   qgemm_nt(dYᵀ, X_bᵀ)

where ``Q`` is the recipe's quantizer for that operand (identity for bf16 specs) and the backward operands
``X_b, W_b`` are chosen by ``recipe.backward_operands``:

  - ``quantized`` / ``original``: the original high-precision X, W (re-quantized per the backward specs);
  - ``dequantized_forward``: ``dequant(Q_fprop(X))`` and ``dequant(Q_fprop(W))``, the values the forward
    used. With BF16 backward specs this makes dX, dW the exact gradients of the quantized forward
    ``Y = X̂ Ŵᵀ`` with the quantizer treated as identity (straight-through estimator).

The quantizer is never differentiated (STE): gradients flow as if ``Q`` were the identity.

Worked example (bf16 recipe, one group): X = [[1, 2]], W = [[3, 4]], dY = [[1]] gives Y = [[11]],
dX = dY·W = [[3, 4]], dW = dYᵀ·X = [[1, 2]], exactly nn.Linear's gradients.

Quantized weights are cached per (GEMM role, spec, group) in a :class:`WeightCache`, valid until the next
optimizer step in the process or a change of the weight's version counter or storage pointer, so they are
re-quantized once after each ``optimizer.step()``: that is the "weight sync" re-quantization (why the
optimizer step counts: ``weight_cache.py``; FSDP2 rewrites weights at the same address with the version kept).

Host overhead. Everything that depends only on the (frozen) recipe and the backend is decided once per
module and remembered next to its weight cache (:class:`_Plan`: the recipe's kernel choice resolved against the
debugging options, the backend bound to it, which backend quantizes X and runs each GEMM, which GEMMs are plain
BF16 matmuls, whether the fast lane applies). A call reads no option field, only which options object is active
(one identity check): the plan is made again when the recipe, the backend or that object is another one. A dense layer (one group) takes
:class:`_DenseQLinear`, without per-group slicing; BF16 backward GEMMs are direct ``torch.mm`` calls on the
same operand layouts the backend's BF16 path uses (identical results). Its calls that the fast lane accepts
(``fast_lane.py``: the report's recipe on the Triton backend) run the same math with the least host work.
Grouped layers, and a dense call with no rows, take :class:`_GroupedQLinear`. Nothing here reads a device
value on the host (no synchronization).

Saved activations (``dequantized_forward``): the BF16 dequantized copy the Triton backend already wrote in
the forward (as many bytes as ``nn.Linear`` saves), or with ``kernels.save_activations=packed`` the quantized
input's NVFP4 bytes (3.6x fewer, dequantized again in backward); same values either way (:func:`_save_inputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minite_kernels.backends import AutoBackend, Backend, dequantize_operand
from minite_kernels.modules.fast_lane import call_ok, lane_backward, lane_forward, lane_ok
from minite_kernels.modules.weight_cache import WeightCache, _Memo, fprop_weight
from minite_kernels.modules.weight_cache import quantize_operand as _quantize
from minite_kernels.options import Options, options, resolve_kernels
from minite_kernels.recipes import GemmSpec, KernelChoice, OperandSpec, PrecisionRecipe


def _route_quantize(backend: Backend, spec: OperandSpec) -> Backend:
    """The backend that quantizes ``spec`` (``auto`` decides per spec; the choice depends only on the spec)."""
    if type(backend) is AutoBackend and spec.quantized:
        return backend.plan_quantize(spec)
    return backend


def _route_gemm(backend: Backend, gemm: GemmSpec) -> Backend | None:
    """The backend that runs ``gemm``, or None for a plain BF16 matmul (both operands unquantized and the
    backend's BF16 path is the base class's ``torch.matmul``, which :func:`_mm_nt` reproduces)."""
    if not gemm.a.quantized and not gemm.b.quantized:
        if type(backend) is AutoBackend or type(backend).qgemm_nt is Backend.qgemm_nt:
            return None
        return backend
    if type(backend) is AutoBackend:
        return backend.plan_gemm(gemm.a, gemm.b)[0]
    return backend


class _Plan:
    """Dispatch decided once per (recipe, backend, options): all three are immutable for the plan's lifetime (a
    module whose recipe or backend changes, or a call under other options, gets a new plan: identity is checked
    on every call). ``source`` is the backend the module named; ``backend`` is it bound to ``kernels``, the
    recipe's choice with the options' overrides (``Backend.with_kernels``)."""

    __slots__ = (
        "backend",
        "dgrad_backend",
        "dgrad_from_forward",
        "fa_q",
        "fprop_backend",
        "kernels",
        "lane",
        "options",
        "recipe",
        "source",
        "wgrad_backend",
        "x_quantizer",
    )

    def __init__(self, recipe: PrecisionRecipe, source: Backend, opts: Options | None = None) -> None:
        self.options = options() if opts is None else opts
        self.kernels: KernelChoice = resolve_kernels(recipe.kernels, self.options)
        backend = source.with_kernels(self.kernels)
        self.recipe, self.source, self.backend = recipe, source, backend
        f = recipe.fprop
        dq_fwd = recipe.backward_operands == "dequantized_forward"
        self.fa_q = f.a.quantized
        self.dgrad_from_forward = dq_fwd and f.b.quantized
        self.x_quantizer = _route_quantize(backend, f.a)
        self.fprop_backend = _route_gemm(backend, f) or backend
        self.dgrad_backend = _route_gemm(backend, recipe.dgrad)
        self.wgrad_backend = _route_gemm(backend, recipe.wgrad)
        ok = lane_ok(
            recipe, self.kernels, self.x_quantizer, self.fprop_backend, self.dgrad_backend, self.wgrad_backend
        )
        self.lane = (recipe, backend, self.x_quantizer) if ok else None


def _plan_for(recipe: PrecisionRecipe, backend: Backend, cache: WeightCache) -> _Plan:
    slot = getattr(cache, "_dispatch", None)
    if slot is None:  # a cache unpickled from an older version
        slot = cache._dispatch = _Memo()
    plan = slot.value
    opts = options()
    if plan is None or plan.recipe is not recipe or plan.source is not backend or plan.options is not opts:
        plan = slot.value = _Plan(recipe, backend, opts)
    return plan


def module_lane(module, device: torch.device) -> tuple | None:
    """The fast-lane plan ``(recipe, backend, activation quantizer)`` of a quantized dense module on
    ``device`` (``fast_lane.lane_ok``), or None when its calls take the generic path."""
    recipe, quantized, _, _, backend = module._dispatch(device)
    if not quantized:
        return None
    return _plan_for(recipe, backend, module._weight_cache).lane


def _mm_nt(a: torch.Tensor, bt: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``torch.matmul(a, b.to(a.dtype).t()).to(out_dtype)`` (the base backend's BF16 GEMM) given
    ``bt = b.t()``: the same operand layouts, hence the same result, without the no-op casts and views."""
    if bt.dtype != a.dtype:
        y = torch.matmul(a, bt.t().to(a.dtype).t())  # the base expression, literally
    else:
        y = torch.mm(a, bt)
    return y if y.dtype == out_dtype else y.to(out_dtype)


@dataclass
class QLinearState:
    """Non-tensor state of one quantized-linear call."""

    recipe: PrecisionRecipe
    backend: Backend
    cache: WeightCache
    generator: torch.Generator | None = None
    splits: tuple[int, ...] = ()
    grouped: bool = False
    saved_q: list = field(default_factory=list)
    plan: _Plan | None = None


_INIT_FIELDS: dict[type, tuple[str, ...]] = {}
_PACKED = ("data", "scales", "amax", "nonfinite")


def _first(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0]


class _Rebuild:
    """Rebuilds a quantized operand from its saved tensors; holds only the non-tensor fields."""

    __slots__ = ("cls", "names", "static")

    def __init__(self, cls: type, static: dict, names: tuple[str, ...]) -> None:
        self.cls, self.static, self.names = cls, static, names

    def __call__(self, ts: list[torch.Tensor]):
        return self.cls(**self.static, **dict(zip(self.names, ts)))


def _pack(q) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """Split a quantized operand (a formats dataclass) into its tensors, saved with ``save_for_backward``, and
    a rebuild function that holds only the non-tensor fields (so checkpointing/offload hooks see every
    tensor; optional cached tensors such as a backend's GEMM operand are dropped)."""
    if isinstance(q, torch.Tensor):
        return [q], _first
    cls = type(q)
    fields = _INIT_FIELDS.get(cls)
    if fields is None:
        fields = _INIT_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(q) if f.init)
    names = tuple(n for n in _PACKED if isinstance(getattr(q, n, None), torch.Tensor))
    tensors = [getattr(q, n) for n in names]
    static = {}
    for n in fields:
        if n not in names:
            v = getattr(q, n)
            if not isinstance(v, torch.Tensor):
                static[n] = v
    return tensors, _Rebuild(cls, static, names)


def _weight_operands(state: QLinearState, weight: torch.Tensor, g: int) -> torch.Tensor:
    return weight[g] if state.grouped else weight


def _fprop_weight(state: QLinearState, weight: torch.Tensor, g: int):
    return fprop_weight(
        state.recipe, state.backend, state.cache, weight, _weight_operands(state, weight, g), g
    )


def _backward_weight(state: QLinearState, weight: torch.Tensor, g: int):
    """The dgrad B operand ``W_bᵀ`` [K, N], quantized per ``dgrad.b``.

    Quantized results are cached (they depend only on W, like TE's cached weight column copy). A BF16
    operand is never cached: the dequantized forward weight is rebuilt from the cached quantized one at
    each backward, so no full-size high-precision weight copy stays alive between steps.
    """
    r = state.recipe
    spec = r.dgrad.b

    def source() -> torch.Tensor:
        if r.backward_operands == "dequantized_forward" and r.fprop.b.quantized:
            return dequantize_operand(_fprop_weight(state, weight, g), weight.dtype)
        return _weight_operands(state, weight, g)

    if not spec.quantized:
        return source().t()
    return state.cache.get(
        ("dgrad", spec, r.backward_operands, g),
        weight,
        lambda: _quantize(state.backend, source().t(), spec, None),
    )


def _forward_dense(state: QLinearState, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """One group, at least one row: :func:`_forward` without the per-group slicing, with planned dispatch."""
    p, f = state.plan, state.recipe.fprop
    out_dtype = x2d.dtype
    if p.fa_q:
        qx = p.x_quantizer.quantize(x2d if x2d.is_contiguous() else x2d.contiguous(), f.a, generator=None)
    else:
        qx = x2d
    qw = _fprop_weight(state, weight, 0)
    y = p.fprop_backend.qgemm_nt(None, None, f.a, f.b, a_quantized=qx, b_quantized=qw, out_dtype=out_dtype)
    if bias is not None:
        y = y + (bias if bias.dtype == out_dtype else bias.to(out_dtype))
    return y, [qx]


def _forward_groups(state: QLinearState, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """Y for all groups; returns (y, per-group quantized X or None)."""
    r = state.recipe
    n = weight.shape[-2]
    out_dtype = x2d.dtype
    outs, qxs = [], []
    start = 0
    for g, m in enumerate(state.splits):
        xg = x2d[start : start + m]
        start += m
        if m == 0:
            outs.append(x2d.new_zeros((0, n)))
            qxs.append(None)
            continue
        qx = _quantize(state.backend, xg, r.fprop.a, None)
        qw = _fprop_weight(state, weight, g)
        y = state.backend.qgemm_nt(
            None, None, r.fprop.a, r.fprop.b, a_quantized=qx, b_quantized=qw, out_dtype=out_dtype
        )
        if bias is not None:
            y = y + (bias[g] if state.grouped else bias).to(out_dtype)
        outs.append(y)
        qxs.append(qx)
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
    return y, qxs


def _save_inputs(ctx, state: QLinearState, x2d: torch.Tensor, weight: torch.Tensor, qxs: list) -> None:
    """What the backward needs of the inputs: the weight, and X (or, under ``dequantized_forward``, each
    group's quantized X as the plan's ``kernels.save_activations`` says).

    ``dequantized`` (default): the BF16 dequantized copy, where the backend already made it in the forward (the
    Triton backend's ``deq``; bit-equal to dequantizing the bytes, so gradients are identical): no dequantize
    launch in backward, and saved activations the size of ``nn.Linear``'s (2 bytes per element). Operands
    without that copy (the emulated backend's) are saved packed. ``packed``: the NVFP4 bytes (0.5625 bytes per
    element), dequantized again in backward: less memory, one more launch (``benchmarks/RESULTS.md``)."""
    r = state.recipe
    ctx.state = state
    ctx.x_dtype = x2d.dtype
    if r.backward_operands == "dequantized_forward" and r.fprop.a.quantized:
        keep_deq = x2d.dtype == torch.bfloat16 and state.plan.kernels.save_activations == "dequantized"
        tensors, rebuilders, counts = [], [], []
        for q in qxs:
            if q is None:
                rebuilders.append(None)
                counts.append(0)
                continue
            deq = getattr(q, "deq", None) if keep_deq else None
            ts, rb = ([deq], _first) if deq is not None else _pack(q)
            tensors.extend(ts)
            rebuilders.append(rb)
            counts.append(len(ts))
        ctx.rebuilders, ctx.counts = rebuilders, counts
        ctx.save_for_backward(weight, *tensors)
        ctx.saved_x = False
    else:
        ctx.save_for_backward(weight, x2d)
        ctx.saved_x = True


class _DenseQLinear(torch.autograd.Function):
    """One dense layer, at least one row. ``lane``: the call takes the fast lane (``fast_lane.call_ok``
    accepted it): X̂ and Ŵ are saved and the backward is two BF16 matmuls; otherwise the planned path
    (:func:`_forward_dense`, :func:`_backward_dense`). Both give the same bits for the lane's recipe."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, plan: _Plan, cache: WeightCache, generator, lane: bool):  # type: ignore
        ctx.has_bias = bias is not None
        ctx.lane = lane
        if lane:
            y, x_hat, w_hat = lane_forward(plan.lane, cache, x2d, weight, bias)
            ctx.save_for_backward(x_hat, w_hat)
            return y
        state = QLinearState(plan.recipe, plan.backend, cache, generator, (x2d.shape[0],), False, plan=plan)
        y, qxs = _forward_dense(state, x2d, weight, bias)
        _save_inputs(ctx, state, x2d, weight, qxs)
        return y

    @staticmethod
    def backward(ctx, dy2d):  # type: ignore[override]
        dy2d = dy2d if dy2d.is_contiguous() else dy2d.contiguous()
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        if ctx.lane:
            x_hat, w_hat = ctx.saved_tensors
            dx, dw, db = lane_backward(dy2d, x_hat, w_hat, need_dx, need_dw, ctx.has_bias and need_db)
        else:
            weight, *rest = ctx.saved_tensors
            dx, dw, db, _ = _backward_dense(ctx, ctx.state, dy2d, weight, rest, need_dx, need_dw)
        return dx, dw, db, None, None, None, None


class _GroupedQLinear(torch.autograd.Function):
    """Grouped layers (one group per expert, rows sorted by group, zero rows allowed), and a dense call with
    no rows: the recipe's GEMMs group by group."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, state: QLinearState):  # type: ignore[override]
        y, qxs = _forward_groups(state, x2d, weight, bias)
        ctx.has_bias = bias is not None
        _save_inputs(ctx, state, x2d, weight, qxs)
        return y

    @staticmethod
    def backward(ctx, dy2d):  # type: ignore[override]
        state: QLinearState = ctx.state
        r = state.recipe
        backend = state.backend
        weight, *rest = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy2d = dy2d if dy2d.is_contiguous() else dy2d.contiguous()
        if ctx.saved_x:
            x2d = rest[0]
            xs = []
            start = 0
            for m in state.splits:
                xs.append(x2d[start : start + m])
                start += m
        else:
            xs, i = [], 0
            for rb, c in zip(ctx.rebuilders, ctx.counts):
                if rb is None:
                    xs.append(None)
                    continue
                xs.append(dequantize_operand(rb(list(rest[i : i + c])), ctx.x_dtype))
                i += c

        dxs, dws = [], []
        start = 0
        n, k = weight.shape[-2], weight.shape[-1]
        for g, m in enumerate(state.splits):
            dyg = dy2d[start : start + m]
            start += m
            if m == 0:
                dxs.append(dy2d.new_zeros((0, k), dtype=ctx.x_dtype))
                dws.append(torch.zeros((n, k), dtype=weight.dtype, device=weight.device))
                continue
            if need_dx:
                wt = _backward_weight(state, weight, g)
                dxs.append(
                    backend.qgemm_nt(
                        dyg,
                        None,
                        r.dgrad.a,
                        r.dgrad.b,
                        b_quantized=wt,
                        out_dtype=ctx.x_dtype,
                        generator=state.generator,
                    )
                )
            if need_dw:
                a = dyg.t()
                b = xs[g].t()
                if r.wgrad.a.quantized:
                    a = a.contiguous()
                if r.wgrad.b.quantized:
                    b = b.contiguous()
                dws.append(
                    backend.qgemm_nt(
                        a, b, r.wgrad.a, r.wgrad.b, out_dtype=weight.dtype, generator=state.generator
                    )
                )
        dx = (dxs[0] if len(dxs) == 1 else torch.cat(dxs, dim=0)) if need_dx else None
        dw = None
        if need_dw:
            dw = torch.stack(dws, dim=0) if state.grouped else dws[0]
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            if state.grouped:
                parts = torch.split(dy2d, list(state.splits), dim=0)
                db = torch.stack([p.sum(dim=0) for p in parts], dim=0)
            else:
                db = dy2d.sum(dim=0)
        return dx, dw, db, None


def _backward_dense(ctx, state: QLinearState, dy: torch.Tensor, weight, rest, need_dx: bool, need_dw: bool):
    """One group: the generic backward's dgrad then wgrad (same operands, same generator order), with the
    BF16 GEMMs as direct matmuls and the quantized ones on the planned backend."""
    r, p = state.recipe, state.plan
    x_dtype = ctx.x_dtype
    dx = dw = db = None
    if need_dx:
        if p.dgrad_backend is None:  # dX = dY · W_b, exactly the base backend's matmul(dY, (W_bᵀ)ᵀ)
            if p.dgrad_from_forward:
                w_b = dequantize_operand(_fprop_weight(state, weight, 0), weight.dtype)
            else:
                w_b = weight
            dx = _mm_nt(dy, w_b, x_dtype)
        else:
            dx = p.dgrad_backend.qgemm_nt(
                dy,
                None,
                r.dgrad.a,
                r.dgrad.b,
                b_quantized=_backward_weight(state, weight, 0),
                out_dtype=x_dtype,
                generator=state.generator,
            )
    if need_dw:
        if ctx.saved_x:
            x = rest[0]
        else:
            x = dequantize_operand(ctx.rebuilders[0](list(rest)), x_dtype)
        if p.wgrad_backend is None:  # dW = dYᵀ · X_b
            dw = _mm_nt(dy.t(), x, weight.dtype)
        else:
            a, b = dy.t(), x.t()
            if r.wgrad.a.quantized:
                a = a.contiguous()
            if r.wgrad.b.quantized:
                b = b.contiguous()
            dw = p.wgrad_backend.qgemm_nt(
                a, b, r.wgrad.a, r.wgrad.b, out_dtype=weight.dtype, generator=state.generator
            )
    if ctx.has_bias and ctx.needs_input_grad[2]:
        db = dy.sum(dim=0)
    return dx, dw, db, None


def check_splits(m_splits: Sequence[int] | torch.Tensor, num_groups: int, total: int) -> tuple[int, ...]:
    """Validate per-group row counts (``m_splits``) against the number of groups and rows."""
    if isinstance(m_splits, torch.Tensor):
        m_splits = m_splits.tolist()
    splits = tuple(int(s) for s in m_splits)
    if len(splits) != num_groups:
        raise ValueError(
            f"m_splits has {len(splits)} entries but the layer has {num_groups} groups (experts)"
        )
    if any(s < 0 for s in splits):
        raise ValueError(f"m_splits must be non-negative row counts, got {list(splits)}")
    if sum(splits) != total:
        raise ValueError(f"m_splits sums to {sum(splits)} but the input has {total} rows")
    return splits


def qlinear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: PrecisionRecipe,
    backend: Backend,
    cache: WeightCache,
    *,
    m_splits: Sequence[int] | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Quantized ``x @ weightᵀ + bias`` with recipe-controlled fprop/dgrad/wgrad.

    Dense: ``weight`` [N, K], ``x`` [..., K] → [..., N]. Grouped (MoE): ``weight`` [G, N, K] (one contiguous
    buffer), ``bias`` [G, N] or None, ``x`` [T, K] with rows sorted by group and ``m_splits`` the G row counts
    (zero allowed) → [T, N].
    """
    k = weight.shape[-1]
    if x.shape[-1] != k:
        raise ValueError(f"input has {x.shape[-1]} features but the weight expects {k}")
    grouped = weight.dim() == 3
    flat = x.dim() == 2
    x2d = x if flat else x.reshape(-1, k)
    if grouped:
        if m_splits is None:
            raise ValueError("a grouped weight [G, N, K] needs m_splits (rows per group)")
        splits = check_splits(m_splits, weight.shape[0], x2d.shape[0])
    else:
        splits = (x2d.shape[0],)
    plan = _plan_for(recipe, backend, cache)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if not grouped and x2d.shape[0] > 0:
        lane = plan.lane is not None and call_ok(plan.lane, x2d, weight)
        if needs_grad:
            y = _DenseQLinear.apply(x2d, weight, bias, plan, cache, generator, lane)
        elif lane:
            y = lane_forward(plan.lane, cache, x2d, weight, bias)[0]
        else:
            state = QLinearState(recipe, plan.backend, cache, generator, splits, False, plan=plan)
            y = _forward_dense(state, x2d, weight, bias)[0]
    else:
        state = QLinearState(recipe, plan.backend, cache, generator, splits, grouped, plan=plan)
        if needs_grad:
            y = _GroupedQLinear.apply(x2d, weight, bias, state)
        else:
            y = _forward_groups(state, x2d, weight, bias)[0]
    return y if flat else y.reshape(*x.shape[:-1], weight.shape[-2])

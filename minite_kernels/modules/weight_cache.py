"""Quantized weights cached per weight version, and the per-module memo slot for host-side dispatch.

Quantized weights are cached per (GEMM role, spec, group) in a :class:`WeightCache`. An entry is valid while
the weight's version counter, storage pointer, dtype, device and shape are unchanged **and no optimizer has
stepped since it was made** (the optimizer epoch, :func:`optimizer_epoch`, counted by a post-step hook common
to every ``torch.optim.Optimizer``). So weights are re-quantized once after each ``optimizer.step()``: that is
the "weight sync" re-quantization.

Why the epoch: an in-place update bumps ``_version``, but a weight that is a *new* tensor at a reused address
starts again at version 0. FSDP2 (``fully_shard``, verl's FSDP engine) does exactly that: every forward
all-gathers the shards into an unsharded parameter whose storage it frees and re-allocates, with the version
counter preserved. Without the epoch the third forward of a sharded model, after two optimizer steps, met the
first forward's (pointer, version) and computed with stale quantized weights
(``tests/minite_kernels/test_fsdp2.py``). The price: a step of any optimizer in the process invalidates every
cache, so a process holding two trained models re-quantizes each one's weights once more per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from minite_kernels.backends import Backend
from minite_kernels.recipes import OperandSpec, PrecisionRecipe

_EPOCH = [0]  # optimizer steps taken in this process (a list: bumped by the hook, read on every lookup)


def _count_step(_optimizer, _args, _kwargs) -> None:
    _EPOCH[0] += 1


register_optimizer_step_post_hook(_count_step)


def optimizer_epoch() -> int:
    """How many optimizer steps (of any ``torch.optim.Optimizer``) this process has taken."""
    return _EPOCH[0]


class _Memo:
    """A per-module slot for host-side dispatch decisions: never copied or pickled (``deepcopy`` of a
    model gives an empty slot, refilled on the next call), so no backend object is ever duplicated."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None

    def __copy__(self) -> _Memo:
        return _Memo()

    def __deepcopy__(self, memo) -> _Memo:
        return _Memo()

    def __reduce__(self):
        return (_Memo, ())


class WeightCache:
    """Quantized weights keyed by role; an entry is valid while no optimizer has stepped since it was made and
    the weight's ``_version``, storage pointer, dtype, device and shape are unchanged (see the module
    docstring). A plain attribute (never a buffer): nothing here enters ``state_dict``.

    The public API for code outside the modules (the graph sampler keeps the values its CUDA graphs read in
    the caches): :meth:`of` (a module's cache), :meth:`token`, :meth:`entries`, :meth:`rebind`,
    :meth:`update_in_place`, plus ``get`` / ``put`` / ``clear`` / ``len`` and the ``misses`` counter."""

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[tuple, Any]] = {}
        self.misses = 0
        self._dispatch = _Memo()

    @staticmethod
    def of(module: Any) -> WeightCache | None:
        """The cache a minite module holds (``Linear``, ``GroupedLinear``, ``GroupedExperts``), else None."""
        return getattr(module, "_weight_cache", None)

    @staticmethod
    def token(weight: torch.Tensor) -> tuple:
        """What an entry made from ``weight`` is valid for: the optimizer epoch and the weight's version, storage
        pointer, dtype, device, shape."""
        return (_EPOCH[0], weight._version, weight.data_ptr(), weight.dtype, weight.device, weight.shape)

    @staticmethod
    def fields(value: Any) -> dict:
        """The fields of an entry's value: a tensor (``{"": value}``), or an object's attributes (tensors and
        plain fields, e.g. an ``NVFP4Tensor``'s data, scales and amax)."""
        return value.__dict__ if hasattr(value, "__dict__") else {"": value}

    def get(self, key: Any, weight: torch.Tensor, make: Callable[..., Any], *make_args) -> Any:
        """The entry for ``key`` if ``weight`` is unchanged, else ``make(*make_args)`` (stored)."""
        hit = self._entries.get(key)
        if hit is not None:
            t = hit[0]
            # the cheap, most selective fields first; all six must match
            if (
                t[0] == _EPOCH[0]
                and t[1] == weight._version
                and t[2] == weight.data_ptr()
                and t[3] == weight.dtype
                and t[5] == weight.shape
                and t[4] == weight.device
            ):
                return hit[1]
        value = make(*make_args)
        self._entries[key] = (self.token(weight), value)
        self.misses += 1
        return value

    def put(self, key: Any, weight: torch.Tensor, value: Any) -> None:
        """Store a value made elsewhere (e.g. a batched weight-sync re-quantizer) for the current weight."""
        self._entries[key] = (self.token(weight), value)

    def entries(self) -> list[tuple[Any, tuple, Any]]:
        """``(key, token, value)`` of every entry, in the order they were first stored."""
        return [(key, token, value) for key, (token, value) in self._entries.items()]

    def rebind(self, key: Any, value: Any) -> None:
        """Store ``value`` under the existing entry ``key``, keeping its token: for a value that holds the same
        numbers as the entry's (a buffer it was copied into). ``KeyError`` if there is no such entry."""
        token, _ = self._entries[key]
        self._entries[key] = (token, value)

    def update_in_place(self, key: Any, into: Any) -> None:
        """Copy the tensors of entry ``key``'s value into the same fields of ``into`` (a value of the same layout,
        e.g. the buffers a CUDA graph reads), then :meth:`rebind` ``key`` to ``into``."""
        token, value = self._entries[key]
        dst = self.fields(into)
        for name, x in self.fields(value).items():
            if isinstance(x, torch.Tensor):
                dst[name].copy_(x)
        self._entries[key] = (token, into)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def quantize_operand(backend: Backend, x: torch.Tensor, spec: OperandSpec, generator) -> Any:
    """``backend.quantize`` of a 2-D operand (made contiguous first); a BF16 spec returns ``x`` itself."""
    if not spec.quantized:
        return x
    return backend.quantize(x if x.is_contiguous() else x.contiguous(), spec, generator=generator)


def fprop_weight(
    recipe: PrecisionRecipe,
    backend: Backend,
    cache: WeightCache,
    weight: torch.Tensor,
    w: torch.Tensor,
    g: int,
):
    """The fprop B operand of group ``g`` (``w`` is ``weight`` or its group slice), quantized per
    ``recipe.fprop.b`` once per weight version."""
    spec = recipe.fprop.b
    if not spec.quantized:
        return w
    return cache.get(("fprop", spec, g), weight, quantize_operand, backend, w, spec, None)

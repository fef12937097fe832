"""The quantized linear's inference forward as one torch custom op, so ``torch.compile`` can trace a patched
model (``fullgraph=True`` included, and transformers' static-cache ``generate``, which compiles its decode).

Dynamo cannot trace the eager path: it dispatches on Python objects (recipe, backend, weight cache keyed on
the weight's version counter and storage address) and builds quantized-tensor dataclasses around Triton
launches. Under compilation, ``Linear.forward`` calls ``torch.ops.minite.linear_forward(x, weight, bias, key)``
instead; the op is opaque to the compiler (its fake implementation only states the output's shape and dtype,
``[..., N]`` in ``x``'s dtype) and at run time it runs the module's eager path, so the compiled model computes
exactly what the eager one does, kernel for kernel, with the same weight cache. ``key`` is an integer naming
the module in a weak registry (a constant in the compiled graph: one per module).

Inference only: under compilation with autograd recording, the op has no backward formula, so the module
raises a clear error instead of compiling a graph that fails in ``backward()``.

Example::

    quantize_model(model, "nvfp4_per_token_bf16_bwd")
    step = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        logits = step(input_ids).logits          # == model(input_ids).logits
"""
from __future__ import annotations

import weakref

import torch

_MODULES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def register(module: torch.nn.Module) -> None:
    """Make ``module`` reachable by the op (its key is ``id(module)``). Called eagerly, at construction and on
    every eager call (a deep copy is registered by its first call), never while tracing."""
    if _MODULES.get(id(module)) is not module:
        _MODULES[id(module)] = module


@torch.library.custom_op("minite::linear_forward", mutates_args=())
def linear_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, key: int) -> torch.Tensor:
    module = _MODULES.get(key)
    if module is None:
        raise RuntimeError(f"minite::linear_forward: no registered module with key {key}: run the model once "
                           "eagerly (e.g. a deep copy) before compiling it")
    with torch.no_grad():
        y = module._apply_linear(x, weight, bias)
    if x.is_cuda:
        # Under CUDA graphs (torch.compile's "reduce-overhead", transformers' static-cache generate) every tensor
        # still alive in the graph's memory pool must be an output. cudagraph trees also run warm-up calls in
        # that pool without capturing, so the backend's remembered last input and its quantization (kept to
        # share one quantization between q/k/v) are dropped after every compiled call, not only while capturing.
        clear = getattr(module.backend_for(x.device), "clear_cache", None)
        if clear is not None:
            clear()
    # a custom op's output may not alias an input
    inputs = {t.untyped_storage().data_ptr() for t in (x, weight, bias) if t is not None}
    return y.clone() if y.untyped_storage().data_ptr() in inputs else y


@linear_forward.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, key: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def compiled_forward(module: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """What ``forward`` runs while ``torch.compile`` traces: the custom op (no autograd)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise RuntimeError(
            "torch.compile of minite quantized linears covers inference only (run under torch.no_grad() or "
            "torch.inference_mode()); train with the eager modules, whose backward follows the recipe"
        )
    return torch.ops.minite.linear_forward(x, weight, bias, id(module))

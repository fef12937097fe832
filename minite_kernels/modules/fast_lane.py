"""The learner's fast lane: a dense quantized linear with a W4A4 forward and a BF16 backward on the forward's
dequantized operands (``nvfp4_per_token_bf16_bwd`` on the Triton backend), with as little host work as the math
needs (issue #6: the Qwen3-1.7B training step was host-bound, the GPU kernels only 1.2% slower than BF16's).
The dense autograd function (``functional._DenseQLinear``) runs it for the calls :func:`call_ok` accepts;
the sampler's packed projections (``rollout/packed.py``) use its forward.

For one dense layer (report §4.3 with ``backward_operands="dequantized_forward"`` and BF16 dgrad/wgrad specs)::

    X̂ = deq(Q_token(X))   one Triton launch: packed NVFP4 bytes, scales, amax, and X̂ in BF16
    Ŵ = deq(Q(W))         cached per weight version (the weight cache of ``weight_cache.py``)
    Y  = X̂ Ŵᵀ (+ b)       dX = dY Ŵ       dW = dYᵀ X̂       db = Σ_rows dY

These are the generic path's operations for this recipe (``functional._forward_dense`` / ``_backward_dense``
with the kernel choice ``gemm="dequant"`` and ``save_activations="dequantized"``): the same kernel, the same
operands, the same ``torch.mm`` calls, so outputs and gradients are bit-identical (``tests/.../
test_fast_lane.py``). What it leaves out is the per-call generality: the plan (:func:`lane_ok`) checks the
recipe, its resolved kernel choice and the backend once; each call checks only what can change (dtype, layout,
row count) and otherwise takes the generic path. The lane reaches its backend only through public methods
(``LANE_METHODS``), so any backend that provides them can carry it.

Worked example (BF16 values exactly representable in NVFP4): X = [[1, 2] + 14 zeros] quantizes per token to
X̂ = X (amax 2 → every value is on the E2M1 grid times its scale), W = I₁₆ to Ŵ = W, so Y = X and, with
dY = Y, dX = X and dW = Xᵀ X, as ``nn.Linear`` would give.

The kernel choice ``lane="off"`` (``recipe.with_kernels(lane="off")``, or ``MINITE_LINEAR_LANE=off`` for every
recipe) sends every call down the generic path (for comparisons; default ``auto``).
"""

from __future__ import annotations

import torch

from minite_kernels.backends.base import Backend
from minite_kernels.modules.weight_cache import WeightCache, fprop_weight
from minite_kernels.recipes import KernelChoice, PrecisionRecipe

#: what the lane asks of its backend, all public (``TritonBackend``): the one-launch per-token quantizer with its
#: BF16 copy, the per-call device/routing check, and the memoized BF16 dequantized weight
LANE_METHODS = ("quantize_token_deq", "lane_accepts", "dequantized")


#: the BF16 per-token kernel's row limit (``quantize.py``: K // 2 <= 8192 words)
MAX_K = 16384


def lane_ok(
    recipe: PrecisionRecipe,
    kernels: KernelChoice,
    quantizer: Backend,
    fprop_backend: Backend,
    dgrad_backend,
    wgrad_backend,
) -> bool:
    """Whether a plan's dense calls may take the lane: decided once per (recipe, resolved kernel choice,
    backend)."""
    a, b = recipe.fprop.a, recipe.fprop.b
    return (
        kernels.lane == "auto"
        and kernels.save_activations == "dequantized"
        and kernels.gemm == "dequant"
        and all(hasattr(quantizer, name) for name in LANE_METHODS)
        and fprop_backend is quantizer
        and a.format == "nvfp4"
        and a.scaling == "per_token"
        and tuple(a.tile) == (1, 16)
        and not a.rht
        and not a.stochastic_rounding
        and b.quantized
        and recipe.backward_operands == "dequantized_forward"
        # no backend: a plain BF16 matmul, both operands unquantized (functional._route_gemm)
        and dgrad_backend is None
        and wgrad_backend is None
    )


def call_ok(lane: tuple, x2d: torch.Tensor, weight: torch.Tensor) -> bool:
    """Per-call conditions (cheap first): a BF16 contiguous input at an even offset and a BF16 weight, K within
    the kernel's limit, and the backend's own check (device, decode routing by row count)."""
    return x2d.is_contiguous() and x2d.storage_offset() % 2 == 0 and deq_ok(lane, x2d, weight)


def deq_ok(lane: tuple, x2d: torch.Tensor, weight: torch.Tensor) -> bool:
    """:func:`call_ok` without the conditions on ``x2d``'s layout: whether the lane runs for an input with
    ``x2d``'s rows, dtype and device, i.e. whether an X̂ made elsewhere (contiguous) may stand in for its
    quantizer's."""
    m, k = x2d.shape
    return (
        x2d.dtype is torch.bfloat16
        and weight.dtype is torch.bfloat16
        and k <= MAX_K
        and k % 16 == 0
        and m > 0
        and lane[2].lane_accepts(x2d)
    )


def lane_weight(lane: tuple, cache: WeightCache, weight: torch.Tensor) -> torch.Tensor:
    """Ŵ = deq(Q(W)) in BF16 for the current weight. With the Triton backend's cached weight, Ŵ is the very
    tensor the generic backward's ``dequantize_operand`` returns; a weight quantized elsewhere
    (``set_quantized_weight``) is dequantized once and memoized on its cached object, to the same values (the
    Triton dequantizer is bit-equal to the reference), so no per-step copy is held."""
    recipe, backend, quantizer = lane  # backend: the module's (``auto`` routes); quantizer: the routed one
    return quantizer.dequantized(fprop_weight(recipe, backend, cache, weight, weight, 0))


def lane_qweight(lane: tuple, cache: WeightCache, weight: torch.Tensor):
    """Q(W), the current weight's NVFP4 operand (``data``, ``scales``, ``amax``) that :func:`lane_weight`
    dequantizes: what the sampler's FP4-weight GEMM reads (``backends/triton/fp4w.py``)."""
    recipe, backend, _ = lane
    return fprop_weight(recipe, backend, cache, weight, weight, 0)


def dequantized_linear(lane: tuple, x2d: torch.Tensor, w_hat: torch.Tensor, bias) -> tuple:
    """(Y, X̂): ``Y = deq(Q_token(X)) Ŵᵀ (+ b)`` given Ŵ. ``w_hat`` may stack several layers' Ŵ along N (one
    GEMM for q/k/v of one input, as the sampler's packed projections): X̂ is per token, so each layer's
    columns of Y are that layer's output."""
    recipe, _, quantizer = lane
    qx = quantizer.quantize_token_deq(x2d, recipe.fprop.a)
    return deq_linear(qx.deq, w_hat, bias), qx.deq


def deq_linear(x_hat: torch.Tensor, w_hat: torch.Tensor, bias) -> torch.Tensor:
    """``Y = X̂ Ŵᵀ (+ b)`` on the two BF16 dequantized operands: the lane's GEMM, for callers that made X̂
    themselves (the sampler's norm fused with the quantizer, ``backends/triton/norm_quant.py``)."""
    y = torch.mm(x_hat, w_hat.t())
    if bias is not None:
        y = y + (bias if bias.dtype == y.dtype else bias.to(y.dtype))
    return y


def lane_forward(lane: tuple, cache: WeightCache, x2d, weight, bias):
    """(Y, X̂, Ŵ): the forward's BF16 operands, which the backward reuses."""
    w_hat = lane_weight(lane, cache, weight)
    y, x_hat = dequantized_linear(lane, x2d, w_hat, bias)
    return y, x_hat, w_hat


def lane_backward(dy: torch.Tensor, x_hat: torch.Tensor, w_hat: torch.Tensor, need_dx: bool, need_dw: bool,
                  need_db: bool) -> tuple:
    """(dX, dW, db) = (dY Ŵ, dYᵀ X̂, Σ_rows dY), each None where not needed; ``dy`` contiguous."""
    dx = torch.mm(dy, w_hat) if need_dx else None
    dw = torch.mm(dy.t(), x_hat) if need_dw else None
    db = dy.sum(dim=0) if need_db else None
    return dx, dw, db

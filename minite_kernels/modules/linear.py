"""``Linear``: a drop-in ``nn.Linear`` whose three GEMMs follow a precision recipe (report §4.2, §7.1).

It *is* an ``nn.Linear`` (same ``weight``/``bias`` parameters, init, ``state_dict`` and meta-device
construction), so FSDP, HF loading and weight streaming to a rollout engine see nothing new. Quantized
weights live in a non-persistent cache invalidated by the weight's version counter.

Example (report §7.1)::

    params = get_qlinear_params("nvfp4_per_token")
    layer = Linear(1024, 1024, bias=False, params_dtype=torch.bfloat16, device="cuda", qlinear_params=params)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minite_kernels.backends import Backend, get_backend
from minite_kernels.modules.compile_op import compiled_forward, register
from minite_kernels.modules.functional import WeightCache, _Memo, qlinear
from minite_kernels.recipes import PrecisionRecipe, get_qlinear_params


def check_features(recipe: PrecisionRecipe, in_features: int, out_features: int, what: str) -> None:
    """Raise if the recipe's block sizes do not divide the layer's feature dims."""
    k_mult, n_mult = recipe.feature_alignment()
    bad = []
    if in_features % k_mult:
        bad.append(f"in_features={in_features} is not a multiple of {k_mult} (fprop contracts over it)")
    if out_features % n_mult:
        bad.append(f"out_features={out_features} is not a multiple of {n_mult} (dgrad contracts over it)")
    if bad:
        raise ValueError(
            f"{what} with recipe {recipe.name!r}: "
            + "; ".join(bad)
            + ". Keep this layer in BF16 (quantize_model does so and reports it) or use recipe 'bf16'."
        )


class QuantizedLinearMixin:
    """Recipe, backend and weight-cache plumbing shared by the quantized modules."""

    qlinear_params: PrecisionRecipe
    backend_name: str
    generator: torch.Generator | None

    def _init_quant(self, qlinear_params, backend: str | Backend) -> None:
        self.qlinear_params = get_qlinear_params(qlinear_params)
        self.backend_name = backend if isinstance(backend, str) else backend.name
        self._backend_obj = backend if isinstance(backend, Backend) else None
        self._weight_cache = WeightCache()
        self.generator = None
        self._dispatch_memo = _Memo()  # (recipe, recipe.quantized, backend_name, device, backend)
        register(self)

    @property
    def recipe(self) -> PrecisionRecipe:
        return self.qlinear_params

    def backend_for(self, device: torch.device) -> Backend:
        if self._backend_obj is not None:
            return self._backend_obj
        return get_backend(self.backend_name, device)

    def _dispatch(self, device: torch.device) -> tuple:
        """(recipe, recipe.quantized, backend_name, device, backend), remembered while the recipe object,
        the backend name and the device stay the same (get_backend returns one instance per name/device)."""
        slot = self.__dict__.get("_dispatch_memo")
        if slot is None:  # a module unpickled from an older version
            slot = self.__dict__["_dispatch_memo"] = _Memo()
        d = slot.value
        r = self.qlinear_params
        if d is None or d[0] is not r or d[2] != self.backend_name or d[3] != device:
            d = slot.value = (r, r.quantized, self.backend_name, device, self.backend_for(device))
            register(self)  # a deep copy's memo starts empty: this registers the copy for compile_op
        elif self._backend_obj is not None and d[4] is not self._backend_obj:
            d = slot.value = (r, r.quantized, self.backend_name, device, self._backend_obj)
        return d

    def invalidate_quantized_weights(self) -> None:
        """Drop cached quantized weights (normally automatic: the cache is keyed on the weight version)."""
        self._weight_cache.clear()

    def set_quantized_weight(self, quantized, *, group: int = 0) -> None:
        """Hand the module an already-quantized fprop weight (e.g. from a batched weight-sync re-quantizer);
        it must be the quantization of the current weight with ``recipe.fprop.b`` (format and tile are
        checked). It stays valid until the weight changes, like a cached one."""
        spec = self.qlinear_params.fprop.b
        weight = self.weight if hasattr(self, "weight") else self.gate_up_proj
        w = weight[group] if weight.dim() == 3 else weight
        if not spec.quantized:
            raise ValueError(f"recipe {self.qlinear_params.name!r} does not quantize the fprop weight")
        if tuple(getattr(quantized, "shape", ())) != tuple(w.shape):
            raise ValueError(
                f"quantized weight has shape {tuple(quantized.shape)}, the weight is {tuple(w.shape)}"
            )
        if (
            getattr(quantized, "tile", spec.tile) != spec.tile
            or getattr(quantized, "scaling", spec.scaling) != spec.scaling
        ):
            raise ValueError(f"quantized weight was not made with {spec.summary()}")
        self._weight_cache.put(("fprop", spec, group), weight, quantized)

    def _apply_linear(self, x: torch.Tensor, weight: torch.Tensor, bias, m_splits=None) -> torch.Tensor:
        if not x.is_floating_point():  # as nn.Linear: integer inputs are a mistake, not something to round
            raise TypeError(f"{type(self).__name__}: input dtype {x.dtype} is not a floating type; valid: "
                            "float32, bfloat16, float16, float64")
        r, quantized, _, _, backend = self._dispatch(x.device)
        if not quantized and m_splits is None:
            return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
        return qlinear(
            x,
            weight,
            bias,
            r,
            backend,
            self._weight_cache,
            m_splits=m_splits,
            generator=self.generator,
        )

    def quant_extra_repr(self) -> str:
        r = self.qlinear_params
        return f"recipe={r.name}{'+bwd_bypass' if r.backward_bypass else ''}, backend={self.backend_name}"


class Linear(QuantizedLinearMixin, nn.Linear):
    """``y = x Wᵀ + b`` with recipe-controlled fprop/dgrad/wgrad. Works for any leading dims and bf16/fp32 params.

    Args mirror ``nn.Linear`` plus TE/miniTE's ``params_dtype`` (alias of ``dtype``), ``qlinear_params``
    (a recipe or its name; None resolves explicit > ``$MINITE_RECIPE`` > default) and ``backend``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device=None,
        dtype: torch.dtype | None = None,
        params_dtype: torch.dtype | None = None,
        qlinear_params: PrecisionRecipe | str | None = None,
        backend: str | Backend = "auto",
    ) -> None:
        if dtype is not None and params_dtype is not None and dtype != params_dtype:
            raise ValueError(f"dtype={dtype} and params_dtype={params_dtype} disagree; pass one of them")
        nn.Linear.__init__(
            self, in_features, out_features, bias=bias, device=device, dtype=params_dtype or dtype
        )
        self._init_quant(qlinear_params, backend)
        check_features(
            self.qlinear_params, in_features, out_features, f"Linear({in_features}, {out_features})"
        )

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        recipe: PrecisionRecipe | str | None = None,
        *,
        backend: str | Backend = "auto",
    ) -> Linear:
        """A quantized Linear sharing ``linear``'s parameters (no copy; works for meta tensors)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new._init_quant(recipe, backend)
        check_features(
            new.qlinear_params,
            new.in_features,
            new.out_features,
            f"Linear({new.in_features}, {new.out_features})",
        )
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced by torch.compile: one opaque custom op (compile_op.py)
            return compiled_forward(self, x, self.weight, self.bias)
        return self._apply_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.quant_extra_repr()}"

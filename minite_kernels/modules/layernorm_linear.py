"""``LayerNormLinear``: normalization followed by a recipe-quantized linear (TE's module, report §4.1, §7.1).

``y = norm(x) Wᵀ + b`` with ``norm`` = LayerNorm ``(x-μ)/sqrt(σ²+eps)·γ+β`` or RMSNorm ``x/sqrt(mean(x²)+eps)·γ``;
``zero_centered_gamma`` stores ``γ-1`` (TE's option). Parameter names follow TE: ``layer_norm_weight``,
``layer_norm_bias`` (LayerNorm only), ``weight``, ``bias``. The normalization runs in PyTorch (autograd
native); its output is what the fprop quantizer sees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minite_kernels.backends import Backend
from minite_kernels.modules.linear import QuantizedLinearMixin, check_features
from minite_kernels.recipes import PrecisionRecipe
from minite_util.choices import did_you_mean

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


class LayerNormLinear(QuantizedLinearMixin, nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        normalization: str = "LayerNorm",
        eps: float = 1e-5,
        zero_centered_gamma: bool = False,
        return_layernorm_output: bool = False,
        device=None,
        params_dtype: torch.dtype | None = None,
        qlinear_params: PrecisionRecipe | str | None = None,
        backend: str | Backend = "auto",
    ) -> None:
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization={normalization!r} is unknown; valid: {', '.join(NORMALIZATIONS)}"
                             f"{did_you_mean(normalization, NORMALIZATIONS, cutoff=0.0)}")
        self.in_features, self.out_features = in_features, out_features
        self.normalization, self.eps = normalization, eps
        self.zero_centered_gamma, self.return_layernorm_output = zero_centered_gamma, return_layernorm_output
        kw = {"device": device, "dtype": params_dtype}
        self.layer_norm_weight = nn.Parameter(torch.empty(in_features, **kw))
        self.layer_norm_bias = (
            nn.Parameter(torch.empty(in_features, **kw)) if normalization == "LayerNorm" else None
        )
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self._init_quant(qlinear_params, backend)
        check_features(
            self.qlinear_params, in_features, out_features, f"LayerNormLinear({in_features}, {out_features})"
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight.is_meta:
            return
        with torch.no_grad():
            if self.zero_centered_gamma:
                nn.init.zeros_(self.layer_norm_weight)
            else:
                nn.init.ones_(self.layer_norm_weight)
            if self.layer_norm_bias is not None:
                nn.init.zeros_(self.layer_norm_bias)
        # nn.Linear's default init
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)
        if self.bias is not None:
            bound = 1 / self.in_features**0.5 if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        gamma = self.layer_norm_weight + 1 if self.zero_centered_gamma else self.layer_norm_weight
        gamma = gamma.to(x.dtype)
        if self.normalization == "RMSNorm":
            return F.rms_norm(x, (self.in_features,), gamma, self.eps)
        beta = self.layer_norm_bias.to(x.dtype)
        return F.layer_norm(x, (self.in_features,), gamma, beta, self.eps)

    def forward(self, x: torch.Tensor):
        ln_out = self.norm(x)
        y = self._apply_linear(ln_out, self.weight, self.bias)
        return (y, ln_out) if self.return_layernorm_output else y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"normalization={self.normalization}, eps={self.eps}, {self.quant_extra_repr()}"
        )

"""``GroupedLinear``: G expert linears in one contiguous weight buffer, driven by row counts (report §5.2).

``weight`` is one ``[G, N, K]`` parameter (``bias`` ``[G, N]``): quantized data, scales and outer scales are
produced per expert from that buffer and expert boundaries travel as ``m_splits`` (row counts) or
``offsets`` (``[G+1]`` prefix sums), never as lists of separate tensors. Rows of ``x`` must be sorted by
expert. Expert g computes ``y[o_g:o_{g+1}] = x[o_g:o_{g+1}] W_gᵀ + b_g`` with its own quantization (per-tensor
amaxes are per expert, as in TE's GroupedLinear); experts with zero tokens produce no rows and a zero
weight gradient.

Example: G=2, m_splits=[3, 0] → rows 0..2 use W_0, expert 1 receives nothing and dW_1 = 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from minite_kernels.backends import Backend
from minite_kernels.modules.linear import QuantizedLinearMixin, check_features
from minite_kernels.recipes import PrecisionRecipe


def offsets_to_splits(offsets: Sequence[int] | torch.Tensor) -> list[int]:
    """``[0, o_1, ..., o_G]`` prefix sums → G row counts (validated non-decreasing, starting at 0)."""
    if isinstance(offsets, torch.Tensor):
        offsets = offsets.tolist()
    offsets = [int(o) for o in offsets]
    if not offsets or offsets[0] != 0 or any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError(f"offsets must start at 0 and be non-decreasing, got {offsets}")
    return [b - a for a, b in itertools.pairwise(offsets)]


class GroupedLinear(QuantizedLinearMixin, nn.Module):
    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device=None,
        params_dtype: torch.dtype | None = None,
        qlinear_params: PrecisionRecipe | str | None = None,
        backend: str | Backend = "auto",
    ) -> None:
        super().__init__()
        if num_gemms < 1:
            raise ValueError(f"num_gemms must be >= 1, got {num_gemms}")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        kw = {"device": device, "dtype": params_dtype}
        self.weight = nn.Parameter(torch.empty(num_gemms, out_features, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(num_gemms, out_features, **kw)) if bias else None
        self._init_quant(qlinear_params, backend)
        check_features(
            self.qlinear_params,
            in_features,
            out_features,
            f"GroupedLinear({num_gemms}, {in_features}, {out_features})",
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight.is_meta:
            return
        bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
        with torch.no_grad():
            for g in range(self.num_gemms):  # nn.Linear's init, per expert
                nn.init.kaiming_uniform_(self.weight[g], a=math.sqrt(5))
            if self.bias is not None:
                nn.init.uniform_(self.bias, -bound, bound)

    def forward(
        self,
        x: torch.Tensor,
        m_splits: Sequence[int] | torch.Tensor | None = None,
        *,
        offsets: Sequence[int] | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [T, K] sorted by expert; give ``m_splits`` (G counts) or ``offsets`` (G+1 prefix sums)."""
        if (m_splits is None) == (offsets is None):
            raise ValueError("GroupedLinear.forward needs exactly one of m_splits (row counts) or offsets")
        if offsets is not None:
            m_splits = offsets_to_splits(offsets)
        if x.dim() != 2:
            raise ValueError(
                f"GroupedLinear expects x of shape [tokens, {self.in_features}], got {tuple(x.shape)}"
            )
        return self._apply_linear(x, self.weight, self.bias, m_splits=m_splits)

    def extra_repr(self) -> str:
        return (
            f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, {self.quant_extra_repr()}"
        )

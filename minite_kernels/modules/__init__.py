"""Quantized learner modules: Linear, LayerNormLinear, GroupedLinear (+ GroupedExperts for HF fused MoE experts).

Report §4.1/§7.1: the linear layer is the integration unit; each module keeps TE's parameter names and its
fprop/dgrad/wgrad follow a :class:`~minite_kernels.recipes.PrecisionRecipe`.
"""

from __future__ import annotations

from minite_kernels.modules.functional import WeightCache, qlinear
from minite_kernels.modules.grouped_linear import GroupedLinear
from minite_kernels.modules.layernorm_linear import LayerNormLinear
from minite_kernels.modules.linear import Linear
from minite_kernels.modules.moe import GroupedExperts

__all__ = ["GroupedExperts", "GroupedLinear", "LayerNormLinear", "Linear", "WeightCache", "qlinear"]

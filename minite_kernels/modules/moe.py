"""Quantized replacement for Hugging Face fused MoE experts (Qwen3-MoE and look-alikes), via GroupedLinear math.

transformers 5.x stores the experts of ``Qwen3MoeExperts`` as two 3-D parameters, ``gate_up_proj``
``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]`` (``[E, N, K]``: not transposed, gate then up concatenated).
:class:`GroupedExperts` keeps exactly those parameters (same names and shapes, so ``state_dict`` and
checkpoint loading are unchanged) and computes, for the (token, slot) pairs sorted by expert::

    h = x_e W_gate_upᵀ;  a = act(h[:, :I]) * h[:, I:];  y_e = a W_downᵀ;  out[token] += w_slot * y_e

with both projections run by the grouped quantized linear (``modules.functional.qlinear`` with ``m_splits``
= tokens per expert, zero-token experts included), i.e. the same autograd and recipe handling as
:class:`~minite_kernels.modules.GroupedLinear`.
"""

from __future__ import annotations

import torch
from torch import nn

from minite_kernels.backends import Backend
from minite_kernels.modules.linear import QuantizedLinearMixin, check_features
from minite_kernels.recipes import PrecisionRecipe


class GroupedExperts(QuantizedLinearMixin, nn.Module):
    def __init__(
        self,
        gate_up_proj: nn.Parameter,
        down_proj: nn.Parameter,
        act_fn,
        *,
        qlinear_params: PrecisionRecipe | str | None = None,
        backend: str | Backend = "auto",
    ) -> None:
        super().__init__()
        if gate_up_proj.dim() != 3 or down_proj.dim() != 3:
            raise ValueError("GroupedExperts expects 3-D gate_up_proj [E, 2I, H] and down_proj [E, H, I]")
        e, two_i, h = gate_up_proj.shape
        if two_i % 2 or tuple(down_proj.shape) != (e, h, two_i // 2):
            raise ValueError(
                f"incompatible expert shapes: gate_up_proj {tuple(gate_up_proj.shape)}, down_proj "
                f"{tuple(down_proj.shape)}; expected [E, 2I, H] and [E, H, I]"
            )
        self.num_experts, self.hidden_dim, self.intermediate_dim = e, h, two_i // 2
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self.act_fn = act_fn
        self._init_quant(qlinear_params, backend)
        from minite_kernels.modules.functional import WeightCache

        self._down_cache = WeightCache()
        check_features(self.qlinear_params, h, two_i, "experts.gate_up_proj")
        check_features(self.qlinear_params, self.intermediate_dim, h, "experts.down_proj")

    @classmethod
    def from_hf(cls, experts: nn.Module, recipe=None, *, backend: str | Backend = "auto") -> GroupedExperts:
        if getattr(experts, "is_transposed", False) or getattr(experts, "has_bias", False):
            raise ValueError(
                f"{type(experts).__name__}: transposed or biased fused experts are not supported"
            )
        if not getattr(experts, "has_gate", True):
            raise ValueError(f"{type(experts).__name__}: experts without a gate projection are not supported")
        new = cls(
            experts.gate_up_proj, experts.down_proj, experts.act_fn, qlinear_params=recipe, backend=backend
        )
        new.train(experts.training)
        return new

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        from minite_kernels.modules.functional import qlinear

        k = top_k_index.shape[1]
        flat_expert = top_k_index.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)
        token_of = order // k
        counts = torch.bincount(flat_expert, minlength=self.num_experts)[: self.num_experts]
        splits = counts.tolist()
        x = hidden_states[token_of]
        backend = self.backend_for(hidden_states.device)
        r = self.qlinear_params
        h = qlinear(
            x,
            self.gate_up_proj,
            None,
            r,
            backend,
            self._weight_cache,
            m_splits=splits,
            generator=self.generator,
        )
        gate, up = h.chunk(2, dim=-1)
        a = self.act_fn(gate) * up
        y = qlinear(
            a, self.down_proj, None, r, backend, self._down_cache, m_splits=splits, generator=self.generator
        )
        w = top_k_weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(hidden_states)
        out.index_add_(0, token_of, (y * w).to(out.dtype))
        return out

    def invalidate_quantized_weights(self) -> None:
        super().invalidate_quantized_weights()
        self._down_cache.clear()

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
            f"intermediate_dim={self.intermediate_dim}, {self.quant_extra_repr()}"
        )

"""Token-level truncated importance sampling (TIS; Yao et al. 2025; report §3.1, TRIAGE.md §1).

    w_tis = min(exp(clamp(delta, -20, 20)), C),   delta = old_logp - sampler_logp,   C = tis_cap = 2

The weight is detached; it multiplies the per-token PPO loss. It is the same weight as verl's
``rollout_is=token`` with ``rollout_is_threshold=C`` (same +-20 safety clamp).

Worked example (C = 2): delta = [-1.0, 0.0, 0.5, 3.0] -> w = [0.3679, 1.0, 1.6487, 2.0] (last one clipped).
"""

from __future__ import annotations

import torch

SAFETY_BOUND = 20.0


def tis_weights(delta: torch.Tensor, cap: float) -> torch.Tensor:
    """Detached ``min(exp(clamp(delta, -20, 20)), cap)`` in fp32."""
    with torch.no_grad():
        return torch.exp(delta.float().clamp(-SAFETY_BOUND, SAFETY_BOUND)).clamp_(max=cap)

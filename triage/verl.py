"""verl adapter: registers the TRIAGE loss as verl policy loss ``"triage"`` (verl 0.9.1).

Registration
    ``import verl`` loads the ``verl.plugins`` entry point ``triage = "triage.verl"`` declared in
    ``pyproject.toml``, so every process that imports verl (Ray workers included) has the loss. It also
    works with ``actor_rollout_ref.model.external_lib=triage.verl`` or
    ``VERL_USE_EXTERNAL_MODULES=triage.verl``. Select it with ``actor_rollout_ref.actor.policy_loss.loss_mode=triage``.

Contract
    ``compute_policy_loss_triage(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
    config, rollout_is_weights) -> (loss, {str: float})`` exactly as verl's ``ppo_loss`` calls built-in
    losses (keyword arguments). Entropy / KL terms are added by ``ppo_loss`` as for any loss.

Sampler log-probs (route (c) of the integration notes)
    verl hands a loss no rollout log-probs, only ``rollout_is_weights``. With
    ``algorithm.rollout_correction.rollout_is=token``, ``rollout_is_threshold=1e9`` (above exp(20), so
    nothing is truncated) and ``rollout_is_batch_normalize=false``, verl computes
    ``w = exp(clamp(old_logp - rollout_logp, -20, 20)) * mask``; this adapter takes the gap
    ``delta = old_logp - sampler_logp = log(w)`` (exact up to fp32 rounding and the +-20 clamp that TIS
    also applies; ``sampler_logp_from_weights`` gives the log-probs themselves), then applies its own TIS
    cap ``C``, gate and repair. A valid token whose weight is 0 (IcePop rejection, or a -inf gap) has no
    recoverable gap and is masked and counted in ``triage/nonfinite_tokens``. ``verl_overrides()`` returns the Hydra overrides; without
    ``rollout_is_weights`` the loss raises an error that names them. Do not combine with a finite TIS
    threshold or batch normalisation: the gap would be silently distorted.

Computation
    The fused pass of ``triage.fused`` (analytic gradient attached with one autograd node; the §6
    diagnostics in the metrics unless ``triage.diagnostics=false``) and the last step of ``triage.loss``
    (``policy_term``, ``repair_term``), as :func:`triage.triage_policy_loss`, under the normalisation below.

TRIAGE hyper-parameters
    ``actor_rollout_ref.actor.policy_loss._target_=triage.verl.TriagePolicyLossConfig`` makes the policy
    loss config a :class:`TriagePolicyLossConfig` whose ``triage`` sub-config holds any
    :class:`~triage.TriageConfig` field (``+actor_rollout_ref.actor.policy_loss.triage.repair_coef=0.05``).
    PPO clip ratios always come from the actor config (``clip_ratio``, ``clip_ratio_low/high``,
    ``clip_ratio_c``), as for verl's ``vanilla``. A plain ``PolicyLossConfig`` gives the defaults.

Aggregation (DP- and micro-batch-invariant)
    Policy term: token weights ``c_i * g * w_tis`` with the response-wise factor
    ``c_i = sum_t m / sum_t m g`` (TRIAGE.md §3), aggregated by verl's
    ``agg_loss(..., loss_agg_mode, **config.global_batch_info)``. Under ``seq-mean-token-mean`` this is
    exactly TRIAGE.md §3. Under any other mode the same factor is applied: every response keeps its
    total token weight ``sum_t m`` and the gated share is redistributed inside it, while the mode decides
    how responses and tokens are averaged, as it does for ``vanilla``.

    Repair term: TRIAGE.md §4 divides by ``N_seg``, the repair segments of one micro-batch, which would
    make the gradient depend on the micro-batch size. Here the normaliser is global:
    ``L_repair = repair_coef * dp_size * sum_{local segments} phi / (batch_num_tokens / repair_segment_len)``,
    i.e. segments are counted in 128-token equivalents of all valid tokens of the global mini-batch
    (``batch_num_tokens`` from ``global_batch_info``; local valid tokens when verl passes none, as
    ``agg_loss``'s ``token-mean`` does). Each micro-batch adds its segments' share, so the summed gradient
    is the same for any split and any DP size, and like ``L_pg`` the repair of one response is diluted by
    the size of the mini-batch rather than by how many other responses are positive. The metric
    ``triage/repair_loss`` reports the micro-batch's TRIAGE.md §4 value (``/ N_seg``) for monitoring.

Local trainers, which hold the sampler's log-probs, call the loss the way ``ppo_loss`` does but hand them over
directly (``sampler_log_prob``, no exp/log round trip)::

    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    loss_fn = get_policy_loss_fn("triage")
    actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mini_batch_mask.sum()),
                                       global_batch_size=mini_batch_responses, loss_scale_factor=None)
    loss, metrics = loss_fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                            loss_agg_mode=actor_cfg.loss_agg_mode, config=actor_cfg, sampler_log_prob=sampler_logp)
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.config import PolicyLossConfig

from triage.config import TriageConfig
from triage.fused import AttachGrad, Fused, fused_terms
from triage.loss import float_metrics, policy_term, record_repair, repair_term
from triage.tis import SAFETY_BOUND

LOSS_NAME = "triage"
RAW_RATIO_THRESHOLD = 1.0e9  # > exp(20): verl's token IS weights stay untruncated

__all__ = [
    "LOSS_NAME",
    "TriagePolicyLossConfig",
    "compute_policy_loss_triage",
    "make_rollout_is_weights",
    "sampler_logp_from_weights",
    "triage_config_from_actor",
    "verl_overrides",
]

_ROUTE_HELP = (
    "the 'triage' policy loss needs the sampler's log-probs, which verl passes to a loss only through "
    "rollout_is_weights. Set actor_rollout_ref.rollout.calculate_log_probs=true, "
    "algorithm.rollout_correction.rollout_is=token, "
    f"algorithm.rollout_correction.rollout_is_threshold={RAW_RATIO_THRESHOLD:g} and "
    "algorithm.rollout_correction.rollout_is_batch_normalize=false (triage.verl.verl_overrides() lists "
    "them); local trainers pass sampler_log_prob=<the sampler's log-probs>"
)


@dataclass
class TriagePolicyLossConfig(PolicyLossConfig):
    """verl ``PolicyLossConfig`` plus a ``triage`` sub-config (any :class:`TriageConfig` field)."""

    loss_mode: str = LOSS_NAME
    triage: Any = field(default_factory=dict)

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        object.__setattr__(self, "triage", _to_triage_config(self.triage))
        if self.loss_mode != LOSS_NAME:
            warnings.warn(
                f"TriagePolicyLossConfig with loss_mode={self.loss_mode!r}: the triage settings are unused "
                f"unless actor_rollout_ref.actor.policy_loss.loss_mode={LOSS_NAME}",
                stacklevel=2,
            )


def _to_triage_config(value: Any) -> TriageConfig:
    if value is None or isinstance(value, TriageConfig):
        return value if value is not None else TriageConfig()
    if not isinstance(value, Mapping):
        raise TypeError(
            f"policy_loss.triage must be a mapping of TriageConfig fields, got {type(value).__name__}"
        )
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    return TriageConfig.from_mapping(value)


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def triage_config_from_actor(config: Any) -> TriageConfig:
    """TriageConfig from ``config.policy_loss.triage`` with the PPO clip ratios of the actor config."""
    base = _to_triage_config(_get(_get(config, "policy_loss"), "triage"))
    clip = _get(config, "clip_ratio", base.clip_ratio_low)
    low = _get(config, "clip_ratio_low")
    high = _get(config, "clip_ratio_high")
    return dataclasses.replace(
        base,
        clip_ratio_low=float(clip if low is None else low),
        clip_ratio_high=float(clip if high is None else high),
        clip_ratio_c=float(_get(config, "clip_ratio_c", base.clip_ratio_c)),
    )


def make_rollout_is_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """verl's raw token IS weights ``exp(clamp(old - sampler, -20, 20)) * mask`` (fp32, detached).

    Equals ``compute_rollout_correction_weights(old - sampler, mask, "token", RAW_RATIO_THRESHOLD)``.
    """
    with torch.no_grad():
        ratio = torch.exp((old_logp.float() - sampler_logp.float()).clamp(-SAFETY_BOUND, SAFETY_BOUND))
        return ratio * mask.to(ratio.dtype)


def sampler_logp_from_weights(
    old_log_prob: torch.Tensor, rollout_is_weights: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``old - log(w)`` on valid tokens (``+inf`` where a valid weight is 0), ``old`` elsewhere."""
    if tuple(rollout_is_weights.shape) != tuple(old_log_prob.shape):
        raise ValueError(
            f"shape mismatch: rollout_is_weights has shape {tuple(rollout_is_weights.shape)} but "
            f"old_log_prob has shape {tuple(old_log_prob.shape)}"
        )
    with torch.no_grad():
        old = old_log_prob.detach().float()
        return torch.where(mask.bool(), old - torch.log(rollout_is_weights.detach().float()), old)


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_triage(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    sampler_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """TRIAGE as a verl policy loss (see the module docstring for routes and normalisation).

    The gap comes from ``rollout_is_weights`` (verl's route: ``log`` of the raw ratios) or, for a caller that
    has them (a local trainer), from the sampler's log-probs themselves: ``sampler_log_prob``, without the
    exp/log round trip. Pass one of the two."""
    if config is None:
        raise ValueError("the 'triage' policy loss needs the actor config (verl passes config=ActorConfig)")
    if sampler_log_prob is not None and rollout_is_weights is not None:
        raise ValueError("pass rollout_is_weights or sampler_log_prob to the 'triage' policy loss, not both")
    if rollout_is_weights is None and sampler_log_prob is None:
        raise ValueError(_ROUTE_HELP)
    cfg = triage_config_from_actor(config)
    mask = response_mask.bool() if response_mask.dtype != torch.bool else response_mask
    if sampler_log_prob is not None:
        f = fused_terms(log_prob, old_log_prob, advantages, mask, cfg, sampler_logp=sampler_log_prob)
    else:
        if tuple(rollout_is_weights.shape) != tuple(old_log_prob.shape):
            raise ValueError(
                f"shape mismatch: rollout_is_weights has shape {tuple(rollout_is_weights.shape)} but "
                f"old_log_prob has shape {tuple(old_log_prob.shape)}"
            )
        with torch.no_grad():  # delta = old - sampler = log(w); -inf for a valid zero weight -> masked, counted
            gap = torch.log(rollout_is_weights.detach().float())
        f = fused_terms(log_prob, old_log_prob, advantages, mask, cfg, gap=gap)
    gbi = dict(_get(config, "global_batch_info", None) or {})

    with torch.no_grad():
        # response-wise factor c_i = sum_t m / sum_t m g (TRIAGE.md §3); the sign makes l = -A u
        k, grad = policy_term(f, -f.row_tokens / f.gate_sum.clamp(min=1e-30))
        loss_mat = k * f.u  # fresh: backward keeps it, and f's tensors may be a graph's buffers
    loss_mat = AttachGrad.apply(log_prob, loss_mat, grad)
    loss = agg_loss(loss_mat=loss_mat, loss_mask=f.valid, loss_agg_mode=loss_agg_mode, **gbi)

    metrics = f.metrics
    if f.phi_sum is not None:
        with torch.no_grad():
            rep = repair_term(f, _repair_scale(f, cfg, gbi, log_prob.device), cfg.repair_segment_len)
            # the micro-batch's TRIAGE.md §4 value, for monitoring
            record_repair(f, metrics, cfg.repair_coef * f.phi_sum / f.num_segments.clamp(min=1))
        loss = loss + AttachGrad.apply(log_prob, *rep)
    return loss, float_metrics(metrics)


def _repair_scale(
    f: Fused, cfg: TriageConfig, gbi: dict[str, Any], device: torch.device
) -> torch.Tensor | float:
    """``repair_coef * dp_size / (batch_num_tokens / repair_segment_len)``: the global normaliser of the module
    docstring (local valid tokens when verl passes no count). Under no_grad."""
    dp_size = gbi.get("dp_size", 1) or 1
    num_tokens = gbi.get("batch_num_tokens")
    if num_tokens is None:
        if dp_size > 1:
            raise ValueError(
                "(global) batch_num_tokens is required in config.global_batch_info when dp_size > 1"
            )
        num_tokens = f.valid.sum()
    if isinstance(num_tokens, torch.Tensor):
        seg_equiv = num_tokens.to(device=device, dtype=torch.float32) / cfg.repair_segment_len
        return (cfg.repair_coef * dp_size) / seg_equiv.clamp(min=1e-30)
    # a host number: no host-to-device copy (a stream sync on CUDA)
    return (cfg.repair_coef * dp_size) / max(float(num_tokens) / cfg.repair_segment_len, 1e-30)


def verl_overrides(
    triage: Mapping[str, Any] | TriageConfig | None = None,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
) -> list[str]:
    """Hydra overrides for ``python -m verl.trainer.main_ppo`` that enable TRIAGE with this adapter."""
    overrides = [
        "actor_rollout_ref.actor.policy_loss._target_=triage.verl.TriagePolicyLossConfig",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={LOSS_NAME}",
        f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token",
        f"algorithm.rollout_correction.rollout_is_threshold={RAW_RATIO_THRESHOLD:.1e}",
        "algorithm.rollout_correction.rollout_is_batch_normalize=false",
    ]
    values = (
        triage.to_dict()
        if isinstance(triage, TriageConfig)
        else dict(TriageConfig.from_mapping(triage or {}).to_dict())
    )
    defaults = TriageConfig().to_dict()
    for key, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else repr(value)
        if key.startswith("clip_ratio"):  # read from the actor config, as in vanilla; verl's defaults differ
            overrides.append(f"actor_rollout_ref.actor.{key}={text}")
        elif value != defaults[key]:
            overrides.append(f"+actor_rollout_ref.actor.policy_loss.triage.{key}={text}")
    return overrides

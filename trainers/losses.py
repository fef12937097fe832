"""Loss modes: what the trainer does for each ``algorithm.loss_mode``, in one table.

A loss mode is a verl policy loss (``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``: vanilla, gspo, ...) and
the way the trainer feeds it. verl's own losses need nothing more than :class:`LossMode`. A mode that needs more
(its own settings section, the sampler's log-probs, a module that registers it with verl) is a subclass and one
entry of :data:`MODES`. The config checks (``trainers.config.validate``), the local learner
(``trainers.learner.actor``), the verl engine and the run summaries ask this module; no other module compares
loss-mode names.

    loss_mode("vanilla")  -> LossMode("vanilla"): verl's weights from algorithm.rollout_correction
    loss_mode("triage")   -> TRIAGE: the sampler's log-probs, algorithm.triage, the plugin triage.verl
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from minite_util.choices import did_you_mean

# ``alg`` below is the run's ``trainers.config.AlgorithmConfig``; it is not imported here, because
# trainers.config imports this module to validate a config.


@dataclass(frozen=True)
class LossMode:
    """A verl policy loss run as verl runs it: the sampler/learner gap reaches it as rollout-correction weights
    (``algorithm.rollout_correction``, verl's TIS, when set), and it has no settings of its own."""

    name: str
    #: a module whose import registers the loss with verl (verl's workers import it too: ``external_lib``)
    plugin: str | None = None
    #: the ``algorithm`` field holding the mode's own settings; setting it under another mode is an error
    settings: str | None = None
    #: the loss takes the sampler's log-probs (``sampler_log_prob``) and corrects for the gap itself, so verl's
    #: rollout-correction weights are neither computed nor passed
    sampler_logp: bool = False
    #: the run summary prints the gate and repair line (``trainers.summary.run_summary(triage=...)``)
    reports_gate: bool = False

    def check(self, alg: Any) -> None:
        """Raise ``ValueError`` (one line, naming the keys) for settings this mode cannot run with."""

    def loss_fn(self):
        """verl's registered function for this mode (``plugin`` imported first, so that it is registered even
        where verl's plugin entry point is not installed)."""
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn

        if self.plugin:
            importlib.import_module(self.plugin)
        try:
            return get_policy_loss_fn(self.name)
        except ValueError as e:
            valid = sorted(set(POLICY_LOSS_REGISTRY) | set(MODES))
            raise ValueError(
                f"algorithm.loss_mode={self.name!r} is not a registered verl policy loss"
                f"{did_you_mean(self.name, valid)}; valid choices: {', '.join(valid)}"
            ) from e

    def policy_loss_config(self, alg: Any):
        """The verl ``PolicyLossConfig`` of the actor config."""
        from verl.workers.config import PolicyLossConfig

        return PolicyLossConfig(loss_mode=self.name)

    def loss_inputs(self, *, weights: Any, sampler_logp: Any) -> dict[str, Any]:
        """The keyword arguments that carry the sampler/learner gap into the loss function."""
        if not self.sampler_logp:
            return {"rollout_is_weights": weights}
        if sampler_logp is None:
            raise ValueError(f"the {self.name} loss needs the sampler's log-probs (sampler_logp)")
        return {"sampler_log_prob": sampler_logp}

    def diagnostics_config(self, alg: Any):
        """The settings of the per-step mismatch diagnostics (``triage.mismatch_metrics``, logged for every loss):
        ``algorithm.triage``, whose TIS cap is verl's threshold where verl's rollout correction runs."""
        rc = alg.rollout_correction
        if self.sampler_logp or rc.rollout_is is None:
            return alg.triage
        return dataclasses.replace(alg.triage, tis_cap=float(rc.rollout_is_threshold))

    def verl_overrides(self, alg: Any) -> list[str]:
        """Hydra overrides of ``verl.trainer.main_ppo`` that this mode adds (``+key=value`` adds a key)."""
        return []


@dataclass(frozen=True)
class TriageMode(LossMode):
    """The TRIAGE loss (``triage.verl``): the sampler's log-probs, its own TIS cap, gate and repair."""

    def check(self, alg: Any) -> None:
        if alg.rollout_correction.rollout_is is not None:
            raise ValueError(
                f"algorithm.loss_mode={self.name} applies its own TIS cap (algorithm.{self.settings}.tis_cap); set "
                "algorithm.rollout_correction.rollout_is=null, otherwise the gap TRIAGE recovers would be truncated"
            )

    def policy_loss_config(self, alg: Any):
        from triage.verl import TriagePolicyLossConfig

        # diagnostics off: the engine computes them once per step over the whole batch (the same values)
        return TriagePolicyLossConfig(
            loss_mode=self.name, triage=dataclasses.replace(alg.triage, diagnostics=False)
        )

    def verl_overrides(self, alg: Any) -> list[str]:
        from triage.verl import verl_overrides

        return verl_overrides(alg.triage, loss_agg_mode=alg.loss_agg_mode)


#: the loss modes that need more than verl's defaults; any other name is a verl policy loss run as verl runs it
MODES: dict[str, LossMode] = {
    m.name: m
    for m in (
        TriageMode("triage", plugin="triage.verl", settings="triage", sampler_logp=True, reports_gate=True),
    )
}


def loss_mode(name: str) -> LossMode:
    """The mode of ``algorithm.loss_mode=name``. A name that is neither here nor a registered verl loss fails when
    its function is looked up (:meth:`LossMode.loss_fn`: verl is imported only there), naming the valid choices."""
    return MODES.get(name) or LossMode(name)


def check(alg: Any) -> None:
    """Cross-field checks of ``algorithm`` for its loss mode; ``ValueError`` names the keys to change."""
    loss_mode(alg.loss_mode).check(alg)
    for mode in MODES.values():
        if mode.settings is None or mode.name == alg.loss_mode:
            continue
        value = getattr(alg, mode.settings)
        if value != type(value)():
            raise ValueError(
                f"algorithm.{mode.settings} is set but algorithm.loss_mode={alg.loss_mode!r}; "
                f"use algorithm.loss_mode={mode.name} or drop algorithm.{mode.settings}"
            )

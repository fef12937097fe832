"""Loss modes (trainers.losses): one table the trainer asks; unknown names list the valid choices."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
import torch

from trainers import losses
from trainers.config import AlgorithmConfig, RolloutCorrectionConfig
from triage import TriageConfig

TIS = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=3.0)


def test_registered_and_verl_modes():
    triage = losses.loss_mode("triage")
    assert triage is losses.MODES["triage"]
    assert (triage.plugin, triage.settings, triage.sampler_logp, triage.reports_gate) == (
        "triage.verl",
        "triage",
        True,
        True,
    )
    gspo = losses.loss_mode("gspo")  # any other name: a verl loss run as verl runs it
    assert type(gspo) is losses.LossMode and gspo.name == "gspo"
    assert (gspo.plugin, gspo.settings, gspo.sampler_logp, gspo.reports_gate) == (None, None, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gspo.name = "x"  # type: ignore[misc]


def test_unknown_mode_names_the_valid_choices():
    with pytest.raises(
        ValueError,
        match=r"algorithm.loss_mode='vanila' is not a registered verl policy loss; did you "
        r"mean 'vanilla'\?; valid choices: .*\btriage\b.*\bvanilla\b",
    ) as e:
        losses.loss_mode("vanila").loss_fn()
    assert "\n" not in str(e.value)


def test_loss_fn_is_verls_registered_function():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from triage.verl import compute_policy_loss_triage

    assert losses.loss_mode("triage").loss_fn() is compute_policy_loss_triage
    assert losses.loss_mode("vanilla").loss_fn() is get_policy_loss_fn("vanilla")


def test_check_names_the_keys():
    losses.check(AlgorithmConfig())
    losses.check(AlgorithmConfig(loss_mode="triage", triage=TriageConfig(repair_coef=0.05)))
    losses.check(AlgorithmConfig(rollout_correction=TIS))
    with pytest.raises(ValueError, match=r"algorithm.loss_mode=triage applies its own TIS cap"):
        losses.check(AlgorithmConfig(loss_mode="triage", rollout_correction=TIS))
    with pytest.raises(
        ValueError,
        match=r"algorithm.triage is set but algorithm.loss_mode='gspo'; use "
        r"algorithm.loss_mode=triage or drop algorithm.triage",
    ):
        losses.check(AlgorithmConfig(loss_mode="gspo", triage=TriageConfig(gate=False)))


def test_loss_inputs_route_the_gap():
    w, s = torch.ones(1, 2), torch.zeros(1, 2)
    assert losses.loss_mode("vanilla").loss_inputs(weights=w, sampler_logp=s) == {"rollout_is_weights": w}
    assert losses.loss_mode("triage").loss_inputs(weights=None, sampler_logp=s) == {"sampler_log_prob": s}
    with pytest.raises(ValueError, match=r"the triage loss needs the sampler's log-probs"):
        losses.loss_mode("triage").loss_inputs(weights=w, sampler_logp=None)


def test_diagnostics_config_takes_verls_tis_cap_where_verl_corrects():
    assert losses.loss_mode("vanilla").diagnostics_config(AlgorithmConfig()) == TriageConfig()
    alg = AlgorithmConfig(rollout_correction=TIS)
    assert losses.loss_mode("vanilla").diagnostics_config(alg) == TriageConfig(tis_cap=3.0)
    own = AlgorithmConfig(loss_mode="triage", triage=TriageConfig(tis_cap=1.5))
    assert losses.loss_mode("triage").diagnostics_config(own) == TriageConfig(tis_cap=1.5)


def test_policy_loss_config_and_verl_overrides():
    from triage.verl import TriagePolicyLossConfig, verl_overrides

    alg = AlgorithmConfig(
        loss_mode="triage", loss_agg_mode="seq-mean-token-mean", triage=TriageConfig(repair_coef=0.05)
    )
    pl = losses.loss_mode("triage").policy_loss_config(alg)
    assert isinstance(pl, TriagePolicyLossConfig)
    assert pl.triage == TriageConfig(
        repair_coef=0.05, diagnostics=False
    )  # the engine computes them once per step
    assert losses.loss_mode("triage").verl_overrides(alg) == verl_overrides(
        alg.triage, loss_agg_mode="seq-mean-token-mean"
    )
    assert losses.loss_mode("vanilla").policy_loss_config(AlgorithmConfig()).loss_mode == "vanilla"
    assert losses.loss_mode("vanilla").verl_overrides(AlgorithmConfig()) == []


def test_no_loss_mode_comparisons_outside_the_registry():
    """A new loss mode is one entry of trainers.losses: no other trainer module compares loss-mode names."""
    root = pathlib.Path(losses.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "losses.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = {getattr(n, "attr", getattr(n, "id", None)) for n in (node.left, *node.comparators)}
                if "loss_mode" in names:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not found, f"loss_mode compared outside trainers/losses.py: {found}"

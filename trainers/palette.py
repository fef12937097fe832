"""One colour per arm, the same in every study's figures: the arm's role decides its colour, not its position.

Roles and colours (Okabe-Ito, readable with the common colour-vision deficiencies):

    reference    black      #000000   bf16, on_policy (no mismatch: what the corrections aim at)
    uncorrected  blue       #0072B2   nvfp4, rollout_nvfp4, none (mismatch, no correction)
    tis          orange     #E69F00   tis_nvfp4, tis_rollout_nvfp4, tis (truncated importance sampling)
    triage       green      #009E73   triage_nvfp4, triage_rollout_nvfp4, triage_bf16, triage (TRIAGE + TIS)
    strict       purple     #CC79A7   strict_nvfp4 (mismatch removed by batch-invariant kernels)
    gate_only    vermillion #D55E00   gate_only (ablation: TIS + TRIAGE's gate)
    repair_only  sky blue   #56B4E9   repair_only (ablation: TIS + TRIAGE's repair)

Any other arm gets the first of yellow, grey, brown not already taken in that figure (pass
``taken``), so a new arm never borrows a role's colour.

Example: ``colour("tis_rollout_nvfp4") == colour("tis") == "#E69F00"``.
"""
from __future__ import annotations

from collections.abc import Iterable

ROLE_COLOURS = {"reference": "#000000", "uncorrected": "#0072B2", "tis": "#E69F00", "triage": "#009E73",
                "strict": "#CC79A7", "gate_only": "#D55E00", "repair_only": "#56B4E9"}
EXTRA_COLOURS = ("#F0E442", "#999999", "#8C564B")
#: display names of the controlled study's arms and the learning studies' recipes
LABELS = {"on_policy": "on-policy (reference)", "none": "no correction", "tis": "TIS (C=2)", "triage": "TRIAGE",
          "gate_only": "TIS + gate only", "repair_only": "TIS + repair only"}


def role(arm: str) -> str | None:
    """The role of an arm name (a training recipe or a controlled-study arm), or None."""
    if arm.startswith(("gate_only", "repair_only")):
        return "gate_only" if arm.startswith("gate_only") else "repair_only"
    if arm.startswith("triage"):
        return "triage"
    if arm.startswith("tis"):
        return "tis"
    if arm.startswith("strict"):
        return "strict"
    if arm in ("bf16", "on_policy"):
        return "reference"
    if arm in ("none", "nvfp4", "rollout_nvfp4"):
        return "uncorrected"
    return None


def colour(arm: str, taken: Iterable[str] = ()) -> str:
    r = role(arm)
    if r is not None:
        return ROLE_COLOURS[r]
    used = set(taken)
    return next((c for c in EXTRA_COLOURS if c not in used), EXTRA_COLOURS[-1])


def colours(arms: Iterable[str]) -> dict[str, str]:
    """``{arm: colour}`` for the arms of one figure: role colours, then distinct extra colours in order."""
    out: dict[str, str] = {}
    for a in arms:
        out[a] = colour(a, out.values())
    return out

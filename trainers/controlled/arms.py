"""The controlled study's arms, shared by the runner (``study.py``) and the report (``report.py``): which arms
correct for the mismatch, the paired comparisons the tables show, and the learning runs."""

from __future__ import annotations

from trainers.controlled.config import ControlledConfig
from trainers.controlled.mismatch import ON_POLICY, Mismatch

#: paired comparisons (a - b), in the order the tables show them
PAIRS = (
    ("triage", "tis"),
    ("triage", "none"),
    ("tis", "none"),
    ("none", "on_policy"),
    ("gate_only", "tis"),
    ("repair_only", "tis"),
)
#: the arms that use the mismatched sampler's samples
CORRECTED = ("none", "tis", "triage", "gate_only", "repair_only")


def learning_runs(cfg: ControlledConfig) -> list[tuple[str, Mismatch, str]]:
    """``(name, mismatch, arm)`` of every learning run: the on-policy runs once, then each kind x corrected arm."""
    runs = [("on_policy", ON_POLICY, "on_policy")] if "on_policy" in cfg.arms else []
    for kind in cfg.kinds:
        m = Mismatch.of(kind, cfg.mismatch)
        runs += [(f"{kind}_{a}", m, a) for a in CORRECTED if a in cfg.arms]
    return runs


__all__ = ["CORRECTED", "PAIRS", "learning_runs"]

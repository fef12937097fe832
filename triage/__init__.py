"""TRIAGE: direction-aware stabilisation of low-precision RL (report §2.4, §2.5, §3.1, Appendix B).

Pure torch; importing this package does not import verl. The verl policy-loss plugin lives in
``triage.verl`` (registered automatically through the ``verl.plugins`` entry point).

    from triage import TriageConfig, gate_weights, repair_loss, triage_policy_loss, mismatch_metrics
"""

from __future__ import annotations

from triage.config import TriageConfig
from triage.diagnostics import mismatch_metrics
from triage.gate import gate_weights
from triage.loss import triage_policy_loss
from triage.repair import repair_loss

__all__ = ["TriageConfig", "gate_weights", "mismatch_metrics", "repair_loss", "triage_policy_loss"]

"""Registers ``rollout.name=minite`` in verl 0.9.1's two rollout registries, on import.

- ``verl.workers.rollout.base._ROLLOUT_REGISTRY[("minite", "async")]``: the ``BaseRollout`` the actor worker builds
  (:class:`~rollout.verl_backend.rollout.MiniteRollout`), looked up by ``get_rollout_class``;
- ``verl.workers.rollout.replica.RolloutReplicaRegistry``: the replica the trainer's ``LLMServerManager`` starts
  (:class:`~rollout.verl_backend.replica.MiniteReplica`), loaded lazily.

The project's ``verl.plugins`` entry point names this module (``pyproject.toml``), so every process that imports
verl (the driver, the task runner, each worker) registers it: ``import verl`` loads the group's entry points.
"""
from __future__ import annotations

from verl.workers.rollout.base import _ROLLOUT_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry

from rollout.verl_backend import NAME

ROLLOUT_CLASS = "rollout.verl_backend.rollout.MiniteRollout"


def _load_replica() -> type:
    from rollout.verl_backend.replica import MiniteReplica

    return MiniteReplica


def register() -> None:
    """Add ``minite`` to both registries (idempotent)."""
    _ROLLOUT_REGISTRY[(NAME, "async")] = ROLLOUT_CLASS
    RolloutReplicaRegistry.register(NAME, _load_replica)


register()

"""Import shim for ``ray`` on a machine without it (the lent H200), used by ``scripts/h200_study.sh`` only.

verl's ``verl.protocol`` imports ray at module level and reads ``ray.ObjectRef`` for type hints; the local
engine calls no ray function. The real wheel is 79 MB, more than one device call may carry, so the study
harness puts this folder on ``PYTHONPATH`` instead. Any other attribute raises, so a code path that really
needs ray fails loudly instead of running on a stand-in.
"""


class ObjectRef:  # a type only: verl uses it in annotations and isinstance checks
    pass


def __getattr__(name: str):
    raise ImportError(f"ray.{name}: ray is not installed here; this shim only provides ray.ObjectRef "
                      "(scripts/device_shims/ray)")

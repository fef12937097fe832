"""The task registry: :func:`task_names`, :func:`get_task`, :func:`parse_task_list`. The first lookup imports the
built-in tasks (``eval/tasks/``, one file each), which register themselves with ``eval.task_base.register``;
the interface they implement (:class:`Task`, :class:`MathTask`, :class:`Example`, :class:`SampleScore`) is in
``eval.task_base`` and re-exported here. ``eval.tasks`` imports ``eval.task_base`` only, never this module.

A task turns rows of its data file into :class:`Example` s (prompt text and gold answer), and a response
into a :class:`SampleScore`. One *run* of a task scores one response per example; ``avg@k`` is the mean of
the task's primary metric over ``k`` independent runs (report §6.2.2: AIME k=6; MATH-500, GSM8K and
IFEval k=4), and the reported spread is the sample standard deviation of the ``k`` run scores.
"""

from __future__ import annotations

from eval.task_base import (
    MATH_PROMPT_SUFFIX,
    REGISTRY,
    Example,
    MathTask,
    SampleScore,
    Task,
    first_field,
    register,
)
from minite_util.choices import did_you_mean

__all__ = [
    "MATH_PROMPT_SUFFIX",
    "Example",
    "MathTask",
    "SampleScore",
    "Task",
    "first_field",
    "get_task",
    "parse_task_list",
    "register",
    "task_names",
]


def task_names() -> list[str]:
    import eval.tasks  # noqa: F401  (registers the built-in tasks)

    return list(REGISTRY)


def get_task(name: str) -> Task:
    names = task_names()
    key = name.strip().lower()
    if key not in REGISTRY:
        raise ValueError(
            f"unknown task {name!r}{did_you_mean(key, names, cutoff=0.5)}; valid tasks: {', '.join(names)}"
        )
    return REGISTRY[key]()


def parse_task_list(spec: str) -> list[Task]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError(f"no tasks given; valid tasks: {', '.join(task_names())}")
    if len(set(names)) != len(names):
        raise ValueError(f"a task is listed twice in {spec!r}")
    return [get_task(n) for n in names]

"""Built-in tasks, one file each; importing this package registers them (``eval.task_base.register``; the
lookup by name is ``eval.task``)."""
from __future__ import annotations

from eval.tasks import aime24, aime25, amc23, arithmetic, gsm8k, ifeval, math500  # noqa: F401

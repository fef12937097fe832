"""A graceful stop on SIGTERM: a scheduler's pre-emption notice, ``kill``, or a study's time limit.

While :class:`GracefulStop` is active, the first SIGTERM only sets ``requested``; the trainer finishes the step in
progress, saves its checkpoint and returns, and ``python -m trainers.grpo`` exits with 143 (128 + SIGTERM). Nothing
trained is lost, and ``trainer.resume=auto`` continues at that step. A second SIGTERM takes the default action
(the process ends at once), for a caller that cannot wait for the step.
"""
from __future__ import annotations

import signal
import threading

#: the exit status of a run stopped by SIGTERM after saving its checkpoint (the shell's 128 + signal number)
EXIT_STOPPED = 128 + signal.SIGTERM


class GracefulStop:
    """Context manager: SIGTERM sets ``requested`` (main thread only; elsewhere it is inert)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once

    def __enter__(self) -> GracefulStop:  # noqa: PYI034 - Self needs Python 3.11; 3.10 is supported
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

"""One run per output directory: an exclusive, non-blocking ``flock`` on ``<run_dir>/.run.lock``.

Two trainers writing one directory interleave ``metrics.jsonl`` and prune each other's checkpoints. The second
one now stops at once with the first one's pid. The lock is the kernel's: it is released when its process exits,
however it exits, so a killed run never leaves a stale lock behind. The pid written in the file is
informational. Where ``fcntl`` does not exist (Windows), runs are not locked.

    with RunLock(run_dir):
        ...   # train
"""
from __future__ import annotations

import os
import pathlib

from trainers.config import ConfigError

LOCK_FILE = ".run.lock"


class RunLockedError(ConfigError):
    """Another process holds the run directory."""


class RunLock:
    def __init__(self, run_dir: pathlib.Path) -> None:
        self.path = pathlib.Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLockedError(
                f"another run (pid {holder}) is writing to {self.path.parent}; wait for it to finish, or choose "
                "another trainer.output_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:  # noqa: PYI034 - Self needs Python 3.11
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

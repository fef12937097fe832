"""Atomic file writes: every file this project writes (run metadata, metrics, checkpoints' small files, plots,
eval results, monitor dumps, parquet) goes through here.

The data goes to a temp file in the target's folder (``.<name>.<random>.tmp``), is flushed to disk, made
readable as the umask allows (``mkstemp`` creates it 0600), and renamed over the target (``os.replace``), so a
reader never sees a half-written file and a crash at any moment leaves the previous one. On any error the temp
file is removed and the error propagates.

    atomic_write_text(run_dir / "config.yaml", text)
    atomic_write_json(out_dir / "results.json", results)
    with atomic_path(out / "curves.png") as tmp:      # for writers that want a path (savefig, torch.save, parquet)
        fig.savefig(tmp, format="png")
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from collections.abc import Iterator
from typing import Any


def current_umask() -> int:
    """The process umask (read without changing it for longer than one call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int | None = None) -> Iterator[pathlib.Path]:
    """Yield a temp path beside ``path``; when the block ends without an error, it replaces ``path``.

    ``mode``: the file's permissions (default ``0o666`` less the umask, as ``open`` would give)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = pathlib.Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the writer may have closed its handle: flush what it wrote to the disk
            os.fsync(f.fileno())
        os.chmod(tmp, (0o666 & ~current_umask()) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int | None = None) -> None:
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any, **dump_kwargs: Any) -> None:
    """``json.dumps(obj, indent=2, ensure_ascii=False, **dump_kwargs)`` plus a newline, written atomically."""
    atomic_write_text(path, json.dumps(obj, **{"indent": 2, "ensure_ascii": False, **dump_kwargs}) + "\n")

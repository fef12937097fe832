"""File I/O shared by the whole project: atomic writes, file checksums, and reading the jsonl files users hand us.

Atomic writes: every file this project writes (run metadata, metrics, checkpoints' small files, plots, eval
results, monitor dumps, parquet) goes through here. The data goes to a temp file in the target's folder
(``.<name>.<random>.tmp``), is flushed to disk, made readable as the umask allows (``mkstemp`` creates it 0600),
and renamed over the target (``os.replace``), so a reader never sees a half-written file and a crash at any
moment leaves the previous one. On any error the temp file is removed and the error propagates.

    atomic_write_text(run_dir / "config.yaml", text)
    atomic_write_json(out_dir / "results.json", results)
    with atomic_path(out / "curves.png") as tmp:      # for writers that want a path (savefig, torch.save, parquet)
        fig.savefig(tmp, format="png")

``sha256_file`` checksums checkpoints and eval outputs. ``iter_json_objects(path, error)`` yields
``(line_number, object)`` for each non-blank line of a jsonl file and raises ``error`` (a ``ValueError``
subclass of the caller's choosing) for a path that is a directory or unreadable, a line that is not UTF-8, not
JSON, nested too deeply for the parser, or not a JSON object: one line naming the file and line.
"""
from __future__ import annotations

import contextlib
import hashlib
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


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def iter_json_objects(path: str | os.PathLike, error: type[ValueError] = ValueError) -> Iterator[tuple[int, dict]]:
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below; the open itself is what can fail
    except IsADirectoryError:
        raise error(f"{path} is a directory, not a jsonl file") from None
    except OSError as e:
        raise error(f"{path} cannot be read ({e.strerror})") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:
                raise error(f"{where}: JSON nested too deeply to read") from None
            if not isinstance(row, dict):
                raise error(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row

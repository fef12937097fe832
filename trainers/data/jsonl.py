"""Reading jsonl files that users hand us: every problem is one line naming the file and line.

``iter_json_objects(path, error)`` yields ``(line_number, object)`` for each non-blank line and raises ``error``
(a ``ValueError`` subclass of the caller's choosing) for a path that is a directory or unreadable, a line that is
not UTF-8, not JSON, nested too deeply for the parser, or not a JSON object.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator


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

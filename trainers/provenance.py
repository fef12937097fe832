"""Which code a run ran: a digest of the project's source files, kept per run in ``code.json`` with one entry per
execution that ran other code than the one before, so a study can tell whether its runs (and each run's steps)
came from one version of the code, as seeds added in blocks over several GPU sessions must (issue #40).

    digest = sha256( for each source file, in path order:  relative path  NUL  bytes  NUL )  as 16 hex digits

over the ``*.py`` and ``*.yaml`` files under :data:`SOURCES` (the packages and the recipes; not tests, scripts,
docs or recorded results, so a run reads the same digest wherever the tree was copied). A git checkout adds its
commit and whether those files differ from it. Worked example: a tree whose only source is ``trainers/a.py``
holding ``x = 1`` digests ``sha256(b"trainers/a.py\\0x = 1\\n\\0")``; editing a docstring anywhere in the packages
changes the digest (it identifies files, not behaviour).
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess

from minite_util.fileio import atomic_write_text

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: what the digest covers, relative to the repository root
SOURCES = ("minite_util", "minite_kernels", "triage", "scoring", "rollout", "eval", "trainers", "recipes")
SUFFIXES = (".py", ".yaml")
CODE_FILE = "code.json"


def source_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The files the digest covers, in path order."""
    files = [p for top in SOURCES for p in (root / top).rglob("*")
             if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def code_digest(root: pathlib.Path = ROOT) -> str:
    """The module docstring's digest of the sources under ``root``."""
    h = hashlib.sha256()
    for p in source_files(root):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_state(root: pathlib.Path = ROOT) -> dict | None:
    """``{"commit": sha, "dirty": bool}`` (dirty: the sources differ from the commit) in a git checkout, else None."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=False, timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *SOURCES],
                                capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def read_code(run_dir: pathlib.Path) -> list[dict]:
    """A run's ``code.json`` entries (oldest first); empty where the run recorded none."""
    path = pathlib.Path(run_dir) / CODE_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def record_code(run_dir: pathlib.Path, from_step: int, root: pathlib.Path = ROOT) -> list[dict]:
    """Append ``{"from_step", "digest", ...git_state}`` to the run's ``code.json`` if the run last ran other code
    (or recorded none); entries after ``from_step`` (an execution whose steps a resume dropped) go first. Returns
    the entries."""
    entries = [e for e in read_code(run_dir) if e["from_step"] <= from_step]
    digest = code_digest(root)
    if not entries or entries[-1]["digest"] != digest:
        entries.append({"from_step": from_step, "digest": digest, **(git_state(root) or {})})
    atomic_write_text(pathlib.Path(run_dir) / CODE_FILE, json.dumps(entries, indent=1) + "\n")
    return entries

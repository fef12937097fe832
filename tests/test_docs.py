"""The repository's documents point at what exists: the raw benchmark files the results cite, and the design
documents the code cites."""
from __future__ import annotations

import fnmatch
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = [ROOT / "benchmarks" / "RESULTS.md", ROOT / "benchmarks" / "learning" / "README.md"]
RAW = ROOT / "benchmarks" / "raw"
PACKAGES = ("minite_util", "minite_kernels", "rollout", "trainers", "triage", "eval", "scoring", "scripts")


def _raw_patterns() -> set[str]:
    text = "".join(p.read_text() for p in RESULTS)
    return set(re.findall(r"raw/([A-Za-z0-9_.*\-]+)", text))


def _matches(name: str, pattern: str) -> bool:
    return fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(name, pattern + "*")


def test_every_cited_raw_file_exists():
    files = [p.name for p in RAW.iterdir() if p.is_file()]
    missing = sorted(p for p in _raw_patterns() if not any(_matches(f, p) for f in files))
    assert not missing, f"cited under benchmarks/raw/ but absent: {missing}"


def test_every_raw_file_is_cited():
    patterns = _raw_patterns()
    uncited = sorted(p.name for p in RAW.iterdir() if p.is_file() and not any(_matches(p.name, q) for q in patterns))
    assert not uncited, f"benchmarks/raw/ files no result cites (cite them or remove them): {uncited}"


def test_design_documents_the_code_cites_exist():
    cited = set()
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            cited |= set(re.findall(r"docs/[A-Za-z0-9_./-]+\.md", f.read_text()))
    assert cited, "no docs/ citation found: the pattern no longer matches how the code cites"
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"cited but absent: {missing}"

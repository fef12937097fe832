"""Offline setup for the official IFEval instruction checkers (Zhou et al. 2023, report ref. [14]).

Which package provides the checkers: the official Google ``instructions*.py`` as packaged on PyPI.
- Python >= 3.11: ``if-verifiable`` (Apache-2.0, 52 KB wheel, light dependencies): the registry
  ``if_verifiable.ifeval.instructions_registry.INSTRUCTION_DICT``.
- Python 3.10 (if-verifiable needs >= 3.11): ``lm-eval[ifeval]`` (MIT), the same Google checkers at
  ``lm_eval.tasks.ifeval.instructions_registry.INSTRUCTION_DICT``. pyproject already installs it there.
Both registries map an instruction id to the same checker class, and only the registry is used: the
evaluation loop (strict/loose, prompt/instruction level) is ours (``eval.tasks.ifeval``), so both backends
score identically and neither package's hub data loader is ever called. if-verifiable's own
``evaluate_instructions`` is not used because it drops every instruction of an empty response from the
instruction-level denominator, which the official metric counts as failed.

Offline NLTK: two checkers (``length_constraints:number_sentences`` and
``change_case:capital_word_frequency``) need NLTK's ``punkt_tab`` English model, which no package registry
ships. When it is not installed we point NLTK at a cache directory holding the four punkt_tab files
*empty*, which NLTK loads as an untrained Punkt model. Effect: no abbreviation list, so "Dr. Smith went
home." counts as two sentences. It touches 77 of the 834 instructions (64 of 541 prompts); on GSM8K and
MATH-500 solution texts sentence counts differed from the trained model on 1.4 % of texts. The run's
protocol records which model was used (``punkt_status()``). Users who have the real data (``nltk.download
("punkt_tab")``, or ``NLTK_DATA``) get it automatically.

langdetect (``language:response_language``, ``change_case:english_*``) is random unless seeded; we set
``DetectorFactory.seed = 0``.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile
from typing import Any

PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")
PUNKT_DEVIATION = (
    "NLTK punkt_tab English model unavailable offline: an untrained Punkt model (empty punkt_tab files) "
    "splits sentences, without an abbreviation list. Affects length_constraints:number_sentences and "
    "change_case:capital_word_frequency (77 of 834 instructions, 64 of 541 prompts)."
)

_STATE: dict[str, Any] = {}


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("MINITE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "minite")
    return pathlib.Path(base) / "nltk_data_untrained_punkt"


def _write_empty_punkt(root: pathlib.Path) -> None:
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in PUNKT_FILES:
        (english / name).touch(exist_ok=True)


def setup_nltk() -> str:
    """Make punkt_tab loadable without a download; returns "trained" or "untrained (empty punkt_tab)"."""
    if "punkt" in _STATE:
        return _STATE["punkt"]
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        status = "trained"
    except LookupError:
        root = _cache_dir()
        try:
            _write_empty_punkt(root)
        except OSError:
            root = pathlib.Path(tempfile.mkdtemp(prefix="minite_nltk_"))
            _write_empty_punkt(root)
        if str(root) not in nltk.data.path:
            nltk.data.path.append(str(root))
        status = "untrained (empty punkt_tab)"
    _STATE["punkt"] = status
    return status


def punkt_status() -> dict[str, str]:
    status = setup_nltk()
    out = {"nltk_punkt": status}
    if status != "trained":
        out["deviation"] = PUNKT_DEVIATION
    return out


def instruction_registry() -> tuple[dict[str, Any], str]:
    """(instruction id -> checker class, backend name). Sets up NLTK and langdetect first."""
    if "registry" in _STATE:
        return _STATE["registry"]
    setup_nltk()
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0
    errors = []
    for module, backend in (("if_verifiable.ifeval.instructions_registry", "if-verifiable"),
                            ("lm_eval.tasks.ifeval.instructions_registry", "lm-eval")):
        try:
            mod = __import__(module, fromlist=["INSTRUCTION_DICT"])
        except ImportError as exc:
            errors.append(f"{backend}: {exc}")
            continue
        _STATE["registry"] = (dict(mod.INSTRUCTION_DICT), backend)
        return _STATE["registry"]
    need = "if-verifiable==0.1.2" if sys.version_info >= (3, 11) else "lm-eval[ifeval]==0.4.13"
    raise ImportError(f"IFEval needs the official checkers: pip install '{need}' ({'; '.join(errors)})")

"""Math answer extraction and scoring shared by the RL rewards and ``python -m eval``.

The report scores checkpoints on AIME24/25, MATH-500, AMC23 and GSM8K (§3.2 Table 3, §6.2.2 Table 6-8)
with a binary correctness reward per response:

    score(response, gold) = 1  if  verify(parse(gold), parse(final_answer(response)))  else 0

where ``parse``/``verify`` are math-verify's (gold first: the gold side decides what "equal" means, e.g.
sets vs. intervals), and ``final_answer`` looks past any ``</think>`` block. Worked example::

    score_math(r"... so the answer is \\boxed{\\frac{2}{4}}", r"\\frac12")  -> 1.0
    score_math(r"... \\boxed{1/3}", r"\\frac12")                             -> 0.0
    score_math(r"\\boxed{25}", "025")                                       -> 1.0   (AIME gold strings)
    score_math(r"\\boxed{27}", "27.0")                                      -> 1.0   (AMC gold floats)
    score_gsm8k("... #### 1,234", "Janet ... #### 1234")                   -> 1.0

Plain-number answers (AIME, AMC, GSM8K) take an exact rational comparison first (``Fraction``), which is
sound (equal rationals are equal) and needs no sympy; anything else goes to math-verify.

Threads: math-verify's timeouts use ``signal.alarm``, which only works in the main thread. ``score_math``
therefore (a) calls math-verify with its own timeouts in the main thread, (b) off the main thread (verl
reward workers, thread pools, Ray actor threads) sends the check to a small pool of worker subprocesses
(``python -m scoring.math --worker``, JSON lines over pipes) that run it in *their* main thread
with the same signal timeouts; the caller waits with a safety deadline, and a worker that exceeds it is
killed and the response scores 0. ``timeout=None`` disables
timeouts and runs inline in any thread (a pathological expression can then take unbounded time).
"""
from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import pathlib
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction

__all__ = ["extract_boxed", "extract_gsm8k", "final_answer_segment", "score_gsm8k", "score_math", "to_number"]

logger = logging.getLogger(__name__)

_BOX_RE = re.compile(r"\\(?:boxed|fbox)")
# "1,234", "1234", "-3.5", ".5"; thousands separators only in groups of three.
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")


def final_answer_segment(text: str) -> str:
    """The part of a response that may hold the answer: everything after the last ``</think>``."""
    idx = text.rfind("</think>")
    return text[idx + len("</think>"):] if idx >= 0 else text


def extract_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` / ``\fbox{...}`` (nested braces kept), or None.

    ``\boxed 5`` (no braces) gives ``"5"``. An unclosed last box (a truncated response) gives None.
    >>> extract_boxed(r"x=\boxed{1} so \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    """
    if not text:
        return None
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    pos = matches[-1].end()
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text):
        return None
    if text[pos] != "{":
        m = re.match(r"[^\s$]+", text[pos:])
        return m.group(0).rstrip(".") if m else None
    depth = 0
    for i in range(pos, len(text)):
        ch = text[i]
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[pos + 1:i].strip()
    return None


def extract_gsm8k(text: str) -> str | None:
    """GSM8K answer: the number after the last ``####`` (None if none follows), else the last number in the text;
    commas stripped.

    >>> extract_gsm8k("so 1,000 + 234 = 1,234\\n#### 1,234")
    '1234'
    >>> extract_gsm8k("The answer is $18.")
    '18'
    """
    if not text:
        return None
    idx = text.rfind("####")
    if idx >= 0:
        tail = text[idx + 4:].strip()
        m = _NUMBER_RE.search(tail)
        if m:
            return m.group(0).replace(",", "")
        return None  # "#### eighteen": no number, no answer
    nums = _NUMBER_RE.findall(text)
    return nums[-1].replace(",", "") if nums else None


_STRIP_RE = re.compile(r"\\[!,;: ]|\\\$|\$|\\text\{\s*\}|\s")


def to_number(s: object) -> Fraction | None:
    r"""Exact value of a plain number (``"025"``, ``27.0``, ``"1,234"``, ``"-3/4"``, ``"\$18"``), else None."""
    if s is None or isinstance(s, bool):
        return None
    if isinstance(s, int):
        return Fraction(s)
    if isinstance(s, float):
        return Fraction(s) if math.isfinite(s) else None
    t = _STRIP_RE.sub("", str(s)).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", t):
        t = t.replace(",", "")
    m = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", t)
    if m:
        t = f"{m.group(1)}/{m.group(2)}"
    if not re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?", t):
        return None
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def _numeric_decision(candidate: str | None, gold: object) -> float | None:
    """1.0/0.0 when both are plain numbers and the decision is certain; None when math-verify must decide."""
    g, c = to_number(gold), to_number(candidate)
    if g is None or c is None:
        return None
    if g == c:
        return 1.0
    if g.denominator == 1 and c.denominator == 1:
        return 0.0
    return None  # e.g. 0.333333 vs 1/3: math-verify's float rounding decides


def _gold_latex(gold: object) -> str:
    value = to_number(gold)
    if value is not None:  # "\\$18.90", "32,\\!348": math-verify cannot parse these dressed numbers
        s = str(value.numerator) if value.denominator == 1 else _STRIP_RE.sub("", str(gold)).replace(",", "")
        return f"${s}$"
    s = str(gold).strip()
    return s if "$" in s or "\\boxed" in s else f"${s}$"


@functools.lru_cache(maxsize=8192)
def _parse_gold(gold_latex: str, timeout: int | None) -> tuple:
    from math_verify import parse

    return tuple(parse(gold_latex, parsing_timeout=timeout))


#: math-verify sees at most the last this-many characters of a response: the final answer is at its end, and
#: math-verify's time and its log lines grow with the text (a 50 MB response printed 50 MB of warnings)
MAX_VERIFY_CHARS = 8192


def _verify(text: str, gold: str, timeout: int | None) -> float:
    """math-verify check (runs in whatever thread calls it; timeouts must be None off the main thread)."""
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise ImportError("math answer scoring needs math-verify: pip install 'math-verify==0.9.0'") from exc
    try:
        gold_parsed = list(_parse_gold(_gold_latex(gold), timeout))
        if not gold_parsed:
            logger.warning("math-verify could not parse the gold answer %r; scoring 0", gold)
            return 0.0
        pred_parsed = parse(text, parsing_timeout=timeout)
        if not pred_parsed:
            return 0.0
        return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=timeout) else 0.0
    except Exception as exc:  # noqa: BLE001  (math-verify/sympy raise anything on pathological input)
        logger.debug("math-verify failed on %r: %s", text[-200:], exc)
        return 0.0


class _VerifyWorkers:
    """Subprocess workers (``python -m scoring.math --worker``) for off-main-thread checks.

    Each worker answers one JSON line per request and runs math-verify in its own main thread with signal
    timeouts. A caller that gets no answer within the safety deadline kills that worker (a fresh one starts
    on demand) and scores 0. Plain subprocesses rather than multiprocessing: spawn re-imports ``__main__``,
    which fails for stdin scripts, notebooks and some launchers.
    """

    def __init__(self, max_workers: int = 2) -> None:
        self._idle: list[subprocess.Popen] = []
        self._all: list[subprocess.Popen] = []
        self._max = max_workers
        self._cond = threading.Condition()

    def _start(self) -> subprocess.Popen:
        root = str(pathlib.Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return subprocess.Popen(
            [sys.executable, "-m", "scoring.math", "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1, env=env, cwd=root,
        )

    def _acquire(self) -> subprocess.Popen:
        with self._cond:
            while True:
                self._all = [p for p in self._all if p.poll() is None]
                self._idle = [p for p in self._idle if p.poll() is None]
                if self._idle:
                    return self._idle.pop()
                if len(self._all) < self._max:
                    proc = self._start()
                    self._all.append(proc)
                    return proc
                self._cond.wait()

    def _release(self, proc: subprocess.Popen, healthy: bool) -> None:
        with self._cond:
            if healthy:
                self._idle.append(proc)
            else:
                proc.kill()
                proc.wait()
                self._all = [p for p in self._all if p is not proc]
            self._cond.notify()

    def run(self, text: str, gold: str, timeout: int) -> float:
        proc = self._acquire()
        first_use = not hasattr(proc, "_minite_used")
        # The first request pays for importing math-verify/sympy in the worker.
        deadline = 3 * timeout + 5 + (60 if first_use else 0)
        healthy = False
        try:
            proc.stdin.write(json.dumps({"text": text, "gold": gold, "timeout": timeout}) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], deadline)
            if not ready:
                logger.warning("math-verify worker gave no answer within %ss; killing it, scoring 0", deadline)
                return 0.0
            line = proc.stdout.readline()
            if not line:
                return 0.0
            proc._minite_used = True  # type: ignore[attr-defined]
            healthy = True
            return float(json.loads(line)["score"])
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("math-verify worker failed (%s); scoring 0", exc)
            return 0.0
        finally:
            self._release(proc, healthy)

    def close(self) -> None:
        with self._cond:
            for proc in self._all:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            self._all, self._idle = [], []


def _serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        score = _verify(req["text"], req["gold"], req["timeout"])
        sys.stdout.write(json.dumps({"score": score}) + "\n")
        sys.stdout.flush()


_WORKERS = _VerifyWorkers()
atexit.register(_WORKERS.close)


def score_math(response: str, gold: object, *, timeout: float | None = 5) -> float:
    r"""1.0 if the response's final answer equals ``gold`` (math-verify, gold first), else 0.0.

    Thread-safe: see the module docstring for how timeouts work off the main thread.
    """
    if not isinstance(response, str) or not response.strip():
        return 0.0
    text = final_answer_segment(response)
    decided = _numeric_decision(extract_boxed(text), gold)
    if decided is not None:
        return decided
    text = text[-MAX_VERIFY_CHARS:]
    if timeout is None:
        return _verify(text, str(gold), None)
    seconds = max(1, math.ceil(timeout))
    if threading.current_thread() is threading.main_thread():
        return _verify(text, str(gold), seconds)
    return _WORKERS.run(text, str(gold), seconds)


def score_gsm8k(response: str, gold: object) -> float:
    """GSM8K: gold is the dataset's ``answer`` text (``... #### 72``) or the bare number.

    The prediction is the last ``\\boxed{}`` if any, else the ``####`` / last-number rule; plain numbers
    compare exactly, anything else (``\\frac{3}{2}``, ``18\\text{ dollars}``) falls back to ``score_math``.
    """
    if not isinstance(response, str) or not response.strip():
        return 0.0
    gold_s = str(gold)
    if "####" in gold_s:
        gold_s = extract_gsm8k(gold_s) or ""
    text = final_answer_segment(response)
    boxed = extract_boxed(text)
    candidate = boxed if boxed is not None else extract_gsm8k(text)
    if candidate is None:
        return 0.0
    decided = _numeric_decision(candidate, gold_s)
    if decided is not None:
        return decided
    return score_math(f"\\boxed{{{candidate}}}", gold_s)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _serve()

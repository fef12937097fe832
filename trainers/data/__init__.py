"""Training prompts: a seeded graded arithmetic set, GSM8K train (carried in this package), or any jsonl file.

Every example carries its question, gold answer and ``data_source`` (the key the reward dispatches on, as in
verl). Prompt order is a pure function of (seed, step), so a resumed run draws exactly the same prompts.
"""
from __future__ import annotations

import json
import pathlib
import random
from dataclasses import dataclass, field
from typing import Any

from minite_util.fileio import iter_json_objects
from trainers.config import DataConfig
from trainers.data.split import is_heldout

GSM8K_TRAIN = pathlib.Path(__file__).resolve().parent / "gsm8k" / "train.jsonl"


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Example:
    index: int
    question: str
    answer: str  # gold answer as the scorer expects it
    data_source: str
    extra: dict = field(default_factory=dict)


def gsm8k_gold(answer: str) -> str:
    """Text after '#### ', commas stripped: 'Natalia ... #### 1,072' -> '1072'."""
    if "####" not in answer:
        raise ValueError("no '####' in the answer")
    return answer.split("####")[-1].strip().replace(",", "")


_ARITH = {
    1: lambda r: (r.randint(1, 9), "+", r.randint(1, 9)),
    2: lambda r: (r.randint(10, 49), "+", r.randint(1, 9)),
    3: lambda r: (r.randint(10, 99), "+", r.randint(10, 99)),
    4: lambda r: (r.randint(2, 9), "*", r.randint(2, 9)),
}


def arithmetic_examples(size: int, levels: tuple[int, ...], seed: int, exclude_heldout: bool = False) -> list[Example]:
    """Seeded graded arithmetic: level 1 '3 + 5', 2 '27 + 4', 3 '58 + 36', 4 '7 * 8'; levels cycle.

    ``exclude_heldout``: redraw every problem of the held-out part (``trainers.data.split``), so that no example
    is a problem of the ``arithmetic_heldout`` eval set; off, the draws are those of earlier versions."""
    rng = random.Random(seed)
    out = []
    for i in range(size):
        level = levels[i % len(levels)]
        a, op, b = _ARITH[level](rng)
        while exclude_heldout and is_heldout(level, a, op, b):
            a, op, b = _ARITH[level](rng)
        value = a + b if op == "+" else a * b
        out.append(Example(i, f"What is {a} {op} {b}?", str(value), "arithmetic", {"level": level}))
    return out


def read_jsonl(path: str | pathlib.Path, prompt_key: str, answer_key: str, *, gsm8k: bool = False,
               data_source: str = "jsonl", limit: int | None = None) -> list[Example]:
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"dataset file {str(p)!r} does not exist (data.path)")
    out: list[Example] = []
    for lineno, row in iter_json_objects(p, DatasetError):
        where = f"{p}:{lineno}"
        missing = [k for k in (prompt_key, answer_key) if k not in row]
        if missing:
            raise DatasetError(f"{where}: missing field(s) {missing}; the row has {sorted(row)} "
                               f"(set data.prompt_key / data.answer_key)")
        q, a = row[prompt_key], row[answer_key]
        if not isinstance(q, str) or not q.strip():
            raise DatasetError(f"{where}: field {prompt_key!r} must be a non-empty string")
        if isinstance(a, bool) or not isinstance(a, (str, int, float)) or not str(a).strip():
            raise DatasetError(f"{where}: field {answer_key!r} must be a non-empty string or a number, got "
                               f"{json.dumps(a)[:80]}")
        if gsm8k:
            try:
                a = gsm8k_gold(str(a))
            except ValueError as e:
                raise DatasetError(f"{where}: field {answer_key!r}: {e}") from e
        out.append(Example(len(out), q, str(a), data_source, {"line": lineno}))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DatasetError(f"dataset file {p} has no rows")
    return out


def load_examples(cfg: DataConfig) -> list[Example]:
    if cfg.task == "arithmetic":
        ex = arithmetic_examples(cfg.arithmetic.size, cfg.arithmetic.levels, cfg.arithmetic.seed,
                                 cfg.arithmetic.exclude_heldout)
        return ex[:cfg.limit] if cfg.limit else ex
    if cfg.task == "gsm8k":
        return read_jsonl(cfg.path or GSM8K_TRAIN, cfg.prompt_key, cfg.answer_key, gsm8k=True,
                          data_source="openai/gsm8k", limit=cfg.limit)
    if not cfg.path:
        raise DatasetError("data.task=jsonl needs data.path=<file.jsonl>")
    return read_jsonl(cfg.path, cfg.prompt_key, cfg.answer_key, data_source="math", limit=cfg.limit)


def render_prompt(tokenizer: Any, ex: Example, cfg: DataConfig) -> list[int]:
    """Chat-template the question (plus `data.instruction`) and tokenize it."""
    content = ex.question + (("\n" + cfg.instruction) if cfg.instruction else "")
    messages = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []) + [
        {"role": "user", "content": content}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(content)["input_ids"]
    if len(ids) > cfg.max_prompt_tokens:
        ids = ids[-cfg.max_prompt_tokens:]
    return list(ids)


class PromptSchedule:
    """Epoch-wise seeded permutation; `batch(step)` depends only on (seed, step)."""

    def __init__(self, examples: list[Example], prompts_per_step: int, seed: int, shuffle: bool = True) -> None:
        if not examples:
            raise DatasetError("the training set is empty")
        self.examples, self.k, self.seed, self.shuffle = examples, prompts_per_step, seed, shuffle
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            idx = list(range(len(self.examples)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
            self._perms = {epoch: idx}
        return self._perms[epoch]

    def batch(self, step: int) -> list[Example]:
        n = len(self.examples)
        out = []
        for j in range(step * self.k, (step + 1) * self.k):
            out.append(self.examples[self._perm(j // n)[j % n]])
        return out


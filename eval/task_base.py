"""Task interface, the math task base, and :func:`register` (what every file of ``eval/tasks/`` imports; the
lookup by name, which imports those files, is ``eval.task``).

A task turns rows of its data file into :class:`Example` s (prompt text and gold answer), and a response
into a :class:`SampleScore`. One *run* of a task scores one response per example; ``avg@k`` is the mean of
the task's primary metric over ``k`` independent runs (report §6.2.2: AIME k=6; MATH-500, GSM8K and
IFEval k=4), and the reported spread is the sample standard deviation of the ``k`` run scores.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

from scoring.math import extract_boxed, final_answer_segment, score_math, to_number

MATH_PROMPT_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Example:
    index: int  # 0-based row of the task's data file
    prompt: str  # the user message sent to the model
    gold: Any
    question: str  # the bare question as stored in the data (matched by `eval score` rows with "prompt")
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SampleScore:
    correct: float  # the task's primary per-response score (math: 0/1; IFEval: prompt-level strict)
    extracted: str | None  # extracted answer (math) or None
    details: dict = field(default_factory=dict)


class Task(abc.ABC):
    """Base class; subclasses set the class attributes and implement ``to_example`` and ``score``."""

    name: ClassVar[str]
    title: ClassVar[str]
    default_samples: ClassVar[int]
    samples_source: ClassVar[str]  # where the default k comes from (the report, or our choice)
    hf_path: ClassVar[str]  # default Hugging Face dataset for online users
    hf_config: ClassVar[str | None] = None
    #: folder of the bundled rows (default: ``name``); set by tasks sharing rows
    data_name: ClassVar[str | None] = None
    hf_split: ClassVar[str] = "test"
    primary_metric: ClassVar[str] = "accuracy"
    metric_names: ClassVar[tuple[str, ...]] = ("accuracy",)

    @abc.abstractmethod
    def to_example(self, index: int, row: dict) -> Example:
        """One data row -> Example (prompt for the model, gold answer)."""

    @abc.abstractmethod
    def score(self, response: str, example: Example) -> SampleScore:
        """Score one response."""

    def aggregate(self, scores: list[SampleScore]) -> dict[str, float]:
        """Metrics of one run (one response per example)."""
        return {"accuracy": sum(s.correct for s in scores) / len(scores) if scores else 0.0}

    def examples(self, rows: list[dict]) -> list[Example]:
        out = []
        for i, row in enumerate(rows):
            try:
                out.append(self.to_example(i, row))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"{self.name}: row {i} of the data is malformed ({exc!r}); "
                    f"fields present: {sorted(row) if isinstance(row, dict) else type(row)}"
                ) from exc
        return out


def first_field(row: dict, names: tuple[str, ...]) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    raise KeyError(f"none of the fields {list(names)}")


class MathTask(Task):
    """Math word problems with one gold answer, scored by math-verify (gold first) on the final answer."""

    question_fields: ClassVar[tuple[str, ...]] = ("problem", "question", "prompt")
    answer_fields: ClassVar[tuple[str, ...]] = ("answer",)
    integer_answers: ClassVar[bool] = False

    def to_example(self, index: int, row: dict) -> Example:
        question = str(first_field(row, self.question_fields))
        bare = question.removesuffix(MATH_PROMPT_SUFFIX)
        gold = self.normalize_gold(first_field(row, self.answer_fields))
        return Example(index=index, prompt=bare + MATH_PROMPT_SUFFIX, gold=gold, question=question)

    def normalize_gold(self, gold: Any) -> str:
        if self.integer_answers:
            value = to_number(gold)
            if value is None or value.denominator != 1:
                raise ValueError(f"expected an integer answer, got {gold!r}")
            return str(value.numerator)  # "025" -> "25", 27.0 -> "27"
        return str(gold).strip()

    def extract(self, response: str) -> str | None:
        extracted = extract_boxed(final_answer_segment(response or ""))
        if extracted is not None and self.integer_answers:
            value = to_number(extracted)
            if value is not None and value.denominator == 1:
                return str(value.numerator)
        return extracted

    def score(self, response: str, example: Example) -> SampleScore:
        return SampleScore(correct=score_math(response, example.gold), extracted=self.extract(response))


#: task name -> class, filled by :func:`register` (``eval.task`` looks names up in it)
REGISTRY: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: add a task to :data:`REGISTRY` under its ``name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"task {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls

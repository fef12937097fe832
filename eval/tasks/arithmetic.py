"""Held-out graded arithmetic: the training task's levels, drawn with a seed the trainer never uses.

Rows are ``{"question": "What is 58 + 36?", "answer": "94", "level": 3}`` (see ``eval/data/arithmetic``:
400 rows, 100 per level, seeds 4322-4325; training draws use ``data.arithmetic.seed``, 1234 by default). The
prompt is the trainer's: the question, a newline, ``Give the result as a number.`` (``arithmetic_cot``: ``Think
step by step, then give the result as a number.``, the learning study's instruction); the score is the trainer's
reward (the last number of the response equals the gold). Besides ``accuracy`` it reports
``accuracy_L1`` ... ``accuracy_L4`` per level.

Levels 1, 2 and 4 have only 81, 360 and 64 distinct problems, so their held-out rows repeat training
problems; level 3 has 8,100 and mostly does not (the data SOURCE.md counts the overlap).
"""
from __future__ import annotations

from eval.task import Example, SampleScore, Task, first_field, register
from trainers.rewards.math import extract_gsm8k, final_answer_segment, score_gsm8k

INSTRUCTION = "Give the result as a number."
#: the study's instruction (recipes/studies/arithmetic.yaml): responses long enough for several gate segments
COT_INSTRUCTION = "Think step by step, then give the result as a number."
LEVELS = (1, 2, 3, 4)


@register
class Arithmetic(Task):
    name = "arithmetic"
    title = "Arithmetic (held-out)"
    default_samples = 1
    samples_source = "this library: one greedy-or-sampled pass over 400 rows"
    hf_path = "minite/arithmetic-heldout"  # generated locally; there is no hub copy
    metric_names = ("accuracy",) + tuple(f"accuracy_L{k}" for k in LEVELS)
    instruction = INSTRUCTION

    def to_example(self, index: int, row: dict) -> Example:
        question = str(first_field(row, ("question",)))
        gold = str(first_field(row, ("answer",))).strip()
        level = int(row.get("level", 0))
        return Example(index=index, prompt=f"{question}\n{self.instruction}", gold=gold, question=question,
                       meta={"level": level})

    def extract(self, response: str) -> str | None:
        return extract_gsm8k(final_answer_segment(response or ""))

    def score(self, response: str, example: Example) -> SampleScore:
        return SampleScore(correct=float(score_gsm8k(response, example.gold)), extracted=self.extract(response),
                           details={"level": example.meta.get("level", 0)})

    def aggregate(self, scores: list[SampleScore]) -> dict[str, float]:
        out = {"accuracy": sum(s.correct for s in scores) / len(scores) if scores else 0.0}
        for k in LEVELS:
            at = [s.correct for s in scores if s.details.get("level") == k]
            out[f"accuracy_L{k}"] = sum(at) / len(at) if at else 0.0
        return out


@register
class ArithmeticCoT(Arithmetic):
    """The same rows and score; the prompt asks for reasoning first (``COT_INSTRUCTION``)."""

    name = "arithmetic_cot"
    data_name = "arithmetic"
    title = "Arithmetic, step by step (held-out)"
    instruction = COT_INSTRUCTION

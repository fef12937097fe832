"""GSM8K test (1,319 problems; report §6.2.2, ref. [11]).

The gold answer is the number after ``####`` in the dataset's ``answer`` text, commas stripped. The model
is asked for a ``\\boxed{}`` answer like every math task; a response without one falls back to GSM8K's
``####`` convention and then to the last number in the response. Default avg@4 (report).
"""
from __future__ import annotations

from eval.task_base import MATH_PROMPT_SUFFIX, Example, MathTask, SampleScore, first_field, register
from scoring.math import extract_boxed, extract_gsm8k, final_answer_segment, score_gsm8k


@register
class GSM8K(MathTask):
    name = "gsm8k"
    title = "GSM8K"
    default_samples = 4
    samples_source = "report §6.2.2 (GSM8K averages four evaluations)"
    hf_path = "openai/gsm8k"
    hf_config = "main"

    def to_example(self, index: int, row: dict) -> Example:
        question = str(first_field(row, ("question", "problem")))
        answer = str(first_field(row, ("answer",)))
        gold = extract_gsm8k(answer) if "####" in answer else answer.strip().replace(",", "")
        if not gold:
            raise ValueError(f"no gold answer in {answer!r}")
        return Example(index=index, prompt=question + MATH_PROMPT_SUFFIX, gold=gold, question=question)

    def extract(self, response: str) -> str | None:
        text = final_answer_segment(response or "")
        boxed = extract_boxed(text)
        return boxed if boxed is not None else extract_gsm8k(text)

    def score(self, response: str, example: Example) -> SampleScore:
        return SampleScore(correct=score_gsm8k(response, example.gold), extracted=self.extract(response))

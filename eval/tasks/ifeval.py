"""IFEval (541 prompts, 834 verifiable instructions; Zhou et al. 2023, report §6.2.2 ref. [14]).

Metrics of one run (report §6.2.2 uses prompt-level strict):

    prompt_level_strict      = mean over prompts of  all_i strict_i
    instruction_level_strict = sum over prompts of sum_i strict_i  /  total number of instructions
    strict_i = checker_i(response);   loose_i = any(checker_i(v) for v in variants(response))

where the 8 loose variants are the response with/without its first line, last line or both, each with and
without ``*`` removed (the official protocol). Example: "Hello\\nHELLO WORLD" under
``change_case:english_capital`` fails strict and passes loose (dropping the first line).
Reasoning models: the checked text is what follows the last ``</think>``; an unclosed ``<think>`` checks "".
Checkers come from the official package (see ``eval.ifeval_checkers``). Default avg@4 (report).

Determinism: the official checkers draw a random value for an invalid argument; in the data this happens
for ``keywords:letter_frequency`` with ``letter="#"`` (key 1122), which then checks a random letter, so the
official script can score the same response differently from run to run. We build every checker under a
``random`` seed derived from its id and arguments (restoring the caller's random state afterwards), so
that instruction checks one fixed letter in every run.
"""
from __future__ import annotations

import random

from eval.ifeval_checkers import instruction_registry
from eval.task_base import Example, SampleScore, Task, register


def loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    bases = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return bases + [b.replace("*", "") for b in bases]


def visible_response(response: str) -> str:
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if response.lstrip().startswith("<think>"):
        return ""
    return response


def check_instructions(response: str, instruction_ids: list[str], kwargs_list: list[dict], prompt: str
                       ) -> tuple[list[bool], list[bool]]:
    """(strict, loose) pass flags, one per instruction."""
    registry, _ = instruction_registry()
    text = visible_response(response or "")
    variants = loose_variants(text)
    strict, loose = [], []
    for iid, kwargs in zip(instruction_ids, kwargs_list):
        if iid not in registry:
            raise ValueError(f"unknown IFEval instruction id {iid!r}")
        checker = registry[iid](iid)
        state = random.getstate()
        try:
            random.seed(f"{iid}|{sorted((kwargs or {}).items())}")  # see "Determinism" in the module docstring
            checker.build_description(**{k: v for k, v in (kwargs or {}).items() if v is not None})
            args = checker.get_instruction_args()
            if args and "prompt" in args:
                checker.build_description(prompt=prompt)
        finally:
            random.setstate(state)
        strict.append(bool(text.strip() and checker.check_following(text)))
        loose.append(any(v.strip() and checker.check_following(v) for v in variants))
    return strict, loose


@register
class IFEval(Task):
    name = "ifeval"
    title = "IFEval"
    default_samples = 4
    samples_source = "report §6.2.2 (IFEval averages four evaluations; prompt-level strict)"
    hf_path = "google/IFEval"
    hf_split = "train"
    primary_metric = "prompt_level_strict"
    metric_names = ("prompt_level_strict", "prompt_level_loose", "instruction_level_strict",
                    "instruction_level_loose")

    def to_example(self, index: int, row: dict) -> Example:
        ids = list(row["instruction_id_list"])
        kwargs = [dict(k or {}) for k in row["kwargs"]]
        if len(ids) != len(kwargs) or not ids:
            raise ValueError(f"{len(ids)} instruction ids but {len(kwargs)} kwargs")
        gold = {"instruction_id_list": ids, "kwargs": kwargs}
        return Example(index=index, prompt=row["prompt"], gold=gold, question=row["prompt"],
                       meta={"key": row.get("key")})

    def score(self, response: str, example: Example) -> SampleScore:
        strict, loose = check_instructions(response, example.gold["instruction_id_list"],
                                           example.gold["kwargs"], example.question)
        return SampleScore(correct=float(all(strict)), extracted=None,
                           details={"strict": strict, "loose": loose, "prompt_level_loose": float(all(loose))})

    def aggregate(self, scores: list[SampleScore]) -> dict[str, float]:
        if not scores:
            return dict.fromkeys(self.metric_names, 0.0)
        n_instr = sum(len(s.details["strict"]) for s in scores)
        return {
            "prompt_level_strict": sum(s.correct for s in scores) / len(scores),
            "prompt_level_loose": sum(s.details["prompt_level_loose"] for s in scores) / len(scores),
            "instruction_level_strict": sum(sum(s.details["strict"]) for s in scores) / n_instr,
            "instruction_level_loose": sum(sum(s.details["loose"]) for s in scores) / n_instr,
        }

"""``eval score``: score responses generated elsewhere (vLLM, SGLang, an API) against a task's data.

Input: jsonl rows with ``index`` (0-based row of the task's data file) or ``prompt`` (the exact question
text of the data file, or the exact templated prompt ``eval run`` sends), plus ``response`` (string) or
``responses`` (list of strings), and optionally ``sample`` (as ``eval run``'s samples.jsonl). Every response is
scored; math ``accuracy`` is the mean over all of them (avg@k); IFEval's metrics are computed over all (prompt,
response) pairs. Every prompt must have the same number of responses, and a (prompt, sample) pair may appear
once, so that no prompt weighs more than another.
"""
from __future__ import annotations

import os

from eval.data import iter_jsonl, load_rows
from eval.task import Example, SampleScore, Task


def _row_error(path: str, lineno: int, msg: str) -> ValueError:
    return ValueError(f"{path}:{lineno}: {msg}")


def read_predictions(path: str | os.PathLike, examples: list[Example]) -> list[tuple[Example, list[str]]]:
    by_text: dict[str, Example] = {}
    for ex in examples:
        by_text.setdefault(ex.question, ex)
        by_text.setdefault(ex.prompt, ex)
    out = []
    seen: dict[tuple, int] = {}
    path = str(path)
    for lineno, row in iter_jsonl(path):
        if "index" in row:
            idx = row["index"]
            if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(examples):
                raise _row_error(path, lineno, f"'index' must be an integer in [0, {len(examples)}), "
                                               f"got {idx!r}")
            ex = examples[idx]
        elif "prompt" in row:
            if not isinstance(row["prompt"], str) or row["prompt"] not in by_text:
                raise _row_error(path, lineno, "'prompt' does not match any prompt of the task's data "
                                               "exactly (use 'index' for the 0-based row instead)")
            ex = by_text[row["prompt"]]
        else:
            raise _row_error(path, lineno, "row needs 'index' (0-based data row) or 'prompt' (exact text); "
                                           f"keys present: {sorted(row)}")
        if "responses" in row:
            responses = row["responses"]
            if not isinstance(responses, list) or not responses or not all(isinstance(r, str) for r in responses):
                raise _row_error(path, lineno, "'responses' must be a non-empty list of strings")
        elif "response" in row:
            if not isinstance(row["response"], str):
                raise _row_error(path, lineno, f"'response' must be a string, got {type(row['response']).__name__}")
            responses = [row["response"]]
        else:
            raise _row_error(path, lineno, "row needs 'response' (string) or 'responses' (list of strings); "
                                           f"keys present: {sorted(row)}")
        if "sample" in row:
            key = (ex.index, row["sample"])
            if key in seen:
                raise _row_error(path, lineno, f"prompt {ex.index} sample {row['sample']!r} is already on line "
                                               f"{seen[key]}: a duplicated row would count twice")
            seen[key] = lineno
        out.append((ex, responses))
    if not out:
        raise ValueError(f"{path}: no prediction rows")
    counts: dict[int, int] = {}
    for ex, responses in out:
        counts[ex.index] = counts.get(ex.index, 0) + len(responses)
    if len(set(counts.values())) > 1:
        (lo_i, lo), (hi_i, hi) = min(counts.items(), key=lambda kv: kv[1]), max(counts.items(), key=lambda kv: kv[1])
        raise ValueError(f"{path}: prompts have unequal numbers of responses (prompt {lo_i}: {lo}, prompt {hi_i}: "
                         f"{hi}); avg@k needs the same k for every prompt, so a repeated row would weigh its "
                         "prompt more. Remove duplicates or give every prompt k responses")
    return out


def score_predictions(task: Task, path: str | os.PathLike, *, data_dir: str | None = None,
                      dataset: str | None = None) -> dict:
    examples = task.examples(load_rows(task, data_dir=data_dir, dataset=dataset))
    preds = read_predictions(path, examples)
    scores: list[SampleScore] = [task.score(r, ex) for ex, responses in preds for r in responses]
    return {"task": task.name, **task.aggregate(scores), "n": len(scores),
            "n_prompts": len({ex.index for ex, _ in preds})}

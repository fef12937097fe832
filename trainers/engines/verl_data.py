"""Write the training prompts as verl parquet files (``data.train_files``/``val_files`` of engine=verl).

One row per example, in the format ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads (the same as verl's
``examples/data_preprocess/gsm8k.py``)::

    {"data_source": "openai/gsm8k" | "arithmetic" | "math",          # verl's data.reward_fn_key
     "prompt": [{"role": "system", ...}?, {"role": "user", "content": question + instruction}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "question": "..."}}

The chat messages are built exactly as the local engine builds them (``trainers.data.render_prompt``:
optional ``data.system_prompt``, ``data.instruction`` appended on a new line); verl applies the tokenizer's
chat template itself.

The training rows are engine=local's prompts in engine=local's order: step s's ``prompts_per_step`` rows are
``trainers.data.PromptSchedule(examples, prompts_per_step, seed, data.shuffle).batch(s)``, for every step of
the run, and verl reads them without shuffling (``data.shuffle=false``). So both engines train on the same
prompts at every step, and a run resumed with more steps finds its first steps' rows unchanged (a step's rows
depend only on the seed and the step). Example: 3 examples, 2 prompts a step, 2 steps, no shuffle: rows
``e0 e1 | e2 e0``. (verl drops a prompt over ``data.max_prompt_length`` tokens where engine=local keeps its last
tokens; with such prompts the steps after it shift.)

Files are written atomically (temp file, then ``os.replace``).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Any

from minite_util.fileio import atomic_path
from trainers.config import DataConfig
from trainers.data import Example, PromptSchedule, load_examples

ABILITY = "math"


def messages_for(ex: Example, cfg: DataConfig) -> list[dict[str, str]]:
    """The chat messages of one example (same content as ``trainers.data.render_prompt``)."""
    content = ex.question + (("\n" + cfg.instruction) if cfg.instruction else "")
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return system + [{"role": "user", "content": content}]


def example_to_row(ex: Example, cfg: DataConfig, split: str) -> dict[str, Any]:
    extra = {"split": split, "index": int(ex.index), "question": ex.question}
    extra.update({k: v for k, v in ex.extra.items() if k not in extra})
    return {
        "data_source": ex.data_source,
        "prompt": messages_for(ex, cfg),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(ex.answer)},
        "extra_info": extra,
    }


def write_parquet(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> pathlib.Path:
    """Write rows to ``path`` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    with atomic_path(path, mode=0o644) as tmp:
        pq.write_table(pa.Table.from_pylist(list(rows)), str(tmp))
    return path


def split_examples(examples: list[Example], val_size: int) -> tuple[list[Example], list[Example]]:
    """Hold out the last ``val_size`` examples for validation (at least one example stays in train)."""
    k = max(0, min(val_size, len(examples) - 1))
    return (examples[:-k], examples[-k:]) if k else (examples, examples[:1])


def default_val_size(n: int) -> int:
    return max(1, min(64, n // 10))


def scheduled_examples(examples: list[Example], steps: int, prompts_per_step: int, seed: int,
                       shuffle: bool) -> list[Example]:
    """Every step's prompts in engine=local's order (``PromptSchedule``), concatenated."""
    schedule = PromptSchedule(examples, prompts_per_step, seed, shuffle)
    return [ex for s in range(steps) for ex in schedule.batch(s)]


def write_verl_data(
    cfg: DataConfig, out_dir: str | os.PathLike, *, steps: int, prompts_per_step: int, seed: int,
    val_size: int | None = None,
) -> tuple[pathlib.Path, pathlib.Path]:
    """Load the configured training set and write under ``out_dir`` ``train.parquet`` (``steps`` x
    ``prompts_per_step`` rows, engine=local's schedule for ``seed``) and ``val.parquet`` (the last ``val_size``
    examples, for verl's optional validation)."""
    examples = load_examples(cfg)
    _, val = split_examples(examples, default_val_size(len(examples)) if val_size is None else val_size)
    train = scheduled_examples(examples, steps, prompts_per_step, seed, cfg.shuffle)
    out = pathlib.Path(out_dir)
    return (
        write_parquet([example_to_row(e, cfg, "train") for e in train], out / "train.parquet"),
        write_parquet([example_to_row(e, cfg, "val") for e in val], out / "val.parquet"),
    )

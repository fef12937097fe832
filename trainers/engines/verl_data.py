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
chat template itself. The prompt order differs from engine=local: verl's dataloader shuffles with
``data.seed`` instead of ``trainers.data.PromptSchedule``.

Files are written atomically (temp file, then ``os.replace``).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Any

from minite_util.fileio import atomic_path
from trainers.config import DataConfig
from trainers.data import Example, load_examples

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


def write_verl_data(
    cfg: DataConfig, out_dir: str | os.PathLike, *, val_size: int | None = None
) -> tuple[pathlib.Path, pathlib.Path]:
    """Load the configured training set and write ``train.parquet`` / ``val.parquet`` under ``out_dir``."""
    examples = load_examples(cfg)
    train, val = split_examples(examples, default_val_size(len(examples)) if val_size is None else val_size)
    out = pathlib.Path(out_dir)
    return (
        write_parquet([example_to_row(e, cfg, "train") for e in train], out / "train.parquet"),
        write_parquet([example_to_row(e, cfg, "val") for e in val], out / "val.parquet"),
    )

"""Where a task's rows come from: the bundled copy (offline default), a data directory, a jsonl file, or a
Hugging Face dataset id (online users only; never used unless asked for)."""
from __future__ import annotations

import os
import pathlib

from eval.task import Task
from minite_util.fileio import iter_json_objects

BUNDLED_DIR = pathlib.Path(__file__).resolve().parent / "data"


def bundled_path(task: Task) -> pathlib.Path:
    return BUNDLED_DIR / (task.data_name or task.name) / "test.jsonl"


def iter_jsonl(path: str | os.PathLike):
    """Yield ``(line_number, row)`` for every non-blank line; a bad file or line raises ValueError naming
    ``path:line`` (``minite_util.fileio.iter_json_objects``)."""
    yield from iter_json_objects(path, ValueError)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    return [row for _, row in iter_jsonl(path)]


def _from_hub(task: Task, spec: str) -> list[dict]:
    """``hf:PATH[:SPLIT]`` or ``PATH[:SPLIT]`` with the config taken from the task (GSM8K: ``main``)."""
    spec = spec.removeprefix("hf:")
    path, _, split = spec.partition(":")
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise ImportError("loading a Hugging Face dataset id needs `pip install datasets`") from exc
    config = task.hf_config if path == task.hf_path else None
    ds = datasets.load_dataset(path, config, split=split or task.hf_split)
    return [dict(r) for r in ds]


def resolve_source(task: Task, data_dir: str | None = None, dataset: str | None = None) -> str:
    """A human-readable description of where the rows come from (recorded in the run protocol)."""
    if dataset:
        return dataset
    if data_dir:
        return str(_dir_file(task, data_dir))
    return f"bundled:{bundled_path(task).relative_to(BUNDLED_DIR.parent)}"


def _dir_file(task: Task, data_dir: str) -> pathlib.Path:
    base = pathlib.Path(data_dir)
    name = task.data_name or task.name
    candidates = [base / name / "test.jsonl", base / f"{name}.jsonl"]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(f"no data file for task {task.name!r} under {data_dir}: looked for "
                            f"{', '.join(str(c) for c in candidates)}")


def load_rows(task: Task, data_dir: str | None = None, dataset: str | None = None) -> list[dict]:
    """Rows of the task's test set. ``dataset`` (a jsonl path or a hub id) wins over ``data_dir``."""
    if dataset:
        if os.path.exists(dataset):
            rows = read_jsonl(dataset)
        elif dataset.startswith("hf:") or ("/" in dataset and not dataset.endswith((".jsonl", ".json"))):
            rows = _from_hub(task, dataset)
        else:
            raise FileNotFoundError(f"dataset for task {task.name!r} not found: {dataset!r} is neither a "
                                    "file nor a Hugging Face id (write hf:ORG/NAME[:SPLIT])")
    elif data_dir:
        rows = read_jsonl(_dir_file(task, data_dir))
    else:
        path = bundled_path(task)
        if not path.is_file():
            raise FileNotFoundError(f"bundled data for task {task.name!r} is missing at {path}; reinstall the "
                                    "package or pass --data-dir")
        rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"the data for task {task.name!r} has no rows")
    return rows

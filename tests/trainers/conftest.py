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


"""Models for the trainer, eval and the benchmarks.

`load_model_and_tokenizer(path)` (the embedded SmolLM2-135M-Instruct, a local HF dir or a hub id) is
``minite_kernels.hf_models``' loader, re-exported here (``python -m minite_kernels align`` uses it too, and
minite_kernels imports nothing from this package).

`tiny_random_qwen3(tokenizer_dir)` builds a tiny random Qwen3 with the real Qwen3 tokenizer, for tests.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from minite_kernels import (
    SMOLLM2_ALIASES,
    ModelLoadError,
    cache_root,
    load_model_and_tokenizer,
    resolve_dtype,
    smollm2_cache_dir,
)

__all__ = [
    "QWEN3_0_6B_SHAPES",
    "QWEN3_SHAPES",
    "SMOLLM2_ALIASES",
    "ModelLoadError",
    "cache_root",
    "load_model_and_tokenizer",
    "qwen3_projections",
    "resolve_dtype",
    "smollm2_cache_dir",
    "stop_token_ids",
    "tiny_random_qwen3",
]

#: Qwen3-0.6B's shapes (28 layers, hidden 1024, MLP 3072, 16 query / 8 KV heads of 128, tied embeddings, the
#: config's padded vocabulary of 151,936 rows): the benchmarks' random stand-in, as
#: ``tiny_random_qwen3(tok_dir, **QWEN3_0_6B_SHAPES)``
QWEN3_0_6B_SHAPES = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True)

#: the Qwen3 shapes the benchmarks run (``--shape``), from the models' configs: layers, hidden, MLP, query / KV
#: heads of 128, the padded vocabulary; 0.6B-4B tie their embeddings, 8B does not
QWEN3_SHAPES = {
    "0.6b": QWEN3_0_6B_SHAPES,
    "1.7b": dict(QWEN3_0_6B_SHAPES, hidden_size=2048, intermediate_size=6144),
    "4b": dict(QWEN3_0_6B_SHAPES, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
               num_attention_heads=32),
    "8b": dict(QWEN3_0_6B_SHAPES, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, tie_word_embeddings=False),
}


def qwen3_projections(shape: str) -> tuple[tuple[str, int, int], ...]:
    """``(name, N, K)`` of one decoder layer's projections as the sampler packs them (q/k/v and gate/up
    concatenated along N) for a :data:`QWEN3_SHAPES` entry."""
    c = QWEN3_SHAPES[shape]
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    return (("qkv", q + 2 * kv, h), ("o", h, q), ("gate_up", 2 * i, h), ("down", h, i))


def tiny_random_qwen3(tokenizer_dir: str | os.PathLike, *, seed: int = 0, dtype: str | torch.dtype = "float32",
                      device: str | torch.device = "cpu", **config_overrides: Any):
    """A ~10M-parameter random Qwen3 (vocab of the real Qwen3 tokenizer) for CPU tests; with
    ``QWEN3_SHAPES[...]`` overrides, a random stand-in of that size (``device``: where its weights are made,
    which for a multi-billion-parameter model is much faster on a GPU than on the CPU)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg: dict[str, Any] = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                               max_position_embeddings=2048, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id, bos_token_id=None)
    cfg.update(config_overrides)
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.device(dev):
        torch.manual_seed(seed)
        if dev.type != "cpu":  # made in the target dtype: an 8B model in fp32 would not need to exist
            torch.set_default_dtype(resolve_dtype(dtype))
        try:
            model = Qwen3ForCausalLM(Qwen3Config(**cfg))
        finally:
            torch.set_default_dtype(torch.float32)
    model.to(resolve_dtype(dtype)).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def stop_token_ids(model, tokenizer) -> tuple[int, ...]:
    """EOS ids from the tokenizer and the generation config (which may list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return tuple(sorted(ids))

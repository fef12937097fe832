"""Which sampler runs: the CUDA-graph engine on CUDA, the reference loop on CPU.

``engine``: ``auto`` (the graph engine on a CUDA device when the model is one it reproduces, else the loop),
``graph`` (the engine, eager off CUDA; an unsupported model is an error) or ``loop`` (the reference loop).
"""
from __future__ import annotations

import warnings

from rollout.decoder import UnsupportedModel
from rollout.graph_sampler import GraphSampler
from rollout.local import LocalSampler

ENGINES = ("auto", "graph", "loop")
FP4_WEIGHTS = {"auto": "auto", "on": True, "off": False}
#: ``norm_quant`` values (the trainer's ``rollout.norm_quant``) to the graph engine's argument
NORM_QUANT = {"auto": "auto", "on": True, "off": False}


def make_sampler(model, tokenizer, *, batch_size: int | None = None, engine: str = "auto",
                 check_every: int = 8, alignment: str = "default", norm_quant: str | bool = "auto",
                 fp4_weights: str = "auto"):
    """A sampler with ``generate(prompt_ids, SamplingParams) -> list[Completion]`` and ``describe()``;
    ``alignment``: ``default`` or ``strict`` (batch-invariant reductions, ``minite_kernels.strict``);
    ``norm_quant``: ``auto``, ``on`` or ``off`` (or a bool), the graph engine's fused norm + NVFP4 activation
    quantizer (``GraphSampler``; ``auto``: where it holds FP4-weight groups);
    ``fp4_weights``: ``auto``, ``on`` or ``off``, the graph engine's FP4-weight GEMMs (``GraphSampler``)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown sampler engine {engine!r}; valid: {', '.join(ENGINES)}")
    if fp4_weights not in FP4_WEIGHTS:
        raise ValueError(f"unknown fp4_weights {fp4_weights!r}; valid: {', '.join(FP4_WEIGHTS)}")
    if isinstance(norm_quant, bool):
        norm_quant = "on" if norm_quant else "off"
    if norm_quant not in NORM_QUANT:
        raise ValueError(f"unknown norm_quant {norm_quant!r}; valid: {', '.join(NORM_QUANT)}")
    cuda = next(model.parameters()).device.type == "cuda"
    if norm_quant == "on" and (engine == "loop" or (engine == "auto" and not cuda)):
        raise ValueError("norm_quant=on is a CUDA-graph engine option: the reference loop runs here "
                         f"(engine={engine!r} on {'CUDA' if cuda else 'CPU'}); use engine='graph' or norm_quant=auto")
    if engine == "loop":
        return LocalSampler(model, tokenizer, batch_size=batch_size, alignment=alignment)
    if engine == "auto" and not cuda:
        return LocalSampler(model, tokenizer, batch_size=batch_size, alignment=alignment)
    try:
        return GraphSampler(model, tokenizer, batch_size=batch_size, check_every=check_every, alignment=alignment,
                            norm_quant=NORM_QUANT[norm_quant], fp4_weights=FP4_WEIGHTS[fp4_weights])
    except UnsupportedModel as e:
        if engine == "auto":
            warnings.warn(f"CUDA-graph sampler: {e}; using the reference loop", stacklevel=2)
            return LocalSampler(model, tokenizer, batch_size=batch_size, alignment=alignment)
        raise UnsupportedModel(f"sampler engine 'graph' cannot run this model: {e}; use 'auto' or 'loop'") from None

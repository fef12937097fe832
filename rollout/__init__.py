"""Samplers that return the processed log-prob of every sampled token, and the model loader (``models``).

The trainer samples its rollouts with them and ``python -m eval`` its answers, so neither reaches into the other:
``make_sampler`` picks the CUDA-graph engine (``graph_sampler``) on CUDA and the reference loop (``local``) on CPU.
"""
from rollout.graph_sampler import GraphSampler
from rollout.local import Completion, LocalSampler, SamplingParams
from rollout.select import ENGINES, make_sampler

__all__ = ["ENGINES", "Completion", "GraphSampler", "LocalSampler", "SamplingParams", "make_sampler"]

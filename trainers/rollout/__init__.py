"""Samplers that return the processed log-prob of every sampled token."""
from trainers.rollout.graph_sampler import GraphSampler
from trainers.rollout.local import Completion, LocalSampler, SamplingParams
from trainers.rollout.select import ENGINES, make_sampler

__all__ = ["ENGINES", "Completion", "GraphSampler", "LocalSampler", "SamplingParams", "make_sampler"]

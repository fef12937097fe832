"""Samplers that return the processed log-prob of every sampled token."""
from trainers.rollout.local import Completion, LocalSampler, SamplingParams

__all__ = ["Completion", "LocalSampler", "SamplingParams"]

"""TRIAGE test cases shared by the loss tests: configurations that cover every switch and odd segment
lengths, and random ``[B, T]`` inputs with optional non-finite entries."""

from __future__ import annotations

import torch

from triage import TriageConfig

CONFIGS = [
    TriageConfig(),
    TriageConfig(gate=False),
    TriageConfig(repair=False),
    TriageConfig(tis=False),
    TriageConfig(diagnostics=False),
    TriageConfig(
        gate_segment_len=5, repair_segment_len=7, tis_cap=0.8, repair_boundary=0.3, gate_tail_threshold=0.5
    ),
    TriageConfig(clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=1.5, repair_huber_delta=0.3),
]


def inputs(seed, b, t, scale=2.0, adv_2d=False, nonfinite=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 4
    logp = old + 0.4 * torch.randn(b, t, generator=g)
    offset = 2.5 * torch.rand(b, 1, generator=g)
    sampler = old + scale * torch.randn(b, t, generator=g) + offset
    adv = torch.randn(b, generator=g)
    adv[torch.rand(b, generator=g) < 0.2] = 0.0
    mask = torch.rand(b, t, generator=g) > 0.2
    if adv_2d:
        adv = adv.unsqueeze(-1) * mask
    if nonfinite:
        idx = torch.randint(0, b * t, (3,), generator=g)
        logp.view(-1)[idx[0]] = float("nan")
        sampler.view(-1)[idx[1]] = float("-inf")
        old.view(-1)[idx[2]] = float("inf")
    return logp.to(dtype), old.to(dtype), sampler.to(dtype), adv, mask

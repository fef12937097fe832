from __future__ import annotations

import math

import torch

from triage.tis import tis_weights


def test_tis_weights_worked_example():
    # C = 2: exp(-1) = 0.36788, exp(0) = 1, exp(0.5) = 1.64872, exp(3) = 20.1 -> 2 (clipped)
    w = tis_weights(torch.tensor([-1.0, 0.0, 0.5, 3.0]), 2.0)
    torch.testing.assert_close(w, torch.tensor([math.exp(-1), 1.0, math.exp(0.5), 2.0]))


def test_tis_weights_safety_clamp_and_detached():
    d = torch.tensor([-50.0, 50.0], requires_grad=True)
    w = tis_weights(d, 1e30)
    # clamp to [-20, 20] before exp, as verl's rollout correction does
    torch.testing.assert_close(w, torch.tensor([math.exp(-20), math.exp(20)]))
    assert not w.requires_grad

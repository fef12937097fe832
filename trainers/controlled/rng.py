"""Random streams: every draw of the study is a pure function of (study seed, purpose, seed index, step).

    generator(base, purpose, seed, step) = torch.Generator seeded by numpy's SeedSequence([base, crc32(purpose),
                                                                                         seed, step])

So seed ``s`` draws the same prompts, uniforms and mismatch noise whichever other seeds run beside it, a resumed run
draws exactly what the uninterrupted one would have, and the arms of one seed share their draws (paired by seed).
SeedSequence hashes its entropy words, so neighbouring seeds and steps give unrelated streams.

Example: ``torch.rand(2, generator=generator(0, "rollout", 3, 7))`` is the same tensor in every process.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch


def generator(base: int, purpose: str, seed: int, step: int = 0) -> torch.Generator:
    words = [int(base), zlib.crc32(purpose.encode()), int(seed), int(step)]
    state = np.random.SeedSequence([w & 0xFFFFFFFF for w in words]).generate_state(2, dtype=np.uint32)
    g = torch.Generator()
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g

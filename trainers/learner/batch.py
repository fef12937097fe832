"""Pack sampler completions into the learner's padded layout (verl's: left-padded prompt | right-padded response)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainers.rollout.local import Completion


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor        # [B, P + R] long
    attention_mask: torch.Tensor   # [B, P + R] long
    response_mask: torch.Tensor    # [B, R] float (1 = response token)
    sampler_logp: torch.Tensor     # [B, R] fp32, processed log-probs from the sampler (0 on padding)
    prompt_len: int                # P

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def select(self, idx: torch.Tensor | slice) -> "RolloutBatch":
        """Rows `idx`, trimmed to the longest prompt/response among them (keeps P/R padding minimal)."""
        am, rm = self.attention_mask[idx], self.response_mask[idx]
        P = self.prompt_len
        prompt_pad = int((am[:, :P].sum(0) == 0).sum().item())  # leading all-pad columns
        r = int(rm.sum(0).nonzero().max().item()) + 1 if rm.sum() > 0 else 1
        cols = slice(prompt_pad, P + r)
        return RolloutBatch(self.input_ids[idx][:, cols], am[:, cols], rm[:, :r], self.sampler_logp[idx][:, :r],
                            P - prompt_pad)


def collate(completions: list[Completion], pad_id: int, device: torch.device | str = "cpu") -> RolloutBatch:
    if not completions:
        raise ValueError("no completions to collate")
    P = max(len(c.prompt_ids) for c in completions)
    R = max(max(len(c.token_ids) for c in completions), 1)
    B = len(completions)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    am = torch.zeros((B, P + R), dtype=torch.long)
    rm = torch.zeros((B, R), dtype=torch.float32)
    lp = torch.zeros((B, R), dtype=torch.float32)
    for i, c in enumerate(completions):
        n, m = len(c.prompt_ids), len(c.token_ids)
        ids[i, P - n:P] = torch.tensor(c.prompt_ids)
        am[i, P - n:P] = 1
        if m:
            ids[i, P:P + m] = torch.tensor(c.token_ids)
            am[i, P:P + m] = 1
            rm[i, :m] = 1
            lp[i, :m] = torch.tensor(c.logprobs, dtype=torch.float32)
    return RolloutBatch(ids.to(device), am.to(device), rm.to(device), lp.to(device), P)

"""Pack sampler completions into the learner's padded layout (verl's: left-padded prompt | right-padded response).

The sampler's log-probs come from the completions' device rows (``Completion.logprob_row``, set by the CUDA-graph
sampler) where every completion has one, so on a GPU they go from the sampler's buffer to the learner's batch
without a round trip through Python floats; otherwise from the ``logprobs`` lists (the same fp32 values)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from rollout.local import Completion


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


def micro_batches(batch: RolloutBatch, rows: torch.Tensor, max_rows: int, max_tokens: int = 0) -> list[torch.Tensor]:
    """Split ``rows`` (in their order) into consecutive micro-batches of at most ``max_rows`` rows and, when
    ``max_tokens > 0``, at most ``max_tokens`` padded tokens: rows x (longest prompt + longest response among
    them), the shape :meth:`RolloutBatch.select` gives the forward. A row longer than the budget goes alone.

    Example: prompt lengths 2, 2, 2 and response lengths 4, 1, 6 with ``max_rows=8, max_tokens=14``: rows 0+1
    cost 2 x (2 + 4) = 12; adding row 2 would cost 3 x (2 + 6) = 24, so the split is [0, 1], [2].
    """
    if max_tokens <= 0:
        return list(rows.split(max_rows))
    am = batch.attention_mask[:, :batch.prompt_len].sum(1).tolist()
    rl = batch.response_mask.sum(1).tolist()
    out, cur, p_max, r_max = [], [], 0, 0
    for i in rows.tolist():
        p, r = max(p_max, int(am[i])), max(r_max, int(rl[i]), 1)
        if cur and (len(cur) >= max_rows or (len(cur) + 1) * (p + r) > max_tokens):
            out.append(cur)
            cur, p, r = [], int(am[i]), max(int(rl[i]), 1)
        cur.append(i)
        p_max, r_max = p, r
    if cur:
        out.append(cur)
    return [torch.tensor(c, dtype=rows.dtype, device=rows.device) for c in out]


def collate(completions: list[Completion], pad_id: int, device: torch.device | str = "cpu") -> RolloutBatch:
    if not completions:
        raise ValueError("no completions to collate")
    P = max(len(c.prompt_ids) for c in completions)
    R = max(max(len(c.token_ids) for c in completions), 1)
    B = len(completions)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    am = torch.zeros((B, P + R), dtype=torch.long)
    rm = torch.zeros((B, R), dtype=torch.float32)
    rows = _device_rows(completions)
    lp = None if rows is None else _pad_rows(rows, R).to(device)
    if lp is None:
        lp = torch.zeros((B, R), dtype=torch.float32)
    for i, c in enumerate(completions):
        n, m = len(c.prompt_ids), len(c.token_ids)
        ids[i, P - n:P] = torch.tensor(c.prompt_ids)
        am[i, P - n:P] = 1
        if m:
            ids[i, P:P + m] = torch.tensor(c.token_ids)
            am[i, P:P + m] = 1
            rm[i, :m] = 1
            if rows is None:
                lp[i, :m] = torch.tensor(c.logprobs, dtype=torch.float32)
    return RolloutBatch(ids.to(device), am.to(device), rm.to(device), lp.to(device), P)


def _device_rows(completions: list[Completion]) -> list[torch.Tensor] | None:
    """Every completion's ``logprob_row`` where all have one, of their lengths, on one device; else None (the
    batch then takes the Python lists)."""
    rows = [c.logprob_row for c in completions]
    if any(r is None or r.shape != (len(c.token_ids),) for r, c in zip(rows, completions)):
        return None
    return rows if len({r.device for r in rows}) == 1 else None


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """[B, width] fp32: row i holds ``rows[i]`` then zeros, on the rows' device (``width`` >= the longest)."""
    out = pad_sequence([r.float() for r in rows], batch_first=True)
    return torch.nn.functional.pad(out, (0, width - out.shape[1]))

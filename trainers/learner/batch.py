"""Pack sampler completions into the learner's padded layout (verl's: left-padded prompt | right-padded response).

The sampler's log-probs come from the completions' device rows (``Completion.logprob_row``, set by the CUDA-graph
sampler) where every completion has one, so on a GPU they go from the sampler's buffer to the learner's batch
without a round trip through Python floats; otherwise from the ``logprobs`` lists (the same fp32 values).

Micro-batches are sized on the host. The batch knows where each row's prompt starts and its response ends
(``RolloutBatch.layout``: from ``collate``, or read from the masks once), and a micro-batch carries its rows both
on the device and on the host (:class:`Rows`), so selecting and trimming it asks the GPU for nothing: the host can
queue a micro-batch's forward while the GPU still runs the previous one's backward."""
from __future__ import annotations

from dataclasses import dataclass, field

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
    #: per row (first prompt column, response end): the column of its first prompt token (P for none) and one past
    #: its last response token (0 for none), so the row attends to columns [start, P + end); :meth:`layout` fills
    #: it from the masks where the batch was built without it
    row_layout: tuple[tuple[int, ...], tuple[int, ...]] | None = field(default=None, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        """The number of response tokens, from the host layout."""
        return sum(self.layout()[1])

    def layout(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(first prompt column, response end) of every row, on the host. Read from the masks (one wait for the
        GPU) the first time where ``collate`` did not give it; they must have ``collate``'s form: each row attends
        to one run of columns [start, P + end), a left-padded prompt then a right-padded response, and the response
        mask is that run's response part."""
        if self.row_layout is None:
            am, rm, P = self.attention_mask != 0, self.response_mask != 0, self.prompt_len
            R = rm.shape[1]
            pm = am[:, :P]
            start = torch.where(pm.any(1), pm.int().argmax(1), P) if P else am.new_zeros(am.shape[0], dtype=torch.long)
            end = torch.where(rm.any(1), R - rm.flip(1).int().argmax(1), 0) if R else start.new_zeros(rm.shape[0])
            ok = (am.sum(1) == P + end - start) & (rm.sum(1) == end) & (am[:, P:] == rm).all(1)
            rows = torch.stack([start, end, ok.long()]).tolist()
            if not all(rows[2]):
                bad = rows[2].index(0)
                raise ValueError(f"batch row {bad} is not a left-padded prompt followed by a right-padded response "
                                 "whose response mask matches its attention mask (the layout collate builds)")
            self.row_layout = (tuple(rows[0]), tuple(rows[1]))
        return self.row_layout

    def padded(self) -> bool:
        """Whether the attention mask has any 0 (some row starts after column 0 or ends before the last), from the
        host layout."""
        starts, ends = self.layout()
        R = self.response_mask.shape[1]
        return any(s != 0 for s in starts) or any(e != R for e in ends)

    def select(self, rows: Rows | torch.Tensor) -> RolloutBatch:
        """``rows``, trimmed to the longest prompt and response among them (the prompt columns that are padding
        in every row go, as do the response columns after the last response token; at least one response column
        stays). With :class:`Rows` nothing is read from the GPU."""
        if not isinstance(rows, Rows):
            rows = Rows(rows, tuple(rows.tolist()))
        starts, ends = self.layout()
        P = self.prompt_len
        prompt_pad = min(starts[i] for i in rows.host)
        r = max(1, max(ends[i] for i in rows.host))
        idx, cols = rows.index, slice(prompt_pad, P + r)
        sub = RolloutBatch(self.input_ids[idx][:, cols], self.attention_mask[idx][:, cols],
                           self.response_mask[idx][:, :r], self.sampler_logp[idx][:, :r], P - prompt_pad)
        sub.row_layout = (tuple(starts[i] - prompt_pad for i in rows.host), tuple(ends[i] for i in rows.host))
        return sub


@dataclass(frozen=True, eq=False)
class Rows:
    """Rows of a batch, as a tensor on the batch's device (to index with) and as host ints (to size with)."""
    index: torch.Tensor
    host: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.host)


def micro_batches(batch: RolloutBatch, rows: torch.Tensor, max_rows: int, max_tokens: int = 0) -> list[Rows]:
    """Split ``rows`` (in their order) into consecutive micro-batches of at most ``max_rows`` rows and, when
    ``max_tokens > 0``, at most ``max_tokens`` padded tokens: rows x (longest prompt + longest response among
    them), the shape :meth:`RolloutBatch.select` gives the forward. A row longer than the budget goes alone.
    Each micro-batch is a slice of ``rows`` on the batch's device (one copy of ``rows`` there, if they are
    elsewhere) with its host ints; ``rows`` is read on the host once.

    Example: prompt lengths 2, 2, 2 and response lengths 4, 1, 6 with ``max_rows=8, max_tokens=14``: rows 0+1
    cost 2 x (2 + 4) = 12; adding row 2 would cost 3 x (2 + 6) = 24, so the split is [0, 1], [2].
    """
    host = rows.tolist()
    index = rows.to(batch.input_ids.device)
    if max_tokens <= 0:
        cuts = list(range(0, len(host), max_rows)) + [len(host)]
    else:
        starts, ends = batch.layout()
        P = batch.prompt_len
        cuts, p_max, r_max = [0], 0, 0
        for n, i in enumerate(host):
            p, r = max(p_max, P - starts[i]), max(r_max, ends[i], 1)
            size = n - cuts[-1]
            if size and (size >= max_rows or (size + 1) * (p + r) > max_tokens):
                cuts.append(n)
                p, r = P - starts[i], max(ends[i], 1)
            p_max, r_max = p, r
        cuts.append(len(host))
    return [Rows(index[a:b], tuple(host[a:b])) for a, b in zip(cuts, cuts[1:]) if b > a]


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
    layout = (tuple(P - len(c.prompt_ids) for c in completions), tuple(len(c.token_ids) for c in completions))
    return RolloutBatch(ids.to(device), am.to(device), rm.to(device), lp.to(device), P, layout)


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

"""Micro-batches by rows and by a token budget (``trainers.learner.batch.micro_batches``); the batch built from
the sampler's device rows equals the one built from its lists (``collate``)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.local import Completion
from trainers.learner.batch import RolloutBatch, Rows, collate, micro_batches


def _batch(prompt_lens, response_lens):
    comps = [Completion(prompt_ids=[5] * p, token_ids=[7] * r, logprobs=[-1.0] * r, finish_reason="length")
             for p, r in zip(prompt_lens, response_lens)]
    return collate(comps, pad_id=0)


def _padded(b, rows) -> int:
    sub = b.select(rows)
    return sub.input_ids.numel()


def test_token_budget_hand_example():
    # rows 0+1: 2 x (2 + 4) = 12 <= 14; with row 2: 3 x (2 + 6) = 24 > 14
    b = _batch([2, 2, 2], [4, 1, 6])
    got = micro_batches(b, torch.arange(3), max_rows=8, max_tokens=14)
    assert [list(g.host) for g in got] == [[0, 1], [2]]
    assert _padded(b, got[0]) == 12  # the budget counts exactly what select() hands the forward


def test_rows_only_and_row_cap():
    b = _batch([3] * 5, [2] * 5)
    assert [list(g.host) for g in micro_batches(b, torch.arange(5), 2)] == [[0, 1], [2, 3], [4]]
    # the row cap holds under a generous token budget too
    assert [list(g.host) for g in micro_batches(b, torch.arange(5), 2, 10_000)] == [[0, 1], [2, 3], [4]]


def test_a_row_over_the_budget_goes_alone_and_order_is_kept():
    b = _batch([1, 9, 1], [1, 9, 1])
    got = micro_batches(b, torch.tensor([2, 1, 0]), max_rows=8, max_tokens=4)
    assert [list(g.host) for g in got] == [[2], [1], [0]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=12),
       st.integers(1, 6), st.integers(1, 80), st.randoms(use_true_random=False))
def test_partition_invariants(lens, max_rows, max_tokens, rnd):
    b = _batch([p for p, _ in lens], [r for _, r in lens])
    order = list(range(len(lens)))
    rnd.shuffle(order)
    got = micro_batches(b, torch.tensor(order), max_rows, max_tokens)
    assert [i for g in got for i in g.host] == order  # every row once, in the given order
    for g in got:
        assert 1 <= len(g) <= max_rows
        if len(g) > 1:
            assert _padded(b, g) <= max_tokens


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=8), st.data())
def test_host_layout_and_select_match_the_masks(lens, data):
    """``collate``'s host layout is what the masks say (the layout read back from them is the same), and selecting
    rows by their host ints gives the sub-batch the masks alone give: the prompt columns that are padding in every
    selected row dropped, the response cut after its last token (one column at least)."""
    b = _batch([p for p, _ in lens], [r for _, r in lens])
    read = RolloutBatch(b.input_ids, b.attention_mask, b.response_mask, b.sampler_logp, b.prompt_len)
    assert read.layout() == b.layout()
    rows = data.draw(st.lists(st.integers(0, len(lens) - 1), min_size=1, max_size=len(lens), unique=True))
    sub = b.select(Rows(torch.tensor(rows), tuple(rows)))
    am, P = b.attention_mask[rows], b.prompt_len
    pad = int((am[:, :P].sum(0) == 0).sum())
    r = max([c + 1 for c in range(b.response_mask.shape[1]) if b.response_mask[rows, c].any()], default=1)
    assert sub.prompt_len == P - pad
    assert torch.equal(sub.input_ids, b.input_ids[rows][:, pad:P + r])
    assert torch.equal(sub.attention_mask, am[:, pad:P + r])
    assert torch.equal(sub.response_mask, b.response_mask[rows, :r])
    assert torch.equal(sub.sampler_logp, b.sampler_logp[rows, :r])
    assert sub.layout() == RolloutBatch(sub.input_ids, sub.attention_mask, sub.response_mask, sub.sampler_logp,
                                        sub.prompt_len).layout()
    plain = b.select(torch.tensor(rows))  # a tensor of rows: read on the host first, the same sub-batch
    assert torch.equal(plain.input_ids, sub.input_ids) and plain.prompt_len == sub.prompt_len


def test_micro_batches_and_select_read_nothing_back(monkeypatch):
    """Sizing and selecting a micro-batch uses the host layout only: no ``item``, ``tolist``, ``nonzero`` or tensor
    truth value (each a wait for the GPU there) once ``micro_batches`` has its rows."""
    b = _batch([2, 3, 1, 4], [5, 1, 2, 3])
    chunks = micro_batches(b, torch.tensor([3, 1, 0, 2]), max_rows=3, max_tokens=14)

    def read_back(*_a, **_k):
        raise AssertionError("read a value back from the tensor")

    for name in ("item", "tolist", "nonzero", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, read_back)
    subs = [b.select(c) for c in chunks]
    monkeypatch.undo()
    assert [list(c.host) for c in chunks] == [[3, 1], [0, 2]]
    assert [c.index.tolist() for c in chunks] == [[3, 1], [0, 2]]
    # rows 3 and 1: prompts of 4 and 3, responses of 3 and 1; rows 0 and 2: prompts 2 and 1, responses 5 and 2
    assert [tuple(s.input_ids.shape) for s in subs] == [(2, 4 + 3), (2, 2 + 5)]


def test_collate_takes_the_device_rows_and_equals_the_lists():
    """Completions that carry their log-probs as tensors (``Completion.logprob_row``) give the same batch, bit for
    bit, as their Python lists; one completion without a row, or a row of another length, sends the whole batch
    back to the lists."""
    g = torch.Generator().manual_seed(0)
    lens = (3, 0, 5, 1)
    rows = [-torch.rand(n, generator=g) * 7 for n in lens]
    plain = [Completion(prompt_ids=[5] * (i + 1), token_ids=[7] * n, logprobs=r.tolist(), finish_reason="length")
             for i, (n, r) in enumerate(zip(lens, rows))]
    with_rows = [Completion(c.prompt_ids, c.token_ids, c.logprobs, c.finish_reason, logprob_row=r)
                 for c, r in zip(plain, rows)]
    a, b = collate(plain, pad_id=0), collate(with_rows, pad_id=0)
    for name in ("input_ids", "attention_mask", "response_mask", "sampler_logp"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert b.sampler_logp[2, :5].tolist() == rows[2].tolist() and b.sampler_logp[1].abs().sum() == 0
    # a row whose values differ from the list shows which source the batch took
    marked = [Completion(c.prompt_ids, c.token_ids, c.logprobs, c.finish_reason, logprob_row=r - 1)
              for c, r in zip(plain, rows)]
    assert torch.equal(collate(marked, pad_id=0).sampler_logp, a.sampler_logp - a.response_mask)
    marked[0] = plain[0]
    assert torch.equal(collate(marked, pad_id=0).sampler_logp, a.sampler_logp)
    marked[0] = Completion(*plain[0].__dict__.values())
    marked[0].logprob_row = rows[0][:2]
    assert torch.equal(collate(marked, pad_id=0).sampler_logp, a.sampler_logp)

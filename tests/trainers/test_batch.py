"""Micro-batches by rows and by a token budget (``trainers.learner.batch.micro_batches``); the batch built from
the sampler's device rows equals the one built from its lists (``collate``)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.local import Completion
from trainers.learner.batch import collate, micro_batches


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
    assert [g.tolist() for g in got] == [[0, 1], [2]]
    assert _padded(b, got[0]) == 12  # the budget counts exactly what select() hands the forward


def test_rows_only_and_row_cap():
    b = _batch([3] * 5, [2] * 5)
    assert [g.tolist() for g in micro_batches(b, torch.arange(5), 2)] == [[0, 1], [2, 3], [4]]
    # the row cap holds under a generous token budget too
    assert [g.tolist() for g in micro_batches(b, torch.arange(5), 2, 10_000)] == [[0, 1], [2, 3], [4]]


def test_a_row_over_the_budget_goes_alone_and_order_is_kept():
    b = _batch([1, 9, 1], [1, 9, 1])
    got = micro_batches(b, torch.tensor([2, 1, 0]), max_rows=8, max_tokens=4)
    assert [g.tolist() for g in got] == [[2], [1], [0]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=12),
       st.integers(1, 6), st.integers(1, 80), st.randoms(use_true_random=False))
def test_partition_invariants(lens, max_rows, max_tokens, rnd):
    b = _batch([p for p, _ in lens], [r for _, r in lens])
    order = list(range(len(lens)))
    rnd.shuffle(order)
    got = micro_batches(b, torch.tensor(order), max_rows, max_tokens)
    assert [i for g in got for i in g.tolist()] == order  # every row once, in the given order
    for g in got:
        assert 1 <= g.numel() <= max_rows
        if g.numel() > 1:
            assert _padded(b, g) <= max_tokens


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

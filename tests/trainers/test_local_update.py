"""The local engine's learner passes (``trainers/engines/local/update.py``): the old policy's log-prob recompute
takes its own micro-batches (``algorithm.log_prob_micro_batch_size`` / ``_tokens``), and writes every row's
log-probs where they belong whatever the split."""
from __future__ import annotations

import torch

from trainers.config import load_config
from trainers.engines.local.update import LearnerMixin
from trainers.learner.batch import RolloutBatch


def _batch(rows: int = 10, prompt: int = 3, response: int = 5) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    resp_len = torch.randint(1, response + 1, (rows,), generator=g)
    response_mask = (torch.arange(response)[None, :] < resp_len[:, None]).float()
    attention_mask = torch.cat([torch.ones(rows, prompt, dtype=torch.long), response_mask.long()], dim=1)
    input_ids = torch.randint(0, 50, (rows, prompt + response), generator=g)
    return RolloutBatch(input_ids, attention_mask, response_mask, torch.zeros(rows, response), prompt)


class _Learner(LearnerMixin):
    """The mixin with a stand-in model: each row's "log-prob" at column t is row id + t / 10, so a row written to
    the wrong place shows; records the rows of every forward."""

    def __init__(self, overrides: list[str]) -> None:
        self.cfg = load_config(overrides)
        self.device = torch.device("cpu")
        self.model = torch.nn.Linear(1, 1)
        self.calls: list[list[int]] = []

    def _logprobs(self, batch, rows, *, grad, with_entropy):
        assert not grad and with_entropy
        self.calls.append(list(rows.host))
        sub = batch.select(rows)
        r = sub.response_mask.shape[1]
        lp = (rows.index[:, None].float() + torch.arange(r)[None, :] / 10) * sub.response_mask  # 0 off the response
        return lp, -lp, r


def test_recompute_uses_the_log_prob_micro_batches_and_places_every_row():
    batch = _batch()
    want = torch.arange(10)[:, None].float() + torch.arange(5)[None, :] / 10
    runs = {}
    for extra, splits in ((["algorithm.micro_batch_size=2"], 5),
                          (["algorithm.micro_batch_size=2", "algorithm.log_prob_micro_batch_size=4"], 3),
                          (["algorithm.micro_batch_size=2", "algorithm.log_prob_micro_batch_size=16"], 1)):
        learner = _Learner(extra)
        old, ent = learner._recompute_old(batch)
        assert len(learner.calls) == splits and sorted(r for call in learner.calls for r in call) == list(range(10))
        m = batch.response_mask.bool()
        assert torch.equal(old[m], want[m]) and torch.equal(ent[m], -want[m]) and not old[~m].any()
        runs[splits] = old
    assert torch.equal(runs[5], runs[3]) and torch.equal(runs[3], runs[1])


def test_recompute_token_budget_defaults_to_the_updates():
    batch = _batch()
    cfg = load_config(["algorithm.micro_batch_size=8", "algorithm.micro_batch_tokens=16"])
    assert cfg.algorithm.log_prob_micro() == (8, 16)
    learner = _Learner(["algorithm.micro_batch_size=8", "algorithm.micro_batch_tokens=16"])
    learner._recompute_old(batch)
    budgeted = len(learner.calls)
    learner = _Learner(["algorithm.micro_batch_size=8", "algorithm.micro_batch_tokens=16",
                        "algorithm.log_prob_micro_batch_tokens=64"])
    learner._recompute_old(batch)
    assert budgeted > len(learner.calls) >= 2  # a larger budget: fewer forwards (10 rows of 4-8 tokens)
    assert load_config([]).algorithm.log_prob_micro() == (load_config([]).algorithm.micro_batch_size, 0)

"""The synthetic task: long stride chains with a verifiable reward.

A prompt is a start token ``s`` and a stride ``k`` (both in ``0..V-1``). The response is ``T`` tokens
``y_0 .. y_{T-1}``; with ``y_{-1} = s``, position ``t`` is correct when ``y_t = (y_{t-1} + k) mod V``, and

    reward(y) = (1 / T) * sum_t [y_t == (y_{t-1} + k) mod V]                  (in [0, 1]; uniform policy: 1 / V)

The policy sees the state ``(y_{t-1}, k)`` (``V * V`` states, index ``y_{t-1} * V + k``), so its log-probs form a
table ``[states, V]`` and a response's log-probs are gathered from it. Because the reward counts transitions, the
expected reward of a policy is exact: propagate the distribution of ``y_{t-1}`` through the ``T`` steps
(:func:`expected_reward`), with no sampling noise. That is the learning curves' y-axis.

Worked example (V = 4, T = 4): prompt s = 1, k = 2, response [3, 1, 0, 2]:
    targets (1+2, 3+2, 1+2, 0+2) mod 4 = [3, 1, 3, 2] -> correct [1, 1, 0, 1] -> reward 0.75;
    the states are (prev, k) = (1, 2), (3, 2), (1, 2), (0, 2) -> indices [6, 14, 6, 2].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChainTask:
    vocab: int
    length: int

    @property
    def states(self) -> int:
        return self.vocab * self.vocab

    def features(self) -> torch.Tensor:
        """``[states, 2V]`` fp32: one-hot of the previous token, then one-hot of the stride."""
        v = self.vocab
        idx = torch.arange(self.states)
        eye = torch.eye(v)
        return torch.cat((eye[idx // v], eye[idx % v]), dim=1)

    def draw_prompts(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, stride)``, each ``[n]`` int64, uniform over ``0..V-1``."""
        both = torch.randint(0, self.vocab, (2, n), generator=generator)
        return both[0], both[1]

    def state_index(self, tokens: torch.Tensor, start: torch.Tensor, stride: torch.Tensor) -> torch.Tensor:
        """State of every position: ``prev * V + stride``; ``tokens [..., T]``, ``start``/``stride`` ``[...]``."""
        prev = torch.cat((start.unsqueeze(-1), tokens[..., :-1]), dim=-1)
        return prev * self.vocab + stride.unsqueeze(-1)

    def correct(self, tokens: torch.Tensor, start: torch.Tensor, stride: torch.Tensor) -> torch.Tensor:
        """Bool ``[..., T]``: the position follows the chain."""
        prev = torch.cat((start.unsqueeze(-1), tokens[..., :-1]), dim=-1)
        return tokens == (prev + stride.unsqueeze(-1)) % self.vocab

    def reward(self, tokens: torch.Tensor, start: torch.Tensor, stride: torch.Tensor) -> torch.Tensor:
        """fp32 ``[...]``: the share of correct positions."""
        return self.correct(tokens, start, stride).float().mean(-1)

    def expected_reward(self, logp_table: torch.Tensor) -> torch.Tensor:
        """Exact expected reward ``[S]`` of policies ``logp_table [S, states, V]`` over uniform prompts.

        For every (start, stride) the distribution ``p_t`` of ``y_{t-1}`` starts one-hot at the start token;
        ``P(correct at t) = sum_prev p_t(prev) * pi((prev + k) mod V | prev, k)`` and ``p_{t+1} = p_t @ pi(. | ., k)``.
        """
        with torch.no_grad():
            v = self.vocab
            probs = logp_table.detach().double().exp().view(-1, v, v, v)  # [S, prev, k, y]
            trans = probs.permute(0, 2, 1, 3)  # [S, k, prev, y]: one transition matrix per stride
            target = (torch.arange(v).view(v, 1) + torch.arange(v).view(1, v)) % v  # [k, prev] -> correct y
            hit = trans.gather(-1, target.view(1, v, v, 1).expand(trans.shape[0], v, v, 1)).squeeze(-1)  # [S,k,prev]
            p = torch.eye(v, dtype=torch.float64).expand(trans.shape[0], v, v, v).clone()  # [S, k, start, prev]
            total = torch.zeros(trans.shape[0], dtype=torch.float64)
            for _ in range(self.length):
                total += (p * hit.unsqueeze(2)).sum(-1).mean((1, 2))
                p = p @ trans
            return (total / self.length).float()

"""Sampler mismatch with known structure, and the sampler that draws tokens through it.

The learner's distribution at a state is ``pi = softmax(z)``. The sampler draws every token from its own
distribution ``q`` and reports ``log q`` of the token it drew, as an inference engine does; the gap of a sampled
token is ``delta = log pi(y) - log q(y)`` (TRIAGE.md's ``old_logp - sampler_logp``). Each kind on its own:

    none         q = pi                                           delta = 0 exactly
    noise        q_t = softmax(z + sigma * eps_t),  eps_t ~ N(0, I) i.i.d. per position and token
    temperature  q = softmax(z / tau)                             delta(y) = (1 - 1/tau) * z_y + const(state)
    burst        inside a burst window (each 64-token window independently with probability p):
                 q_t = softmax(z + b * onehot(j_t)),  j_t uniform per position; elsewhere q = pi
    nvfp4        q = softmax(z_nvfp4): the same weights run by the emulated NVFP4 backend (policy.nvfp4_logits)

Sampling is by inverse CDF from one uniform ``u[t]`` per position (``y = #{j : cdf_q(j) < u}``), drawn before the
mismatch's own randomness. The on-policy sampler (kind none) therefore draws the same prompts and uniforms as every
mismatched one of that seed (common random numbers), and with no mismatch the two draw identical tokens.

What theory predicts, and the tests check: ``E_q[delta] = -KL(q || pi) <= 0`` for every kind, so sampled tokens
have a negative mean gap. With temperature the sign is per token: for ``tau > 1`` (a flatter sampler) the tokens
the learner finds likely have ``delta > 0`` and the unlikely ones ``delta < 0``; ``tau < 1`` the reverse. A burst
puts ``delta ~ log pi(j) - log q(j)``, several nats below 0 for an unlikely ``j``, into whole 64-token windows:
the segment-dense negative tail the report describes (docs/REPORT.md §2.5) and TRIAGE's gate targets.

Worked example (temperature): z = [2, 0], tau = 2 -> pi = [0.881, 0.119], q = [0.731, 0.269]:
    delta(0) = log(0.881 / 0.731) = +0.186,  delta(1) = log(0.119 / 0.269) = -0.814.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainers.controlled.config import SWEEP_PARAM, MismatchConfig
from trainers.controlled.policy import EnsembleMLP
from trainers.controlled.rng import generator
from trainers.controlled.task import ChainTask


@dataclass(frozen=True)
class Mismatch:
    kind: str = "none"  # none | noise | temperature | burst | nvfp4
    noise_sigma: float = 0.0
    temperature: float = 1.0
    burst_prob: float = 0.0
    burst_logit: float = 0.0
    burst_window: int = 64
    nvfp4_recipe: str = "nvfp4_per_token_w1x16_bf16_bwd"
    nvfp4_head: bool = True

    @classmethod
    def of(cls, kind: str, cfg: MismatchConfig, level: float | None = None) -> Mismatch:
        """The kind with the study's settings; ``level`` replaces its swept magnitude (``SWEEP_PARAM``)."""
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(MismatchConfig)}
        if level is not None:
            fields[SWEEP_PARAM[kind]] = float(level)
        return cls(kind=kind, **fields)

    @property
    def level(self) -> float | str:
        """The kind's magnitude: sigma, tau, the burst logit, or the NVFP4 recipe."""
        return {"none": 0.0, "noise": self.noise_sigma, "temperature": self.temperature,
                "burst": self.burst_logit, "nvfp4": self.nvfp4_recipe}[self.kind]

    def label(self) -> str:
        if self.kind == "noise":
            return f"noise σ={self.noise_sigma:g}"
        if self.kind == "temperature":
            return f"temperature τ={self.temperature:g}"
        if self.kind == "burst":
            return f"burst p={self.burst_prob:g} b={self.burst_logit:g}"
        if self.kind == "nvfp4":
            return f"nvfp4 ({self.nvfp4_recipe}{'' if self.nvfp4_head else ', head fp32'})"
        return "none"


ON_POLICY = Mismatch()


@dataclass
class Draws:
    """One batch's randomness for S seeds: ``[S, B]`` prompts, ``[S, B, T]`` uniforms, the mismatch's own."""

    start: torch.Tensor
    stride: torch.Tensor
    u: torch.Tensor
    noise: torch.Tensor | None = None  # [S, B, T, V]
    burst: torch.Tensor | None = None  # [S, B, T] bool: the position lies in a burst window
    burst_token: torch.Tensor | None = None  # [S, B, T]


def draw(task: ChainTask, seeds: Sequence[int], prompts: int, group: int, mismatch: Mismatch, base_seed: int,
         purpose: str, step: int) -> Draws:
    """Per-seed draws, stacked: prompts (each repeated ``group`` times), uniforms, then the mismatch's noise."""
    parts = []
    b, t, v = prompts * group, task.length, task.vocab
    for s in seeds:
        g = generator(base_seed, purpose, s, step)
        start, stride = task.draw_prompts(prompts, g)
        d = {"start": start.repeat_interleave(group), "stride": stride.repeat_interleave(group),
             "u": torch.rand(b, t, generator=g)}
        if mismatch.kind == "noise":
            d["noise"] = torch.randn(b, t, v, generator=g)
        elif mismatch.kind == "burst":
            w = mismatch.burst_window
            windows = torch.rand(b, -(-t // w), generator=g) < mismatch.burst_prob
            d["burst"] = windows.repeat_interleave(w, dim=1)[:, :t]
            d["burst_token"] = torch.randint(0, v, (b, t), generator=g)
        parts.append(d)
    return Draws(**{k: torch.stack([p[k] for p in parts]) for k in parts[0]})


def sampler_table(policy: EnsembleMLP, x: torch.Tensor, mismatch: Mismatch,
                  learner: torch.Tensor | None = None) -> torch.Tensor:
    """The sampler's state-wise log-probs ``[S, states, V]`` before any per-position perturbation (no grad).
    ``learner``: the learner's log-prob table, when already computed (kinds none, noise and burst return it)."""
    with torch.no_grad():
        if mismatch.kind == "temperature":
            return torch.log_softmax(policy.logits(x) / mismatch.temperature, dim=-1)
        if mismatch.kind == "nvfp4":
            return torch.log_softmax(policy.nvfp4_logits(x, mismatch.nvfp4_recipe, mismatch.nvfp4_head), dim=-1)
        return learner.detach() if learner is not None else policy.logp_table(x).detach()


def sample(task: ChainTask, table: torch.Tensor, draws: Draws, mismatch: Mismatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[S, B, T]`` (int64) drawn from the sampler, and the sampler's log-prob of each (fp32).

    ``table``: :func:`sampler_table`. At position t the row of the state ``(y_{t-1}, stride)`` is perturbed
    (noise, burst), renormalised, and inverted at ``u[t]``."""
    s, b, t = draws.u.shape
    v = task.vocab
    flat = table.reshape(-1, v)
    base = (torch.arange(s) * task.states).view(s, 1) + draws.stride  # [S, B]
    prev = draws.start
    tokens = torch.empty(s, b, t, dtype=torch.long)
    logq = torch.empty(s, b, t)
    for i in range(t):
        lq = flat[base + prev * v]  # [S, B, V]
        if draws.noise is not None:
            lq = torch.log_softmax(lq + mismatch.noise_sigma * draws.noise[:, :, i], dim=-1)
        elif draws.burst is not None:  # outside a burst the row is the learner's own, bit for bit (delta = 0)
            on = draws.burst[:, :, i, None]
            boost = torch.nn.functional.one_hot(draws.burst_token[:, :, i], v) * mismatch.burst_logit
            lq = torch.where(on, torch.log_softmax(lq + boost, dim=-1), lq)
        cdf = lq.exp().cumsum(-1)
        tok = (cdf < draws.u[:, :, i, None]).sum(-1).clamp_(max=v - 1)
        tokens[:, :, i] = tok
        logq[:, :, i] = lq.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        prev = tok
    return tokens, logq

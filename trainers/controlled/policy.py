"""The policy: S independent two-layer tanh MLPs over the task's states, stored as stacked tensors.

For one member ``s`` and the state features ``x`` (one-hot previous token, one-hot stride; ``[states, 2V]``)::

    h1 = tanh(x W1ᵀ + b1)        W1 [H, 2V]
    h2 = tanh(h1 W2ᵀ + b2)       W2 [H, H]
    z  = h2 W3ᵀ + b3             W3 [V, H]          log pi(y | state) = log_softmax(z)[state, y]

so the policy is a log-prob table ``[states, V]`` per member and a response's log-probs are gathered from it
(``trainers.controlled.task``). The S members share nothing: the gradient of the sum of their losses with respect
to member ``s``'s parameters is the gradient of member ``s``'s own loss. That is how one backward pass gives one
gradient per seed, and how S training runs go at once.

Member ``s`` is initialised from its own seed (PyTorch's ``nn.Linear`` rule, U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
so a seed starts from the same parameters in every arm and whichever other seeds run beside it.

:meth:`EnsembleMLP.nvfp4_logits` is the same network run by the project's emulated NVFP4 backend under a
precision recipe's forward GEMMs (``minite_kernels.backends.emulated``: quantize -> dequantize -> fp32 matmul; by
default activations per token, weights per tensor, both in 1x16 blocks); biases and tanh stay fp32.

Worked example (V = 8, H = 64): 16*64 + 64 + 64*64 + 64 + 64*8 + 8 = 5,768 parameters per member.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from trainers.controlled.rng import generator

#: parameter names in order, with the layer each belongs to
NAMES = ("w1", "b1", "w2", "b2", "w3", "b3")


class EnsembleMLP:
    """``params[name]`` is ``[S, ...]``; member ``s`` is seed ``seeds[s]``."""

    def __init__(self, params: dict[str, torch.Tensor], seeds: Sequence[int]) -> None:
        self.params = params
        self.seeds = tuple(int(s) for s in seeds)

    @classmethod
    def init(cls, seeds: Sequence[int], vocab: int, hidden: int, base_seed: int) -> EnsembleMLP:
        shapes = {"w1": (hidden, 2 * vocab), "b1": (hidden,), "w2": (hidden, hidden), "b2": (hidden,),
                  "w3": (vocab, hidden), "b3": (vocab,)}
        fan_in = {"w1": 2 * vocab, "b1": 2 * vocab, "w2": hidden, "b2": hidden, "w3": hidden, "b3": hidden}
        per_seed = []
        for s in seeds:
            g = generator(base_seed, "init", s)
            per_seed.append({n: (torch.rand(shapes[n], generator=g) * 2 - 1) / math.sqrt(fan_in[n]) for n in NAMES})
        params = {n: torch.stack([p[n] for p in per_seed]).requires_grad_() for n in NAMES}
        return cls(params, seeds)

    @property
    def size(self) -> int:
        return len(self.seeds)

    def num_params(self) -> int:
        """Parameters of one member."""
        return sum(p[0].numel() for p in self.params.values())

    def parameters(self) -> list[torch.Tensor]:
        return [self.params[n] for n in NAMES]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[S, states, V]`` logits of every member at the state features ``x [states, 2V]`` (with grad)."""
        p = self.params
        h = torch.tanh(torch.einsum("nf,shf->snh", x, p["w1"]) + p["b1"].unsqueeze(1))
        h = torch.tanh(torch.bmm(h, p["w2"].transpose(1, 2)) + p["b2"].unsqueeze(1))
        return torch.bmm(h, p["w3"].transpose(1, 2)) + p["b3"].unsqueeze(1)

    def logp_table(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(x), dim=-1)

    def nvfp4_logits(self, x: torch.Tensor, recipe: str, head: bool = True) -> torch.Tensor:
        """``[S, states, V]`` logits with every linear's forward GEMM run by the emulated NVFP4 backend under
        ``recipe`` (``head=False``: the output layer in fp32, as the trainer's ``precision.exclude=[lm_head]``)."""
        from minite_kernels.backends.emulated import EmulatedBackend
        from minite_kernels.recipes import resolve_recipe

        fprop = resolve_recipe(recipe, env={})[0].fprop
        backend = EmulatedBackend("cpu")
        out = []
        with torch.no_grad():
            for s in range(self.size):
                p = {n: t[s].detach() for n, t in self.params.items()}

                def linear(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor, quantized: bool = True) -> torch.Tensor:
                    y = backend.qgemm_nt(a, w, fprop.a, fprop.b, out_dtype=torch.float32) if quantized else a @ w.t()
                    return y + b

                h = torch.tanh(linear(x, p["w1"], p["b1"]))
                h = torch.tanh(linear(h, p["w2"], p["b2"]))
                out.append(linear(h, p["w3"], p["b3"], quantized=head))
        return torch.stack(out)

    def flat_grads(self) -> torch.Tensor:
        """``[S, num_params]``: each member's ``.grad``, concatenated in :data:`NAMES` order."""
        return torch.cat([self.params[n].grad.reshape(self.size, -1) for n in NAMES], dim=1)

    def state_dict(self) -> dict:
        return {"seeds": list(self.seeds), "params": {n: t.detach().clone() for n, t in self.params.items()}}

    @classmethod
    def from_state_dict(cls, state: dict) -> EnsembleMLP:
        return cls({n: state["params"][n].clone().requires_grad_() for n in NAMES}, state["seeds"])

    def replicate(self, member: int, copies: int) -> EnsembleMLP:
        """``copies`` members equal to member ``member`` (one snapshot, many independent batches)."""
        params = {n: t[member].detach().unsqueeze(0).repeat(copies, *([1] * (t.dim() - 1))).requires_grad_()
                  for n, t in self.params.items()}
        return EnsembleMLP(params, [self.seeds[member]] * copies)

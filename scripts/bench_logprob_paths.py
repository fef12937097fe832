"""The learner's log-prob + entropy step, two ways side by side in one process: the trainer's own chunked path
(``trainers.learner.logprobs.response_logprobs``: BF16 ``lm_head`` per chunk of response tokens, fp32
``log_softmax``, activation checkpointing when gradients are on) against the fused Triton kernel
(``minite_kernels.backends.triton.logprobs_and_entropy``: chunked BF16 GEMMs and one pass per chunk with an
online log-sum-exp, its own backward). Both take the same final hidden states of ``--tokens`` response tokens, so
only the head, the softmax statistics and their backward differ; the decoder forward is not in either time.

    python scripts/bench_logprob_paths.py [--tokens 16384] [--hidden 2560] [--vocab 151936]

Prints one JSON line: per path and mode (``no_grad`` = the old-log-prob recompute, ``fwd_bwd`` = the update's
forward and backward with gradients to the hidden states and the head) the median milliseconds, the peak extra
memory, and the fused path's largest |Δ logp| and |Δ entropy| against the trainer's path.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
import types

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


class _HeadOnly(nn.Module):
    """A stand-in model for ``response_logprobs``: its base returns the given hidden states as the last layer's
    output, its output embedding is a BF16 ``lm_head``."""

    base_model_prefix = "model"

    def __init__(self, hidden: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.lm_head = nn.Linear(hidden.shape[-1], vocab, bias=False, device=hidden.device, dtype=hidden.dtype)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        self.config = types.SimpleNamespace(final_logit_softcapping=None)
        self.model = self._base

    def _base(self, **_) -> types.SimpleNamespace:
        return types.SimpleNamespace(last_hidden_state=self.hidden)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head


def _time(fn, reps: int, dev: torch.device) -> tuple[float, float]:
    """(median ms, peak extra bytes) of ``fn`` over ``reps`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(dev) - base if dev.type == "cuda" else 0
    return statistics.median(times), float(peak)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384, help="response tokens (one row of the batch)")
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--chunk", type=int, default=256, help="the trainer's chunk (trainer default 256)")
    ap.add_argument("--fused-chunk", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    from minite_kernels.backends.triton import logprobs_and_entropy
    from trainers.learner.logprobs import response_logprobs

    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = a.tokens
    h = torch.randn(1, t + 1, a.hidden, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    model = _HeadOnly(h, a.vocab)
    ids = torch.randint(0, a.vocab, (1, t + 1), device=dev, generator=g)
    am = torch.ones_like(ids)
    rm = torch.ones((1, t), device=dev)
    glp = torch.randn(1, t, device=dev, generator=g)

    def trainer():
        return response_logprobs(model, ids, am, rm, prompt_len=1, temperature=a.temperature, chunk_size=a.chunk)

    def fused():
        return logprobs_and_entropy(h[:, :-1], model.lm_head.weight, ids[:, 1:], temperature=a.temperature,
                                    chunk=a.fused_chunk)

    def fwd_bwd(fn):
        def run():
            lp, ent = fn()
            ((lp * glp).sum() + 0.01 * ent.sum()).backward()
            h.grad = None
            model.lm_head.weight.grad = None

        return run

    out: dict = {"bench": "logprob_paths", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                 "tokens": t, "hidden": a.hidden, "vocab": a.vocab, "chunk": a.chunk, "fused_chunk": a.fused_chunk,
                 "torch": torch.__version__, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with torch.no_grad():
        lp_t, ent_t = trainer()
        lp_f, ent_f = fused()
        out["max_abs_dlogp"] = float((lp_t - lp_f).abs().max())
        out["max_abs_dentropy"] = float((ent_t - ent_f).abs().max())
        for name, fn in (("trainer", trainer), ("fused", fused)):
            out[f"{name}_no_grad_ms"], out[f"{name}_no_grad_peak_bytes"] = _time(fn, a.reps, dev)
    for name, fn in (("trainer", trainer), ("fused", fused)):
        out[f"{name}_fwd_bwd_ms"], out[f"{name}_fwd_bwd_peak_bytes"] = _time(fwd_bwd(fn), a.reps, dev)
    for mode in ("no_grad", "fwd_bwd"):
        out[f"{mode}_speedup_fused"] = out[f"trainer_{mode}_ms"] / out[f"fused_{mode}_ms"]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

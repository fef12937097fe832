"""Strict alignment's cost and effect on the CPU: sampler and learner timed in default and strict mode, one process.

    python scripts/bench_strict.py                               # embedded SmolLM2-135M, nvfp4_per_token_bf16_bwd
    python scripts/bench_strict.py --tiny --prompts 2 --new-tokens 4    # smoke

For each mode: one rollout of ``--prompts`` prompts (mixed lengths, one batch, ``--new-tokens`` tokens, T = 1)
through the reference loop, then the learner's log-prob recompute (one full forward); it reports both times,
the sampler/learner mean and max |delta| and whether every token's delta is exactly 0. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TEXTS = ["What is 3+4?", "Compute 12 * 7, please, and show the steps", "hi", "Tell me a story about a cat who",
         "List three prime numbers", "Why is the sky blue?", "2+2=", "Name a colour"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="nvfp4_per_token_bf16_bwd")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="a tiny random Qwen3 instead of the embedded model")
    a = ap.parse_args(argv)

    import torch

    from minite_kernels import quantize_model
    from minite_kernels.strict import StrictMode
    from trainers.learner.batch import collate
    from trainers.learner.logprobs import response_logprobs
    from trainers.models import load_model_and_tokenizer, tiny_random_qwen3
    from trainers.rollout import LocalSampler, SamplingParams

    torch.set_num_threads(a.threads)
    if a.tiny:
        model, tok = tiny_random_qwen3(REPO / "tests" / "assets" / "qwen3_tokenizer", seed=0)
    else:
        model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    if a.recipe != "bf16":
        quantize_model(model, a.recipe)
    prompts = [tok.encode(TEXTS[i % len(TEXTS)]) for i in range(a.prompts)]
    out: dict = {}
    for mode in ("default", "strict"):
        ctx = StrictMode() if mode == "strict" else contextlib.nullcontext()
        with ctx, torch.no_grad():
            t0 = time.perf_counter()
            comps = LocalSampler(model, tok).generate(prompts, SamplingParams(max_new_tokens=a.new_tokens, seed=1))
            t1 = time.perf_counter()
            b = collate(comps, tok.pad_token_id)
            lp, _ = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask,
                                      prompt_len=b.prompt_len, with_entropy=False)
            t2 = time.perf_counter()
        d = ((lp - b.sampler_logp) * b.response_mask).abs()
        n = b.response_mask.sum()
        out[mode] = {"sampler_s": t1 - t0, "learner_s": t2 - t1, "tokens": int(n),
                     "abs_gap_mean": float(d.sum() / n), "abs_gap_max": float(d.max()),
                     "exactly_zero": bool((d == 0).all())}
    out["cost"] = {k: out["strict"][k] / out["default"][k] for k in ("sampler_s", "learner_s")}
    print(json.dumps({"bench": "strict_alignment", "model": "tiny-qwen3" if a.tiny else "smollm2-135m-instruct",
                      "recipe": a.recipe, "threads": a.threads, "torch": torch.__version__, **out,
                      "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Strict alignment's cost and effect: sampler and learner timed in default and strict mode, side by side in one
process, on CPU or CUDA.

    python scripts/bench_strict.py                               # CPU: embedded SmolLM2-135M, nvfp4_per_token_bf16_bwd
    python scripts/bench_strict.py --tiny --prompts 2 --new-tokens 4    # smoke
    python scripts/bench_strict.py --device cuda --model qwen3-0.6b --prompts 64 --new-tokens 128   # H200

For each mode, on its own copy of the model (the default mode runs the device's fastest backend and sampler: on
CUDA the Triton NVFP4 backend and the CUDA-graph engine with fused and packed ops; the strict mode the strict
backend, dequantized GEMMs through the batch-invariant kernels with the Triton quantizer, in the same engine):
one warm-up rollout, then a timed rollout of ``--prompts`` prompts (mixed lengths, one batch, ``--new-tokens``
tokens, T = 1) and the learner's log-prob recompute (one full forward). It reports both times, the sampler's tokens/s, the
sampler/learner mean and max |delta| and whether every token's delta is exactly 0. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TEXTS = ["What is 3+4?", "Compute 12 * 7, please, and show the steps", "hi", "Tell me a story about a cat who",
         "List three prime numbers", "Why is the sky blue?", "2+2=", "Name a colour"]
MODELS = ("smollm2", "tiny", "qwen3-0.6b")


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_mode(base, tok, mode: str, recipe: str, prompts, new_tokens: int, dev) -> dict:
    """One mode's warm-up and timed rollout, then the learner's recompute, on a fresh copy of ``base``."""
    import torch

    from minite_kernels import quantize_model
    from minite_kernels.strict import StrictMode, linear_backend
    from rollout import SamplingParams, make_sampler
    from trainers.learner.batch import collate
    from trainers.learner.logprobs import response_logprobs

    model = copy.deepcopy(base).to(dev)
    if recipe != "bf16":
        quantize_model(model, recipe, backend=linear_backend() if mode == "strict" else "auto")
    sampler = make_sampler(model, tok, alignment=mode)
    params = SamplingParams(max_new_tokens=new_tokens, seed=1)
    with torch.no_grad():
        sampler.generate(prompts, params)  # warm-up: kernels compiled, graphs captured
        _sync(dev)
        t0 = time.perf_counter()
        comps = sampler.generate(prompts, params)
        _sync(dev)
        t1 = time.perf_counter()
        b = collate(comps, tok.pad_token_id, dev)
        with StrictMode() if mode == "strict" else contextlib.nullcontext():
            _sync(dev)
            t2 = time.perf_counter()
            lp, _ = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask,
                                      prompt_len=b.prompt_len, with_entropy=False)
            _sync(dev)
            t3 = time.perf_counter()
    d = ((lp - b.sampler_logp) * b.response_mask).abs()
    n = b.response_mask.sum()
    return {"sampler_s": t1 - t0, "learner_s": t3 - t2, "tokens": int(n), "sampler_tokens_per_s": float(n) / (t1 - t0),
            "abs_gap_mean": float(d.sum() / n), "abs_gap_max": float(d.max()), "exactly_zero": bool((d == 0).all()),
            "sampler": sampler.describe()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="nvfp4_per_token_bf16_bwd")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="model dtype (default: float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--model", default="smollm2", choices=MODELS,
                    help="smollm2: the embedded SmolLM2-135M; tiny / qwen3-0.6b: random Qwen3 of that shape")
    ap.add_argument("--tiny", action="store_true", help="same as --model tiny")
    a = ap.parse_args(argv)

    import torch

    from rollout.models import QWEN3_0_6B_SHAPES, load_model_and_tokenizer, tiny_random_qwen3

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available; run on a GPU or pass --device cpu"}))
        return 1
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    name = "tiny" if a.tiny else a.model
    dtype = a.dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    if name == "smollm2":
        base, tok = load_model_and_tokenizer("smollm2-135m-instruct", dtype=dtype)
    else:
        base, tok = tiny_random_qwen3(REPO / "tests" / "assets" / "qwen3_tokenizer", seed=0, dtype=dtype,
                                      **(QWEN3_0_6B_SHAPES if name == "qwen3-0.6b" else {}))
    prompts = [tok.encode(TEXTS[i % len(TEXTS)]) for i in range(a.prompts)]
    out: dict = {mode: run_mode(base, tok, mode, a.recipe, prompts, a.new_tokens, dev)
                 for mode in ("default", "strict")}
    out["cost"] = {k: out["strict"][k] / out["default"][k] for k in ("sampler_s", "learner_s")}
    print(json.dumps({"bench": "strict_alignment", "model": name, "recipe": a.recipe, "device":
                      torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "dtype": dtype,
                      "threads": a.threads, "torch": torch.__version__, **out,
                      "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Throughput of ``eval run`` with the local engine (generated tokens/s), next to transformers' ``generate``.

Both sides sample the same chat-templated GSM8K prompts, in the same length-sorted batches, with the same
temperature / top-p / max_new_tokens, on the same random-weight Qwen3 model, in one process:

- ours: ``eval.runner.run_eval`` (LocalSampler generation + scoring + writing results); tokens/s is
  generated tokens over the generation time, and end-to-end tokens/s over the whole call;
- baseline: ``model.generate(do_sample=True, ...)`` on the same batches; generated tokens are counted up to
  and including the first EOS.

Model: ``--shape tiny`` (2 layers, hidden 64; the CPU default) or ``--shape qwen3-0.6b`` (28 layers, hidden
1024, Qwen3-0.6B's config; the CUDA default), random weights, the real Qwen3 tokenizer. Prints one JSON line
with the medians over ``--repeats`` runs (after one warm-up of each) and ``ratio = ours / baseline``.

    python scripts/bench_eval.py                        # CPU, tiny
    python scripts/bench_eval.py --device cuda --shape qwen3-0.6b --prompts 64 --max-new-tokens 256
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as `python scripts/bench_eval.py` from anywhere

QWEN3_06B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "tie_word_embeddings": True}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=("tiny", "qwen3-0.6b"), default=None)
    ap.add_argument("--prompts", type=int, default=None, help="GSM8K prompts (default 8 on CPU, 64 on CUDA)")
    ap.add_argument("--samples", type=int, default=1, help="k responses per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 32 on CPU, 256 on CUDA")
    ap.add_argument("--batch-size", type=int, default=None, help="default 8 on CPU, 64 on CUDA")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 3 on CPU, 20 on CUDA)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    shape = args.shape or ("qwen3-0.6b" if cuda else "tiny")
    n_prompts = args.prompts or (64 if cuda else 8)
    max_new = args.max_new_tokens or (256 if cuda else 32)
    bs = args.batch_size or (64 if cuda else 8)
    repeats = args.repeats or (20 if cuda else 3)

    from eval.engines import GenerationParams
    from eval.engines.base import render_prompt
    from eval.engines.local import LocalEngine
    from eval.runner import RunConfig, run_eval
    from rollout.models import stop_token_ids, tiny_random_qwen3

    dtype = "bfloat16" if cuda else "float32"
    model, tok = tiny_random_qwen3(ROOT / "tests" / "assets" / "qwen3_tokenizer", dtype=dtype,
                                   **(QWEN3_06B if shape == "qwen3-0.6b" else {}))
    model.to(args.device)
    engine = LocalEngine(model, tok, info={"model": f"random {shape}", "device": args.device})
    params = GenerationParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=max_new, seed=0,
                              batch_size=bs)
    out_dir = tempfile.mkdtemp(prefix="bench_eval_")
    cfg = RunConfig(model=f"random-{shape}", tasks=("gsm8k",), samples={"gsm8k": args.samples}, limit=n_prompts,
                    params=params, output_dir=out_dir)

    def ours() -> tuple[float, float, int]:
        _sync(args.device)
        t0 = time.perf_counter()
        res = run_eval(cfg, engine=engine, show_progress=False)
        _sync(args.device)
        total = time.perf_counter() - t0
        g = res["generation"]
        return g["tokens"] / g["seconds"], g["tokens"] / total, g["tokens"]

    # Baseline: transformers generate on the same prompts and batches (k copies adjacent, sorted by length).
    from eval.data import load_rows
    from eval.task import get_task

    task = get_task("gsm8k")
    exs = task.examples(load_rows(task))[:n_prompts]
    prompt_ids = [render_prompt(tok, e.prompt) for e in exs]
    items = sorted((len(p), i) for i, p in enumerate(prompt_ids) for _ in range(args.samples))
    stops = set(stop_token_ids(model, tok))
    pad = tok.pad_token_id

    @torch.no_grad()
    def baseline() -> tuple[float, int]:
        torch.manual_seed(0)
        tokens = 0
        _sync(args.device)
        t0 = time.perf_counter()
        for start in range(0, len(items), bs):
            batch = [prompt_ids[i] for _, i in items[start:start + bs]]
            L = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (L - len(p)) + p for p in batch], device=args.device)
            mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch], device=args.device)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=args.temperature > 0,
                                 temperature=args.temperature or None, top_p=args.top_p, top_k=0,
                                 max_new_tokens=max_new, pad_token_id=pad, eos_token_id=sorted(stops))
            for row in out[:, L:].tolist():
                n = 0
                for t in row:
                    n += 1
                    if t in stops:
                        break
                tokens += n
        _sync(args.device)
        return tokens / (time.perf_counter() - t0), tokens

    ours()
    baseline()  # warm-up both
    ours_runs, ours_e2e, hf_runs = [], [], []
    for _ in range(repeats):
        g, e2e, ours_tokens = ours()
        ours_runs.append(g)
        ours_e2e.append(e2e)
        b, hf_tokens = baseline()
        hf_runs.append(b)
    ours_med, hf_med = statistics.median(ours_runs), statistics.median(hf_runs)
    print(json.dumps({
        "bench": "eval_run_local_throughput", "device": torch.cuda.get_device_name() if cuda else "cpu",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "model": f"random-weight Qwen3 ({shape})",
        "dtype": dtype, "task": "gsm8k", "prompts": n_prompts, "samples": args.samples, "batch_size": bs,
        "max_new_tokens": max_new, "temperature": args.temperature, "top_p": args.top_p, "repeats": repeats,
        "ours_tokens_per_s": round(ours_med, 2), "ours_end_to_end_tokens_per_s": round(statistics.median(ours_e2e), 2),
        "hf_generate_tokens_per_s": round(hf_med, 2), "ratio": round(ours_med / hf_med, 3),
        "ours_tokens": ours_tokens, "hf_tokens": hf_tokens,
    }))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

"""One GRPO step (rollout + log-prob recompute + update + weight sync), BF16 vs NVFP4, side by side.

    python scripts/bench_trainer.py                       # CUDA: randomly initialised Qwen3-0.6B-shaped model
    python scripts/bench_trainer.py --device cpu --tiny --reps 1 --prompts 2 --n 2 --max-new-tokens 8   # smoke

Both precisions run the *training code path itself* (``trainers.engines.local.LocalTrainer.step``): our
KV-cache sampler, the chunked log-prob recompute, verl's GRPO advantages and policy loss, AdamW, and the
weight sync (re-quantization of the NVFP4 weight caches). The model is a random Qwen3 with Qwen3-0.6B's shapes
(28 layers, hidden 1024, MLP 3072, 16 query / 8 KV heads of 128, vocab 151,669, tied embeddings) in bf16,
tokenized with the real Qwen3 tokenizer (tests/assets/qwen3_tokenizer); both recipes start from the same
weights (seed). Generation ignores EOS (``--ignore-eos``, default on) so every sequence has the same length
and the two recipes do the same work. One warm-up step, then ``--reps`` timed steps; medians are reported.
Each phase is timed with device synchronisation around it (phases last seconds, so event resolution is moot).

Prints one JSON line: per recipe the median seconds of rollout / logprob / update / sync / step and tokens/s,
plus ``ratio`` = bf16 time / nvfp4 time (> 1 means NVFP4 is faster) for the step and each phase.
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True)
PHASES = ("timing/rollout_s", "timing/logprob_s", "timing/update_s", "timing/sync_s", "perf/step_s")


def parity_reward(data_source, solution_str, ground_truth, extra_info=None):
    """Deterministic reward with within-group variance, so the update has non-zero advantages."""
    return float(len(solution_str) % 2 == 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--recipes", default="bf16,nvfp4_per_token_bf16_bwd")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="auto", help="minite backend for the NVFP4 recipe")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="2-layer hidden-64 model (CPU smoke test)")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    a = ap.parse_args(argv)

    import torch

    from trainers.config import load_config
    from trainers.engines.local import LocalTrainer
    from trainers.models import tiny_random_qwen3

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available; run on a GPU or pass --device cpu --tiny"}))
        return 1
    shapes = {} if a.tiny else QWEN3_06B
    base, tok = tiny_random_qwen3(REPO / "tests" / "assets" / "qwen3_tokenizer", seed=0, dtype=a.dtype, **shapes)
    results: dict[str, dict] = {}
    for recipe in a.recipes.split(","):
        with tempfile.TemporaryDirectory() as out:
            cfg = load_config([
                "recipe=bf16", f"precision={recipe}", f"precision.backend={a.backend}", f"model.device={a.device}",
                f"model.dtype={a.dtype}", f"trainer.output_dir={out}", f"rollout.prompts_per_step={a.prompts}",
                f"rollout.n={a.n}", f"rollout.max_new_tokens={a.max_new_tokens}",
                f"algorithm.micro_batch_size={a.micro_batch}", "logger.progress=false", "logger.wandb.mode=disabled",
                "reward.fn=__main__:parity_reward", "data.arithmetic.levels=[3]", "optim.lr=1e-6"])
            model = copy.deepcopy(base)
            trainer = LocalTrainer(cfg, model_and_tokenizer=(model, tok))
            trainer.setup()
            if a.ignore_eos:
                trainer.sampler.default_stop_ids = ()
            rows = []
            for step in range(a.reps + 1):
                m = trainer.step(step)
                if step > 0:
                    rows.append(m)
            med = {k.split("/")[1]: statistics.median(r[k] for r in rows) for k in PHASES}
            med["response_tokens"] = statistics.median(r["perf/response_tokens"] for r in rows)
            med["tokens_per_s"] = med["response_tokens"] / med["step_s"]
            med["rollout_tokens_per_s"] = med["response_tokens"] / med["rollout_s"]
            med["abs_gap_mean"] = statistics.median(r["mismatch/abs_gap_mean"] for r in rows)
            med["precision"] = trainer.precision
            results[recipe] = med
            del trainer, model
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    names = list(results)
    out = {"bench": "trainer_step", "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
           "model": "tiny-qwen3" if a.tiny else "qwen3-0.6b-shape (random)", "dtype": a.dtype,
           "seqs": a.prompts * a.n, "max_new_tokens": a.max_new_tokens, "reps": a.reps,
           "torch": torch.__version__, "results": results,
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if len(names) == 2:
        b, q = results[names[0]], results[names[1]]
        out["ratio"] = {p: b[p] / q[p] if q[p] > 0 else None
                        for p in ("step_s", "rollout_s", "logprob_s", "update_s")}
        out["ratio_definition"] = f"{names[0]} seconds / {names[1]} seconds (> 1: {names[1]} faster)"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much each NVFP4 recipe variant costs the model: perplexity and greedy accuracy, one process.

For each variant (precision recipe x layers kept in BF16) the script loads the model afresh, patches it
with ``quantize_model`` and measures
  - per-token NLL / perplexity on GSM8K train text (question + worked answer, no chat template);
  - greedy accuracy on seeded arithmetic prompts per level (the trainer's prompt and reward);
  - mean reward of T=1 samples per level (what a GRPO sampler starts from).
It prints one JSON object and, with ``--markdown``, writes the table there.

    python scripts/nvfp4_variants.py --markdown benchmarks/learning/variants.md --json benchmarks/learning/variants.json
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollout.local import SamplingParams
from rollout.models import load_model_and_tokenizer
from rollout.select import make_sampler
from trainers.config import DataConfig
from trainers.data import GSM8K_TRAIN, arithmetic_examples, render_prompt
from trainers.rewards.registry import compute_score

#: (label, recipe or None for plain linears, model dtype, block indices kept in BF16)
VARIANTS = {
    "fp32": (None, "float32", ()),
    "bf16": (None, "bfloat16", ()),
    "w4a16_nvfp4": ("w4a16_nvfp4", "float32", ()),
    "w4a4 16x16 weights": ("nvfp4_per_token_bf16_bwd", "float32", ()),
    "w4a4 1x16 weights": ("nvfp4_per_token_w1x16_bf16_bwd", "float32", ()),
    "w4a4 1x16 + first/last block bf16": ("nvfp4_per_token_w1x16_bf16_bwd", "float32", (0, -1)),
    "w4a4 1x16 + 2 first/2 last bf16": ("nvfp4_per_token_w1x16_bf16_bwd", "float32", (0, 1, -2, -1)),
    "w4a4 16x16 + 2 first/2 last bf16": ("nvfp4_per_token_bf16_bwd", "float32", (0, 1, -2, -1)),
}
INSTRUCTION = "Give the result as a number."


def nll(model, tok, texts: list[str], device) -> tuple[float, int]:
    """Mean next-token NLL over the texts (each scored alone, no padding)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt")["input_ids"].to(device)
            logits = model(ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])
            total -= lp.sum().item()
            count += ids.shape[1] - 1
    return total / count, count


def accuracy(sampler, tok, level: int, n: int, params: SamplingParams, seed: int) -> float:
    data = DataConfig(instruction=INSTRUCTION)
    exs = arithmetic_examples(n, (level,), seed)
    comps = sampler.generate([render_prompt(tok, e, data) for e in exs], params)
    texts = [tok.decode(c.token_ids, skip_special_tokens=True) for c in comps]
    return sum(compute_score("arithmetic", t, e.answer) for t, e in zip(texts, exs)) / len(exs)


def run_variant(label: str, args, texts: list[str]) -> dict:
    recipe, dtype, keep = VARIANTS[label]
    model, tok = load_model_and_tokenizer(args.model, dtype=dtype, device=args.device)
    coverage = 0.0
    if recipe:
        from minite_kernels import quantize_model

        coverage = quantize_model(model, recipe, exclude=list(keep) or None).coverage
    t0 = time.perf_counter()
    mean_nll, tokens = nll(model, tok, texts, args.device)
    sampler = make_sampler(model, tok, engine="loop")
    stop = (tok.eos_token_id,)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, stop_token_ids=stop)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, stop_token_ids=stop, seed=1)
    row = {"variant": label, "recipe": recipe or "plain", "dtype": dtype, "bf16_blocks": list(keep),
           "coverage": round(coverage, 4), "nll": round(mean_nll, 4), "ppl": round(math.exp(mean_nll), 3),
           "tokens": tokens}
    for level in args.levels:
        row[f"greedy_L{level}"] = accuracy(sampler, tok, level, args.prompts, greedy, args.seed)
        row[f"t1_L{level}"] = accuracy(sampler, tok, level, args.prompts, sampled, args.seed)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def markdown(rows: list[dict], levels: list[int], meta: dict) -> str:
    head = ["variant", "recipe", "coverage", "ppl"] + [f"greedy L{k}" for k in levels] + [f"T=1 L{k}" for k in levels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["variant"], r["recipe"], f"{r['coverage']:.0%}", f"{r['ppl']:.2f}"]
        cells += [f"{r[f'greedy_L{k}']:.0%}" for k in levels] + [f"{r[f't1_L{k}']:.0%}" for k in levels]
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nModel {meta['model']}, {meta['tokens']} GSM8K-train tokens for perplexity, {meta['prompts']} "
            f"arithmetic prompts per level (seed {meta['seed']}, max {meta['max_new_tokens']} new tokens), "
            f"device {meta['device']}, torch {meta['torch']}, {meta['date']}. Coverage: quantized share of "
            "linear parameters (lm_head and embeddings stay BF16).\n")
    return "\n".join(lines) + "\n" + note


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated labels")
    ap.add_argument("--texts", type=int, default=48, help="GSM8K train rows for perplexity")
    ap.add_argument("--prompts", type=int, default=48, help="arithmetic prompts per level")
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=777, help="arithmetic seed (not the training seed 1234)")
    ap.add_argument("--markdown", type=pathlib.Path)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    labels = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in labels if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; valid: {list(VARIANTS)}")
    rows_in = [json.loads(line) for line in GSM8K_TRAIN.read_text(encoding="utf-8").splitlines()[:args.texts]]
    texts = [r["question"] + "\n" + r["answer"] for r in rows_in]
    torch.manual_seed(0)
    rows = [run_variant(v, args, texts) for v in labels]
    meta = {"model": args.model, "device": args.device, "torch": torch.__version__, "tokens": rows[0]["tokens"],
            "prompts": args.prompts, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
            "date": time.strftime("%Y-%m-%d")}
    out = {"meta": meta, "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(rows, args.levels, meta))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

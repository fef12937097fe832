"""Does the CUDA-graph sampler draw the same tokens when the same call runs again in one process?

The scenario of ``tests/rollout/test_graph_sampler.py::test_gpu_graph_replay_equals_eager_bf16_every_bucket``
(a tiny random Qwen3, 8 prompts, stop tokens chosen so that rows stop at different steps and the batch is
compacted through every bucket), run several times per engine setting: eager steps twice, then graph replay
twice. Prints one JSON line per setting with, for each pair of runs that differ, the rows, the first differing
token and the largest log-prob difference before it. The first setting is the first to meet each compiled
variant of the fused functions, so a difference only in its first run points at state that the first call
leaves behind (compilation, autotuning), not at graph capture.

    python scripts/check_rerun_determinism.py [--dtype bf16|fp32] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import types

import torch


def _tiny(dtype: torch.dtype, device: str):
    import transformers as tf

    cfg = tf.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=1, pad_token_id=0, bos_token_id=None, head_dim=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.Qwen3ForCausalLM(cfg)
    model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = 1
    return model, types.SimpleNamespace(pad_token_id=0, eos_token_id=1)


def _diff(a, b) -> list[dict]:
    rows = []
    for i, (x, y) in enumerate(zip(a, b)):
        pairs = list(zip(x.token_ids, y.token_ids))
        n = next((j for j, (u, v) in enumerate(pairs) if u != v), len(pairs))
        d = max([abs(u - v) for u, v in zip(x.logprobs[:n], y.logprobs[:n])] or [0.0])
        if n < max(len(x.token_ids), len(y.token_ids)) or d > 0:
            rows.append({"row": i, "first_diff": n, "max_dlogp_before": d})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    from rollout import GraphSampler, SamplingParams

    model, tok = _tiny(torch.bfloat16 if a.dtype == "bf16" else torch.float32, a.device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 512, (n,), generator=g).tolist() for n in (3, 1, 11, 2, 7, 5, 4, 9)]
    free = GraphSampler(model, tok, graphs=False).generate(prompts, SamplingParams(max_new_tokens=24, seed=2))
    stops = tuple(sorted({free[i].token_ids[3 * i] for i in range(7)} - set(free[7].token_ids)))
    settings = (("default", {}, stops), ("no_stops", {}, ()), ("unfused", {"fused": False}, stops),
                ("sdpa_attention", {"attention": "sdpa"}, stops), ("unpacked", {"pack": False}, stops))
    for name, kw, st in settings:
        params = SamplingParams(max_new_tokens=24, seed=2, stop_token_ids=st)
        runs = {}
        for label, graphs in (("eager1", False), ("eager2", False), ("graph1", True), ("graph2", True)):
            runs[label] = GraphSampler(model, tok, graphs=graphs, check_every=1, **kw).generate(prompts, params)
        rec = {"setting": name, "dtype": a.dtype}
        for x, y in (("eager1", "eager2"), ("graph1", "graph2"), ("eager2", "graph1"), ("eager1", "graph1")):
            rec[f"{x}_vs_{y}"] = _diff(runs[x], runs[y])
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

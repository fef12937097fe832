"""Does the CUDA-graph sampler draw the same tokens when the same call runs again in one process?

The scenario of ``tests/rollout/test_graph_sampler.py::test_gpu_graph_replay_equals_eager_bf16_every_bucket``
(a tiny random Qwen3, 8 prompts, stop tokens chosen so that rows stop at different steps and the batch is
compacted through every bucket), run several times per engine setting: eager steps twice, then graph replay
twice. Prints one JSON line per setting with, for each pair of runs that differ, the rows, the first differing
token and the largest log-prob difference before it. The first setting is the first to meet each compiled
variant of the fused functions, so a difference only in its first run points at state that the process's
first calls leave behind (which compiled entries exist), not at graph capture.

    python scripts/check_rerun_determinism.py [--dtype bf16|fp32] [--device cuda] [--dynamic] [--trace]

``--dynamic`` compiles the fused functions with ``dynamic=True`` (entries with overlapping guards: the first
run then differs on the H200) instead of the engine's static shapes. ``--trace`` runs only the first
setting's two eager engines, records the inputs and outputs of every call the step makes (fused functions,
attention, packed groups and the model's leaf modules, prefill included) and prints the first call whose
inputs agree between the two runs and whose outputs do not.
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


def _host(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, (tuple, list)):
        return [_host(y) for y in x]
    return repr(x)


def _same(a, b) -> bool:
    """Bit for bit (NaNs in the same places count as equal)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(_bits(a), _bits(b)))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _bits(x: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point() and x.element_size() in (2, 4, 8):
        return x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    return x


def _maxdiff(a, b) -> float:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.is_floating_point():
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    if isinstance(a, list) and isinstance(b, list):
        return max([_maxdiff(x, y) for x, y in zip(a, b)] or [0.0])
    return float("nan") if not _same(a, b) else 0.0


class _Recorder:
    """Every call's (name, inputs before, inputs after, outputs) while ``on``."""

    def __init__(self, limit: int = 2000) -> None:
        self.on, self.calls, self.limit, self._stack = False, [], limit, []

    def wrap(self, name, fn):
        def call(*args, **kw):
            if not self.on or len(self.calls) >= self.limit:
                return fn(*args, **kw)
            before = _host(args)
            out = fn(*args, **kw)
            self.calls.append((name, before, _host(args), _host(out)))
            return out
        return call

    def hook(self, model) -> None:
        leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
        for name, m in leaves:
            def pre(mod, args):
                if self.on:
                    self._stack.append(_host(args))

            def post(mod, args, out, name=name):
                if self.on:
                    before = self._stack.pop()
                    if len(self.calls) < self.limit:
                        self.calls.append((name, before, _host(args), _host(out)))
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)


def _trace(model, tok, prompts, stops) -> dict:
    """The first setting's eager1 and eager2, every call recorded; the first call that parts them."""
    from rollout import GraphSampler, SamplingParams, packed
    from rollout import attention as attn

    rec = _Recorder()
    rec.hook(model)
    attn.decode_attention = rec.wrap("decode_attention", attn.decode_attention)
    packed.Packed.__call__ = rec.wrap("Packed.__call__", packed.Packed.__call__)
    params = SamplingParams(max_new_tokens=24, seed=2, stop_token_ids=stops)
    runs, outs = [], []
    for _ in range(2):
        eng = GraphSampler(model, tok, graphs=False, check_every=1)
        if eng._fns is not None:
            eng._fns = {n: rec.wrap(n, f) for n, f in eng._fns.items()}
        rec.calls, rec.on = [], True
        outs.append(eng.generate(prompts, params))
        rec.on = False
        runs.append(rec.calls)
    a, b = runs
    res = {"calls": [len(a), len(b)], "tokens_differ": _diff(outs[0], outs[1]), "first_parting_call": None,
           "first_call_with_other_inputs": None}
    for i, (x, y) in enumerate(zip(a, b)):
        if x[0] != y[0]:
            res["first_parting_call"] = {"index": i, "names": [x[0], y[0]]}
            break
        if not _same(x[1], y[1]):
            if res["first_call_with_other_inputs"] is None:
                res["first_call_with_other_inputs"] = {"index": i, "name": x[0], "max_diff": _maxdiff(x[1], y[1])}
            continue
        if not (_same(x[2], y[2]) and _same(x[3], y[3])):
            res["first_parting_call"] = {"index": i, "name": x[0], "inputs_equal": True,
                                         "max_diff_out": _maxdiff(x[3], y[3]),
                                         "max_diff_args_after": _maxdiff(x[2], y[2]),
                                         "previous": [c[0] for c in a[max(0, i - 6):i]]}
            break
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dynamic", action="store_true", help="compile the fused functions with dynamic=True")
    p.add_argument("--trace", action="store_true", help="find the first call that parts eager1 from eager2")
    a = p.parse_args()
    from rollout import GraphSampler, SamplingParams, fused

    if a.dynamic:
        import functools

        @functools.cache
        def dynamic(name):
            fn = torch.compile(fused.FUNCTIONS[name], dynamic=True, fullgraph=True)

            def call(*args):
                with torch._dynamo.config.patch(recompile_limit=fused.RECOMPILE_LIMIT):
                    return fn(*args)
            return call
        fused.compiled = dynamic

    model, tok = _tiny(torch.bfloat16 if a.dtype == "bf16" else torch.float32, a.device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 512, (n,), generator=g).tolist() for n in (3, 1, 11, 2, 7, 5, 4, 9)]
    free = GraphSampler(model, tok, graphs=False).generate(prompts, SamplingParams(max_new_tokens=24, seed=2))
    stops = tuple(sorted({free[i].token_ids[3 * i] for i in range(7)} - set(free[7].token_ids)))
    if a.trace:
        print(json.dumps({"trace": _trace(model, tok, prompts, stops), "dtype": a.dtype, "dynamic": a.dynamic}),
              flush=True)
        return 0
    settings = (("default", {}, stops), ("no_stops", {}, ()), ("unfused", {"fused": False}, stops),
                ("sdpa_attention", {"attention": "sdpa"}, stops), ("unpacked", {"pack": False}, stops))
    for name, kw, st in settings:
        params = SamplingParams(max_new_tokens=24, seed=2, stop_token_ids=st)
        runs = {}
        for label, graphs in (("eager1", False), ("eager2", False), ("graph1", True), ("graph2", True)):
            runs[label] = GraphSampler(model, tok, graphs=graphs, check_every=1, **kw).generate(prompts, params)
        rec = {"setting": name, "dtype": a.dtype, "dynamic": a.dynamic}
        for x, y in (("eager1", "eager2"), ("graph1", "graph2"), ("eager2", "graph1"), ("eager1", "graph1")):
            rec[f"{x}_vs_{y}"] = _diff(runs[x], runs[y])
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One GRPO step (rollout, old log-probs, update, weight sync), BF16 vs NVFP4, side by side.

    python scripts/bench_trainer.py                       # CUDA: randomly initialised Qwen3-0.6B-shaped model
    python scripts/bench_trainer.py --shape 4b --fp4-weights auto   # Qwen3-4B shape (rollout.models.QWEN3_SHAPES)
    python scripts/bench_trainer.py --shape 4b --sequential --micro-batch 8   # one model on the GPU at a time
    python scripts/bench_trainer.py --device cpu --tiny --reps 1 --prompts 2 --n 2 --max-new-tokens 8   # smoke

Both precisions run the trainer's own components: its sampler (``--sampler``: ``auto`` is the CUDA-graph engine
on CUDA, ``loop`` the reference KV-cache loop), the
chunked log-probs (``trainers.learner.logprobs``; the old policy's from the update's own forward, as the trainer's
default ``algorithm.old_log_prob=auto``, or with ``--old-log-prob recompute`` from a no-gradient pass first;
``--old-log-prob auto,recompute`` times both as variants ``RECIPE/auto`` and ``RECIPE/recompute`` side by side;
micro-batches sized on the host as the trainer's, or with ``--select device`` from values read back from the GPU,
``--select host,device`` both as variants), AdamW
with gradient clipping, minite's
``quantize_model`` (the NVFP4 recipe patches every decoder linear; lm_head stays high precision, as in
training), and the weight sync (the re-quantization of the NVFP4 weight caches after the optimizer step: on CUDA with
Triton, ``ModelWeightSync`` into the buffers the sampler's graphs read, then, as the trainer, a 1-token forward for the
weights it does not cover, if any).
The loss is a token-mean importance-weighted policy-gradient surrogate on fixed +-1 advantages: its arithmetic
is negligible next to the forward/backward, and it keeps the benchmark free of verl/Ray, which the GPU
machine does not have. The model is a random Qwen3 with Qwen3-0.6B's shapes (28 layers, hidden 1024,
MLP 3072, 16 query / 8 KV heads of 128, vocab 151,936 as in its config, tied embeddings) in bf16, tokenized with the real
Qwen3 tokenizer (tests/assets/qwen3_tokenizer); both recipes start from the same weights. EOS is ignored so
both recipes generate the same number of tokens. Every recipe's model stays in memory: ``--warmup`` untimed
steps each (default 2), then ``--reps`` timed steps, each running every recipe once in an order that rotates from
step to step
(``timed_orders`` in the JSON), so that machine drift and the position in the process fall on all recipes alike;
medians are reported. With ``--sequential`` only one recipe's model is on the device at a time, as in a trainer
(at 4B two models and their AdamW leave an 80 GB GPU room for micro-batch 4 only): the base weights wait in host
memory, and each of ``--rounds`` rounds builds every recipe's model, sampler and optimizer from them in turn,
warms it up, times ``--reps`` steps and frees it; the order alternates between rounds (A B, B A, ...) and step k
of a round draws with the same seed for every recipe. Each phase is timed with device synchronisation around it
(phases last seconds).

Prints one JSON line: per recipe the median seconds of rollout / logprob / update / sync / step, tokens/s and
the sampler-vs-learner mean |gap|, plus ``ratio[recipe]`` = the first recipe's seconds / that recipe's seconds
(> 1: that recipe is faster than the first, by default bf16). ``--profile DIR`` adds one more step with every phase
under torch.profiler (``scripts/profile_table.py``): GPU time per kernel and the GPU-busy fraction of each
phase, so a ratio can be traced to the kernels (or the host time) behind it. ``--host-profile``,
``--sync-report`` and ``--alloc-report`` add a step under cProfile, under CUDA's sync debug mode (where the host
waits) and with the allocator's history recorded (where it calls ``cudaMalloc`` / ``cudaFree``). Profiled steps
are not timed, and they run after every timed step: a profiler session slows what the process runs after it.
``--pdl`` runs the whole benchmark with programmatic dependent launch on (``MINITE_TRITON_PDL=on``; ``"pdl": true``
in the JSON line).
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
#: where the update's old log-probs come from (the trainer's algorithm.old_log_prob)
OLD_LOG_PROB = ("auto", "recompute")
#: how the learner's passes size a micro-batch: from the batch's host layout (the trainer's), or from values read
#: back from the GPU (its rows, padding and response count: waits at every micro-batch, as before 2026-12-07)
SELECT = ("host", "device")
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from profile_table import profiled


def host_top(fn, n: int = 25) -> tuple:
    """(``fn()``, its ``n`` costliest Python functions by cumulative and by own host time under cProfile): where a
    phase's host time goes when the GPU waits for it."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    out = pr.runcall(fn)
    st = pstats.Stats(pr).stats

    def name(k):
        f, line, func = k
        return f"{f.split('site-packages/')[-1].replace(str(REPO) + '/', '')}:{line}({func})"

    def top(i):
        rows = sorted(st.items(), key=lambda kv: -kv[1][i])[:n]
        return [{"fn": name(k), "calls": v[1], "s": round(v[i], 5)} for k, v in rows]

    return out, {"cumulative": top(3), "own": top(2)}


def sync_points(device, fn, n: int = 20) -> tuple:
    """(``fn()``, ``{"wall_s", "syncs", "where"}``): ``fn`` run with CUDA's sync debug mode at ``warn``, which
    warns at every operation that makes the host wait for the GPU (``.item()``, a blocking copy, a boolean
    mask's size, ...). ``where`` counts them by their innermost frames in this repository or a library
    (``file:line``, up to 3 deep), most frequent first: where a phase stops the host from running ahead of the
    GPU. On a CPU device there is nothing to wait for: ``syncs`` is None."""
    import traceback
    import warnings
    from collections import Counter

    import torch

    if device.type != "cuda":
        t0 = time.perf_counter()
        out = fn()
        return out, {"wall_s": time.perf_counter() - t0, "syncs": None, "where": []}
    where: Counter = Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings.py" not in f.filename][-3:]
        where[" <- ".join(f"{f.filename.split('site-packages/')[-1].replace(str(REPO) + '/', '')}:{f.lineno}"
                          for f in reversed(frames))] += 1

    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    return out, {"wall_s": wall, "syncs": sum(where.values()),
                 "where": [{"at": k, "n": v} for k, v in where.most_common(n)]}


#: the caching allocator's device-memory events (``torch.cuda.memory._snapshot``'s trace actions): a segment is
#: one ``cudaMalloc`` (``segment_alloc``) or ``cudaFree`` (``segment_free``, a device synchronization); ``map`` /
#: ``unmap`` are their expandable-segments counterparts; ``oom`` a request the device could not serve
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")


def _site(frames: list[dict], depth: int = 3) -> str:
    """Where a memory event came from: its innermost ``depth`` Python frames outside torch (``file:line``,
    innermost first; the snapshot lists a stack innermost first), or its innermost frames if all are torch's."""
    own = [f for f in frames if "/torch/" not in f.get("filename", "")] or frames
    return " <- ".join(f"{f['filename'].split('site-packages/')[-1].replace(str(REPO) + '/', '')}:{f['line']}"
                       for f in own[:depth])


def segment_sites(trace: list[dict], n: int = 20) -> dict:
    """Count the allocator's segment events of one device trace: per action the number and MB, and the ``n``
    costliest (action, call site) pairs by count. New segments in a step that repeats mean requests the cache
    could not serve; freed ones, that the allocator released cached memory to serve another request.

    >>> segment_sites([{"action": "segment_free", "size": 2 << 20, "frames": [
    ...     {"filename": "/x/torch/cuda/memory.py", "line": 9}, {"filename": "/x/rollout/a.py", "line": 7}]},
    ...     {"action": "alloc", "size": 512, "frames": []}])["where"]
    [{'action': 'segment_free', 'at': '/x/rollout/a.py:7', 'n': 1, 'mb': 2.0}]
    """
    from collections import Counter

    totals = {a: {"n": 0, "mb": 0.0} for a in SEGMENT_ACTIONS}
    count: Counter = Counter()
    size: Counter = Counter()
    for ev in trace:
        action = ev.get("action")
        if action not in totals:
            continue
        mb = ev.get("size", 0) / 2**20
        totals[action]["n"] += 1
        totals[action]["mb"] += mb
        key = (action, _site(ev.get("frames") or []))
        count[key] += 1
        size[key] += mb
    return {"segments": {a: {"n": t["n"], "mb": round(t["mb"], 1)} for a, t in totals.items() if t["n"]},
            "where": [{"action": a, "at": at, "n": c, "mb": round(size[(a, at)], 1)}
                      for (a, at), c in count.most_common(n)]}


def alloc_points(device, fn, n: int = 20) -> tuple:
    """(``fn()``, ``{"wall_s", "segments", "where"}``): ``fn`` run with the caching allocator's history recorded
    (Python stacks of every allocation and free), then :func:`segment_sites` of its segment events: how often and
    where a phase made the allocator call ``cudaMalloc`` / ``cudaFree``. On a CPU device there is no allocator
    to ask: ``segments`` is None."""
    import torch

    if device.type != "cuda":
        t0 = time.perf_counter()
        out = fn()
        return out, {"wall_s": time.perf_counter() - t0, "segments": None, "where": []}
    torch.cuda.synchronize(device)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", device=device,
                                             clear_history=True)
    t0 = time.perf_counter()
    try:
        out = fn()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        snap = torch.cuda.memory._snapshot(device)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return out, {"wall_s": wall} | segment_sites(snap["device_traces"][index], n)


def _timed(store: dict, key: str, device, fn, profile: tuple | None = None):
    """Run ``fn`` and store its wall seconds under ``key``; with ``profile = (dir, tag)`` under the profiler,
    its summary under ``store["profile"][key]``; with ``profile = ("host", tag)`` under cProfile, its costliest
    Python functions under ``store["host_profile"][key]``; with ``profile = ("sync", tag)`` with CUDA's sync
    debug mode on, where the host waited under ``store["sync_points"][key]``; with ``profile = ("alloc", tag)``
    with the allocator's history recorded, where it called ``cudaMalloc`` / ``cudaFree`` under
    ``store["alloc_points"][key]`` (a profiled step is not a timed one: profilers cost time)."""
    import torch

    if profile is not None and profile[0] in ("sync", "alloc"):
        out, report = (sync_points if profile[0] == "sync" else alloc_points)(device, fn)
        store[key] = report.pop("wall_s")
        store.setdefault(f"{profile[0]}_points", {})[key] = report
        return out
    if profile is not None and profile[0] == "host":
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out, tops = host_top(fn)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        store[key] = time.perf_counter() - t0
        store.setdefault("host_profile", {})[key] = tops
        return out
    if profile is not None:
        out, summary = profiled(device, fn, profile[0], f"{profile[1]}_{key.removesuffix('_s')}")
        store[key] = summary["wall_s"]
        store.setdefault("profile", {})[key] = {k: v for k, v in summary.items() if k != "kernels"} | {
            "top": summary["kernels"][:12]}
        return out
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = _alloc_counts(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    store[key] = time.perf_counter() - t0
    if device.type == "cuda":  # cudaMalloc / cudaFree calls of the caching allocator during the phase
        after = _alloc_counts(device)
        store.setdefault("alloc_retries", {})[key] = after[0] - before[0]
        store.setdefault("device_allocs", {})[key] = [after[1] - before[1], after[2] - before[2]]
    return out


def _alloc_counts(device) -> tuple[int, int, int]:
    """The caching allocator's counters: retries (it freed its cache and tried ``cudaMalloc`` again, a device
    sync), ``cudaMalloc`` calls, ``cudaFree`` calls. New segments in a timed phase mean allocations the cache
    could not serve (shapes that change between micro-batches fragment it)."""
    import torch

    s = torch.cuda.memory_stats(device)
    return s.get("num_alloc_retries", 0), s.get("num_device_alloc", 0), s.get("num_device_free", 0)


def one_step(model, tok, sampler, prompts, params, opt, *, micro: int, patched: bool, seed: int,
             weight_sync=None, profile: tuple | None = None, micro_tokens: int = 0, logprob_micro: int = 0,
             old_from_update: bool = False, select: str = "host") -> dict:
    import torch

    from trainers.learner.batch import collate, micro_batches
    from trainers.learner.logprobs import response_logprobs

    dev = next(model.parameters()).device
    t: dict = {}
    model.eval()
    comps = _timed(t, "rollout_s", dev, lambda: sampler.generate(prompts, params), profile)
    b = collate(comps, sampler.pad_id, dev)
    B, R = b.response_mask.shape
    g = torch.Generator().manual_seed(seed)
    adv = (torch.randint(0, 2, (B, 1), generator=g).float() * 2 - 1).to(dev)
    ntok = b.response_mask.sum()
    chunks = micro_batches(b, torch.arange(B, device=dev), micro, micro_tokens)
    # the recompute's own micro-batches, by the trainer's rule (AlgorithmConfig.log_prob_micro): its own rows, the
    # update's token budget; 0: the update's micro-batches
    lp_chunks = (micro_batches(b, torch.arange(B, device=dev), logprob_micro, micro_tokens) if logprob_micro
                 else chunks)

    def forward(rows, with_entropy: bool):
        """(sub-batch, log-probs) of a micro-batch. ``host`` (the trainer's): sized from the batch's host layout,
        which the log-prob pass also takes (transformers' mask made by it, the response positions by count); nothing
        is read back from the GPU. ``device``: the rows, the padding and the response count read back from the GPU,
        each a wait for the work queued before it."""
        if select == "host":
            sub = b.select(rows)
            facts = {"response_tokens": sub.num_tokens, "padded": sub.padded()}
        else:
            sub, facts = b.select(rows.index), {}
        lp, _ = response_logprobs(model, sub.input_ids, sub.attention_mask, sub.response_mask,
                                  prompt_len=sub.prompt_len, with_entropy=with_entropy, **facts)
        return sub, lp

    def recompute():
        old = torch.zeros(B, R, device=dev)
        with torch.no_grad():
            for rows in lp_chunks:
                _, lp = forward(rows, False)
                old[rows.index, :lp.shape[1]] = lp
        return old

    if old_from_update:  # as the trainer's algorithm.old_log_prob=auto: the update's forward gives them
        old = torch.zeros(B, R, device=dev)
        t["logprob_s"] = 0.0
    else:
        old = _timed(t, "logprob_s", dev, recompute, profile)

    def update():
        model.train()
        opt.zero_grad(set_to_none=True)
        for rows in chunks:
            # the trainer's update computes the entropies too where its forward stands in for the recompute
            sub, lp = forward(rows, old_from_update)
            r = sub.response_mask.shape[1]
            if old_from_update:
                old[rows.index, :r] = lp.detach()
            ratio = torch.exp(lp - old[rows.index, :r])
            loss = -(adv[rows.index] * ratio * sub.response_mask).sum() / ntok
            float(loss.detach())  # as the trainer's loss metrics (verl's policy loss reads its own back) before backward
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()

    _timed(t, "update_s", dev, update, profile)

    def sync():
        if patched:  # as the trainer: grouped re-quantization, then a 1-token forward for what is left
            weight_sync()

    _timed(t, "sync_s", dev, sync, profile)
    if dev.type == "cuda":
        t["peak_gb"] = torch.cuda.max_memory_allocated(dev) / 1e9
        t["peak_reserved_gb"] = torch.cuda.max_memory_reserved(dev) / 1e9
    t["step_s"] = sum(t[k] for k in ("rollout_s", "logprob_s", "update_s", "sync_s"))
    t["response_tokens"] = float(ntok)
    t["abs_gap_mean"] = float(((old - b.sampler_logp).abs() * b.response_mask).sum() / ntok)
    return t


def _variant(name: str, a) -> tuple[str, str, str]:
    """(recipe, old-log-prob mode, select) of a variant name: ``RECIPE[/MODE][/SELECT]``, with a part only where
    its option lists several values; the others take the option's one value."""
    recipe, *parts = name.split("/")
    mode = next((p for p in parts if p in OLD_LOG_PROB), a.old_log_prob)
    return recipe, mode, next((p for p in parts if p in SELECT), a.select)


def _setup(name: str, base, tok, dev, a, last: bool = False) -> dict:
    """One variant's model (a copy of ``base``, or ``base`` itself for the ``last`` one set up: one model less
    in memory; quantized unless bf16), sampler, optimizer and weight sync."""
    import torch

    from rollout import make_sampler
    from rollout.precision import Requantizer

    recipe, mode, select = _variant(name, a)
    model = base if last else copy.deepcopy(base).to(dev)  # the last recipe set up trains ``base`` itself
    precision: dict = {"recipe": recipe, "patched": False}
    if recipe != "bf16":
        from minite_kernels import quantize_model

        rep = quantize_model(model, recipe, backend=a.backend)
        precision = {"recipe": rep.recipe, "patched": True, "backend": rep.backend,
                     "quantized_layers": len(rep.swapped), "coverage": rep.coverage}
    sampler = make_sampler(model, tok, engine=a.sampler, norm_quant=a.norm_quant if precision["patched"] else "off",
                           fp4_weights=a.fp4_weights)
    if a.ignore_eos:
        sampler.default_stop_ids = ()
    weight_sync = Requantizer(model, sampler.pad_id) if precision["patched"] else None
    return {"model": model, "sampler": sampler, "opt": torch.optim.AdamW(model.parameters(), lr=1e-6),
            "weight_sync": weight_sync, "precision": precision, "old_log_prob": mode, "select": select}


def move_optimizer_state(opt, device) -> None:
    """Move the optimizer's per-parameter tensors (AdamW's two moments; its scalar ``step`` stays) to ``device``.
    With ``--offload-idle`` the recipes not stepping keep theirs in host memory, outside the timed phases."""
    import torch

    for state in opt.state.values():
        for k, v in state.items():
            if torch.is_tensor(v) and v.dim() > 0 and v.device != torch.device(device):
                state[k] = v.to(device)


def _activate(runs: dict, recipe: str, dev, offload: bool) -> None:
    """Before ``recipe`` steps: its weight sync once more (untimed) if another recipe's optimizer stepped since
    its own sync, which expired its quantized-weight caches (``minite_kernels.modules.weight_cache``): no
    single-model trainer pays that; with ``offload``, every other recipe's optimizer state to the host, its own
    to ``dev``; then the GPU's peak-memory counter restarts, so each step's peak is its own."""
    import torch

    from minite_kernels.modules.weight_cache import optimizer_epoch

    run = runs[recipe]
    if run["weight_sync"] is not None and run.get("synced_at", optimizer_epoch()) != optimizer_epoch():
        run["weight_sync"]()
    if offload:
        for name, other in runs.items():
            if name != recipe:
                move_optimizer_state(other["opt"], "cpu")
        move_optimizer_state(run["opt"], dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def _captures(sampler) -> int:
    """The sampler's CUDA-graph captures so far (0 for a sampler without graphs)."""
    return getattr(sampler, "stats", {}).get("captures", 0)


def _step(run: dict, tok, prompts, params, a, seed: int, profile: tuple | None = None) -> dict:
    from minite_kernels.modules.weight_cache import optimizer_epoch

    before = _captures(run["sampler"])
    out = one_step(run["model"], tok, run["sampler"], prompts, params, run["opt"], micro=a.micro_batch,
                   micro_tokens=a.micro_batch_tokens, patched=run["precision"]["patched"], seed=seed,
                   weight_sync=run["weight_sync"], profile=profile, logprob_micro=a.logprob_micro_batch,
                   old_from_update=run["old_log_prob"] == "auto", select=run["select"])
    run["synced_at"] = optimizer_epoch()  # the step ends with its optimizer step, then its weight sync
    # a capture in a timed step is set-up work (and torch.cuda.graph empties the allocator's cache, which the
    # next phases then refill with cudaMalloc): the JSON's ``captures`` counts them, to be 0 with enough warm-up
    out["captures"] = _captures(run["sampler"]) - before
    return out


def _free(run: dict, dev) -> None:
    """Drop a recipe's model, sampler and optimizer and hand their device memory back (``--sequential``)."""
    import gc

    import torch

    run.clear()
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def _sequential_rounds(names, base, tok, dev, prompts, a) -> tuple[dict, dict, list]:
    """``--sequential``: per round, each recipe alone on the device (set up, ``--warmup`` untimed steps, ``--reps``
    timed steps, freed). Then, with ``--profile`` / ``--host-profile`` / ``--sync-report`` / ``--alloc-report``,
    one more pass: each recipe set up again, its warm-up steps, its profiled steps, freed. Returns the timed rows
    per recipe, each recipe's precision, sampler description and profiles, and the order of every round.

    The profilers run after every timed step because a profiler session slows what the process runs after it: on
    an H100 a recipe timed after another one's profiled step ran its update 8-29% slower (``benchmarks/RESULTS.md``,
    2026-12-07 07:57)."""
    from rollout import SamplingParams

    rows: dict[str, list] = {recipe: [] for recipe in names}
    last: dict[str, dict] = {}
    orders = []
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        orders.append(list(order))
        for recipe in order:
            run = _setup(recipe, base, tok, dev, a)
            for k in range(a.warmup + a.reps):
                seed = r * (a.warmup + a.reps) + k
                _activate({recipe: run}, recipe, dev, False)
                m = _step(run, tok, prompts, SamplingParams(max_new_tokens=a.max_new_tokens, seed=seed), a, seed)
                if k >= a.warmup:
                    rows[recipe].append(m)
            last[recipe] = {"precision": run["precision"], "sampler": run["sampler"].describe()}
            _free(run, dev)
    if a.profile or a.host_profile or a.sync_report or a.alloc_report:
        seed = a.rounds * (a.warmup + a.reps)
        for recipe in names:
            run = _setup(recipe, base, tok, dev, a)
            _activate({recipe: run}, recipe, dev, False)
            for k in range(a.warmup):
                _step(run, tok, prompts, SamplingParams(max_new_tokens=a.max_new_tokens, seed=seed + k), a, seed + k)
            last[recipe] |= _profiled_steps(run, recipe, dev, a, tok, prompts, seed_from=seed + a.warmup)
            _free(run, dev)
    return rows, last, orders


def _profiled_steps(run, recipe, dev, a, tok, prompts, *, seed_from: int, runs: dict | None = None) -> dict:
    """With ``--profile`` / ``--host-profile`` / ``--sync-report`` / ``--alloc-report``, one more step of
    ``recipe`` under each profiler (not timed): ``{"profile": ..., "host_profile": ..., "sync_points": ...,
    "alloc_points": ...}`` as present."""
    from rollout import SamplingParams

    out = {}
    extra = [(a.profile, recipe.replace("/", "-"))] if a.profile else []  # the tag names the kernel-table files
    extra += [("host", recipe)] if a.host_profile else []
    extra += [("sync", recipe)] if a.sync_report else []
    extra += [("alloc", recipe)] if a.alloc_report else []
    for i, prof in enumerate(extra):
        seed = seed_from + i
        _activate(runs if runs is not None else {recipe: run}, recipe, dev, a.offload_idle and runs is not None)
        m = _step(run, tok, prompts, SamplingParams(max_new_tokens=a.max_new_tokens, seed=seed), a, seed, prof)
        key = {"host": "host_profile", "sync": "sync_points", "alloc": "alloc_points"}.get(prof[0], "profile")
        out[key] = m[key]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--recipes", default="bf16,nvfp4_per_token_bf16_bwd",
                    help="comma-separated; the first is the baseline of the ratios")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--micro-batch-tokens", type=int, default=0,
                    help="token budget per micro-batch as the trainer's algorithm.micro_batch_tokens (0: rows only)")
    ap.add_argument("--logprob-micro-batch", type=int, default=0,
                    help="rows per micro-batch of the no-gradient log-prob recompute, as the trainer's "
                         "algorithm.log_prob_micro_batch_size (0: --micro-batch's micro-batches)")
    ap.add_argument("--old-log-prob", default="auto",
                    help="as the trainer's algorithm.old_log_prob: auto (this update is one epoch of one mini-batch) "
                         "takes the old log-probs from the update's forward, no recompute; recompute: the "
                         "no-gradient pass first; several, comma-separated: each recipe once per mode, as variants "
                         "RECIPE/MODE timed side by side")
    ap.add_argument("--select", default="host",
                    help="how the learner's passes size each micro-batch: host (the trainer's: from the batch's host "
                         "layout, no wait for the GPU) or device (its rows, padding and response count read back from "
                         "the GPU); both, comma-separated: variants RECIPE/SELECT timed side by side")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps per recipe (per round with --sequential) before the timed ones: the first "
                         "compiles and captures; the NVFP4 sampler re-captures its decode graph once more after the "
                         "first weight sync (results' captures counts captures in timed steps)")
    ap.add_argument("--backend", default="auto", help="minite backend for the NVFP4 recipe")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="2-layer hidden-64 model (CPU smoke test)")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    ap.add_argument("--sampler", default="auto", choices=("auto", "graph", "loop"))
    ap.add_argument("--profile", default=None,
                    help="directory: after the timed steps, one more step with each phase under the profiler "
                         "(kernel tables in DIR/profile_<recipe>_<phase>.json, summaries in the JSON line)")
    ap.add_argument("--norm-quant", default="auto", choices=("auto", "on", "off"),
                    help="the NVFP4 recipes' graph engine's norm_quant, as the trainer's rollout.norm_quant (the norm "
                         "makes the packed projections' quantized activation operand)")
    ap.add_argument("--shape", default="0.6b", help="Qwen3 shape of the random model (rollout.models.QWEN3_SHAPES)")
    ap.add_argument("--fp4-weights", default="auto", choices=("auto", "on", "off"),
                    help="the NVFP4 recipes' sampler: FP4-weight GEMMs where the table prefers them, everywhere, or "
                         "none (cuBLAS on BF16 dequantized weights)")
    ap.add_argument("--host-profile", action="store_true",
                    help="after the timed steps, one more step with each phase under cProfile: the costliest Python "
                         "functions per phase in the JSON line (host_profile)")
    ap.add_argument("--sync-report", action="store_true",
                    help="after the timed steps, one more step with CUDA's sync debug mode on: per phase, how often "
                         "and where (file:line of the Python caller) the host waited for the GPU (sync_points)")
    ap.add_argument("--alloc-report", action="store_true",
                    help="after the timed steps, one more step with the allocator's history recorded: per phase, how "
                         "many device segments it allocated and freed (cudaMalloc / cudaFree) and where (alloc_points)")
    ap.add_argument("--offload-idle", action="store_true",
                    help="keep only the stepping recipe's optimizer state on the GPU, the others' in host memory "
                         "(moved between steps, not timed): two 4B models with their AdamW then fit one 80 GB GPU")
    ap.add_argument("--sequential", action="store_true",
                    help="one recipe's model on the device at a time (rebuilt from host-memory weights each round; "
                         "the order alternates between rounds): larger micro-batches fit, as in a trainer")
    ap.add_argument("--rounds", type=int, default=2, help="--sequential: rounds of every recipe (default 2)")
    ap.add_argument("--pdl", action="store_true",
                    help="programmatic dependent launch on for the whole process (set_options(pdl='on'), i.e. "
                         "MINITE_TRITON_PDL=on): the decode step's kernels overlap their predecessors (sm_90+)")
    a = ap.parse_args(argv)
    if a.sequential and a.offload_idle:
        ap.error("--sequential keeps one recipe on the device at a time; --offload-idle is for the interleaved mode")
    if a.warmup < 1:
        ap.error(f"--warmup must be >= 1 (the first step of a recipe compiles and captures), got {a.warmup}")
    if a.logprob_micro_batch < 0:
        ap.error(f"--logprob-micro-batch must be >= 0 (0: --micro-batch's micro-batches), got {a.logprob_micro_batch}")
    modes = a.old_log_prob.split(",")
    bad = [m for m in modes if m not in OLD_LOG_PROB]
    if bad or len(set(modes)) < len(modes):
        ap.error(f"--old-log-prob {a.old_log_prob!r}: give each of {', '.join(OLD_LOG_PROB)} at most once, "
                 "comma-separated")
    selects = a.select.split(",")
    if any(s not in SELECT for s in selects) or len(set(selects)) < len(selects):
        ap.error(f"--select {a.select!r}: give each of {', '.join(SELECT)} at most once, comma-separated")
    if a.rounds < 1 or a.reps < 1:
        ap.error(f"--rounds and --reps must be >= 1, got {a.rounds} and {a.reps}")
    from rollout.models import QWEN3_SHAPES

    if a.shape not in QWEN3_SHAPES:
        ap.error(f"unknown --shape {a.shape!r}; valid: {', '.join(QWEN3_SHAPES)}")
    if not a.pdl:
        return _bench(a, modes, selects)
    from minite_kernels.options import set_options

    previous = set_options(pdl="on")  # the process default: every thread, every launch from here on
    try:
        return _bench(a, modes, selects)
    finally:
        set_options(**previous.to_dict())


def _bench(a, modes: list[str], selects: list[str]) -> int:
    """The benchmark itself, for the parsed and checked arguments (``main``)."""
    import torch

    from rollout import SamplingParams
    from rollout.models import QWEN3_SHAPES, tiny_random_qwen3
    from trainers.config import DataConfig
    from trainers.data import arithmetic_examples, render_prompt

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available; run on a GPU or pass --device cpu --tiny"}))
        return 1
    dev = torch.device(a.device)
    shapes = {} if a.tiny else QWEN3_SHAPES[a.shape]
    base, tok = tiny_random_qwen3(REPO / "tests" / "assets" / "qwen3_tokenizer", seed=0, dtype=a.dtype,
                                  device=dev, **shapes)
    examples = arithmetic_examples(a.prompts, (3,), seed=0)
    prompts = [render_prompt(tok, ex, DataConfig()) for ex in examples for _ in range(a.n)]
    names = a.recipes.split(",")
    if len(modes) > 1:
        names = [f"{recipe}/{mode}" for recipe in names for mode in modes]
    if len(selects) > 1:
        names = [f"{name}/{s}" for name in names for s in selects]
    results: dict[str, dict] = {}
    if a.sequential:
        base = base.to("cpu")  # made on the device (fast), waiting in host memory between rounds
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rows, last, orders = _sequential_rounds(names, base, tok, dev, prompts, a)
        for recipe in names:
            results[recipe] = _summary(rows[recipe]) | last[recipe]
        return _report(a, dev, names, results, orders)
    runs = {recipe: _setup(recipe, base, tok, dev, a, last=i == len(names) - 1) for i, recipe in enumerate(names)}
    rows: dict[str, list] = {recipe: [] for recipe in names}
    orders: list[list[str]] = []
    # the first --warmup steps warm every recipe up (captures, compiles, autotuning, the first weight sync's
    # buffers); the next --reps are timed, interleaved: each step runs every recipe once, in an order that rotates
    # from step to step, so that a slow patch of the machine or a position in the process (first or second model on
    # the GPU) does not land on one recipe only
    for step in range(a.warmup + a.reps):
        params = SamplingParams(max_new_tokens=a.max_new_tokens, seed=step)
        timed = step >= a.warmup
        k = (step - a.warmup + 1) % len(names) if timed else 0
        order = names[k:] + names[:k]
        for recipe in order:
            _activate(runs, recipe, dev, a.offload_idle)
            m = _step(runs[recipe], tok, prompts, params, a, step)
            if timed:
                rows[recipe].append(m)
        if timed:
            orders.append(order)
    for recipe in names:
        run = runs[recipe]
        extra = _profiled_steps(run, recipe, dev, a, tok, prompts, seed_from=a.warmup + a.reps, runs=runs)
        results[recipe] = _summary(rows[recipe]) | extra | {"precision": run["precision"],
                                                            "sampler": run["sampler"].describe()}
    return _report(a, dev, names, results, orders)


def _summary(rows: list[dict]) -> dict:
    """Medians over a recipe's timed steps (graph captures and allocator counters summed), and tokens/s."""
    counts = ("alloc_retries", "device_allocs", "captures")
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0] if key not in counts}
    med["captures"] = sum(r["captures"] for r in rows)
    if "alloc_retries" in rows[0]:
        med["alloc_retries"] = {p: sum(r["alloc_retries"][p] for r in rows) for p in rows[0]["alloc_retries"]}
        med["device_allocs"] = {p: [sum(r["device_allocs"][p][i] for r in rows) for i in (0, 1)]
                                for p in rows[0]["device_allocs"]}
    med["tokens_per_s"] = med["response_tokens"] / med["step_s"]
    med["rollout_tokens_per_s"] = med["response_tokens"] / med["rollout_s"]
    return med


def _report(a, dev, names: list[str], results: dict, orders: list) -> int:
    import torch

    out = {"bench": "trainer_step", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "model": "tiny-qwen3" if a.tiny else f"qwen3-{a.shape}-shape (random)", "dtype": a.dtype,
           "fp4_weights": a.fp4_weights, "pdl": a.pdl,
           "seqs": a.prompts * a.n, "max_new_tokens": a.max_new_tokens, "warmup": a.warmup, "reps": a.reps,
           "micro_batch": a.micro_batch, "micro_batch_tokens": a.micro_batch_tokens,
           "logprob_micro_batch": a.logprob_micro_batch or None, "old_log_prob": a.old_log_prob, "select": a.select,
           "torch": torch.__version__,
           "offload_idle": a.offload_idle, "sequential": a.sequential, "rounds": a.rounds if a.sequential else None,
           "timed_orders": orders, "results": results,
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if len(names) >= 2:
        b = results[names[0]]
        out["ratio"] = {n: {p: b[p] / results[n][p] if results[n][p] > 0 else None
                            for p in ("step_s", "rollout_s", "logprob_s", "update_s")} for n in names[1:]}
        out["ratio_definition"] = f"{names[0]} seconds / the recipe's seconds (> 1: the recipe is faster)"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

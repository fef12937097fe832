"""Rollout throughput, side by side in one process on the same model and prompts.

    python scripts/bench_rollout.py                      # CUDA: random Qwen3-0.6B-shaped model, 64 x 256 tokens
    python scripts/bench_rollout.py --shape 4b --variants graph_bf16,graph_nvfp4,graph-deqw_nvfp4
    python scripts/bench_rollout.py --device cpu --tiny --seqs 4 --max-new-tokens 8 --variants graph_bf16,loop_bf16

Variants (``--variants``, comma-separated):

- ``graph_bf16`` / ``graph_nvfp4``: the CUDA-graph engine (``rollout.graph_sampler``), the model in
  bf16 / with ``nvfp4_per_token_bf16_bwd`` linears (minite's Triton backend on CUDA);
- ``graph-sdpa_*``: the engine with SDPA attention (a boolean mask over length buckets) instead of the
  Triton decode-attention kernel; ``graph-nopack_*``: without packed q/k/v and gate/up GEMMs;
  ``graph-nq_nvfp4``: the packed NVFP4 groups' X̂ made by the norm before them (``norm_quant=True``),
  ``graph-nonq_nvfp4`` never (``False``); ``graph_nvfp4`` takes the trainer's default, ``norm_quant="auto"``
  (on where the engine holds FP4-weight groups), and runs the FP4-weight GEMM where its table prefers it
  (``fp4_weights="auto"``);
  ``graph-fp4_nvfp4`` on every NVFP4 projection (``True``); ``graph-deqw_nvfp4`` on none (``False``: cuBLAS on
  the BF16 dequantized weights, the path before the FP4-weight GEMM);
  ``graph-pdl_nvfp4``: ``graph_nvfp4`` with programmatic dependent launch on (``use_options(pdl="on")``, i.e.
  ``MINITE_TRITON_PDL=on``, from the sampler's construction through its capture to its last timed run): each
  FP4-weight GEMM starts while the norm/SiLU kernel before it runs and prefetches its weights into L2 (sm_90+;
  elsewhere the option is ignored and the variant equals ``graph_nvfp4``); ``graph-pdlhead_nvfp4`` /
  ``graph-pdlbare_nvfp4`` the same with ``pdl="head"`` / ``"bare"``: each GEMM prefetches only its slice's first
  pipeline stages / nothing before it waits;
- ``eager_bf16`` / ``eager_nvfp4``: the same engine with graphs off (what the graphs save);
- ``loop_bf16`` / ``loop_nvfp4``: the reference loop (``rollout.local``);
- ``hf_static_bf16`` / ``hf_static_nvfp4``: transformers ``generate`` with ``cache_implementation="static"``
  (its auto-compiled decode; the NVFP4 linears go through ``torch.compile`` as minite's custom op).

EOS is ignored (every sequence runs to ``--max-new-tokens``; HF via ``min_new_tokens``), sampling at T = 1.
Each variant runs once untimed (capture / compile / warm-up), then ``--reps`` timed runs; the median is
reported. Tokens/s counts generated tokens over the whole ``generate`` call (prefill included).

Bandwidth floor: a decode step must read every weight once, so ``seqs / (weight_bytes / copy_bw)`` tokens/s
bounds any sampler from above (KV-cache reads aside). ``copy_bw`` is measured here (a 1 GiB device copy,
read + write bytes / time); ``weight_bytes`` is the bf16 size of the decoder and lm_head (the embedding
rows read per token are negligible), and for NVFP4 the quantized linears at 0.5625 bytes/parameter (packed
E2M1 + E4M3 scales): the floor an NVFP4 decode could reach, whatever GEMM it runs now.

``--profile DIR`` writes a kernel table (torch.profiler, GPU time per kernel name) of one timed run of each
graph/eager variant, and the GPU-busy fraction of the run's wall time.

Prints one JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from profile_table import profiled

VARIANTS = ("graph_bf16", "graph_nvfp4", "graph-pdl_nvfp4", "graph-pdlhead_nvfp4", "graph-pdlbare_nvfp4",
            "graph-fp4_nvfp4", "graph-deqw_nvfp4",
            "graph-sdpa_bf16", "graph-sdpa_nvfp4", "graph-nopack_bf16", "graph-nopack_nvfp4", "graph-nq_nvfp4",
            "graph-nonq_nvfp4", "eager_bf16", "eager_nvfp4", "loop_bf16", "loop_nvfp4", "hf_static_bf16",
            "hf_static_nvfp4")
NVFP4 = "nvfp4_per_token_bf16_bwd"
#: variant kind -> ``options().pdl`` while it runs
PDL_KINDS = {"graph-pdl": "on", "graph-pdlhead": "head", "graph-pdlbare": "bare"}


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def copy_bandwidth(dev) -> float | None:
    """Device copy bandwidth in bytes/s (read + write), median of 5 copies of 1 GiB."""
    import torch

    if dev.type != "cuda":
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        _sync(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    del src, dst
    return 2 * (1 << 30) / statistics.median(times[1:])


def weight_bytes(model, report=None) -> float:
    """Bytes one decode step reads: decoder + lm_head weights (tied embeddings counted once)."""
    quantized = set()
    if report is not None:
        quantized = {e.name for e in report.layers if e.status == "quantized"}
    total, seen = 0.0, set()
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen or (name.endswith("embed_tokens") and not model.config.tie_word_embeddings):
                continue
            seen.add(id(p))
            packed = name in quantized and pname == "weight"
            total += p.numel() * (0.5625 if packed else p.element_size())
    return total


def _profile(dev, fn, out_dir: pathlib.Path, tag: str) -> dict:
    _, summary = profiled(dev, fn, out_dir, tag)
    return {k: v for k, v in summary.items() if k != "kernels"} | {"top": summary["kernels"][:8]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default="graph_bf16,graph_nvfp4,loop_bf16,hf_static_bf16")
    ap.add_argument("--shape", default="0.6b", help="Qwen3 shape of the random model (rollout.models.QWEN3_SHAPES)")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loop-reps", type=int, default=1, help="timed runs of the (slow) loop variants")
    ap.add_argument("--check-every", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="2-layer hidden-64 model (CPU smoke test)")
    ap.add_argument("--profile", default=None, help="directory for per-variant kernel tables")
    ap.add_argument("--timed-reduction-configs", action="store_true",
                    help="compile the engine's fused functions without Inductor's deterministic mode (reduction "
                         "block sizes chosen by timing): what the engine's reproducibility across processes costs")
    a = ap.parse_args(argv)
    bad = [v for v in a.variants.split(",") if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}; valid: {', '.join(VARIANTS)}")

    import torch

    from rollout import GraphSampler, LocalSampler, SamplingParams
    from rollout.models import QWEN3_SHAPES, tiny_random_qwen3
    from trainers.config import DataConfig
    from trainers.data import arithmetic_examples, render_prompt

    if a.timed_reduction_configs:  # the engine's fused functions only; transformers' own compile is left alone
        from rollout.fused import FUNCTIONS

        compile_ = torch.compile
        torch.compile = lambda fn, **kw: compile_(fn, **{k: v for k, v in kw.items()
                                                        if k != "options" or fn not in FUNCTIONS.values()})
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available; run on a GPU or pass --device cpu --tiny"}))
        return 1
    if a.shape not in QWEN3_SHAPES:
        ap.error(f"unknown --shape {a.shape!r}; valid: {', '.join(QWEN3_SHAPES)}")
    dev = torch.device(a.device)
    base, tok = tiny_random_qwen3(REPO / "tests" / "assets" / "qwen3_tokenizer", seed=0, dtype=a.dtype,
                                  device=dev, **({} if a.tiny else QWEN3_SHAPES[a.shape]))
    examples = arithmetic_examples(a.seqs, (3,), seed=0)
    prompts = [render_prompt(tok, ex, DataConfig()) for ex in examples]
    T = a.max_new_tokens
    bw = copy_bandwidth(dev)
    results: dict[str, dict] = {}
    models: dict[str, tuple] = {}

    def model_for(prec: str):
        if prec not in models:
            m = base if prec == "bf16" else copy.deepcopy(base).to(dev)  # sampling leaves the weights alone
            rep = None
            if prec == "nvfp4":
                from minite_kernels import quantize_model

                rep = quantize_model(m, NVFP4)
            models[prec] = (m, rep)
        return models[prec]

    for variant in a.variants.split(","):
        kind, prec = variant.rsplit("_", 1)
        model, rep = model_for(prec)
        params = SamplingParams(max_new_tokens=T, seed=0)
        sampler = None
        # the variant's options, from its sampler's construction (and first run: the graph capture) to its last
        # run: one scope, so the options object stays the same for all of them
        scope = contextlib.ExitStack()
        if kind in PDL_KINDS:
            from minite_kernels.options import use_options

            scope.enter_context(use_options(pdl=PDL_KINDS[kind]))
        if kind in ("graph", *PDL_KINDS, "graph-fp4", "graph-deqw", "graph-sdpa", "graph-nopack", "graph-nq",
                    "graph-nonq", "eager"):
            fp4 = {"graph-fp4": True, "graph-deqw": False}.get(kind, "auto")
            nq = {"graph-nq": True, "graph-nonq": False}.get(kind, "auto")
            sampler = GraphSampler(model, tok, graphs=kind != "eager", check_every=a.check_every,
                                   attention="sdpa" if kind == "graph-sdpa" else "auto",
                                   pack=kind != "graph-nopack", norm_quant=nq, fp4_weights=fp4)
        elif kind == "loop":
            sampler = LocalSampler(model, tok)
        if sampler is not None:
            sampler.default_stop_ids = ()

            def run():
                return sampler.generate(prompts, params)
        else:
            from rollout.local import left_pad

            ids, mask, _ = left_pad(prompts, sampler_pad(tok), dev)

            def run():
                return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=T, min_new_tokens=T,
                                      do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                      cache_implementation="static", pad_token_id=sampler_pad(tok))
        entry: dict = {}
        try:
            t0 = time.perf_counter()
            out = run()
            _sync(dev)
            entry["first_call_s"] = time.perf_counter() - t0
            n_tok = sum(len(c.token_ids) for c in out) if sampler is not None else int(out[:, ids.shape[1]:].numel())
            times = []
            for _ in range(a.loop_reps if kind == "loop" else a.reps):
                _sync(dev)
                t0 = time.perf_counter()
                run()
                _sync(dev)
                times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            entry.update({"seconds": sec, "tokens": n_tok, "tokens_per_s": n_tok / sec, "runs": len(times)})
            wb = weight_bytes(model, rep)
            entry["weight_bytes"] = wb
            if bw:
                floor = a.seqs / (wb / bw)
                entry["floor_tokens_per_s"] = floor
                entry["fraction_of_floor"] = entry["tokens_per_s"] / floor
            if sampler is not None:
                entry["sampler"] = sampler.describe()
            if kind in PDL_KINDS:  # whether the option took effect here (sm_90+, Triton with griddepcontrol)
                from minite_kernels.backends.triton._common import pdl_enabled

                entry["pdl"] = pdl_enabled(torch.empty(0, device=dev))
            if a.profile and kind.startswith(("graph", "eager")):
                entry["profile"] = _profile(dev, run, pathlib.Path(a.profile), variant)
        except Exception as e:  # noqa: BLE001 - a failing baseline is a result too
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        results[variant] = entry
        print(f"[bench_rollout] {variant}: {json.dumps(entry)[:400]}", file=sys.stderr)
        sampler = run = None  # its graphs and packed copies go before the next variant's
        scope.close()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    ref = results.get("graph_bf16", {}).get("tokens_per_s")
    speedup = {v: r["tokens_per_s"] / ref for v, r in results.items() if ref and "tokens_per_s" in r}
    out = {"bench": "rollout", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "model": "tiny-qwen3" if a.tiny else f"qwen3-{a.shape}-shape (random)", "dtype": a.dtype, "seqs": a.seqs,
           "max_new_tokens": T, "prompt_tokens_max": max(len(p) for p in prompts), "reps": a.reps,
           "copy_bw_bytes_per_s": bw, "torch": torch.__version__, "results": results,
           "timed_reduction_configs": a.timed_reduction_configs,
           "relative_to_graph_bf16": speedup,
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(out))
    return 0


def sampler_pad(tok) -> int:
    return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)


if __name__ == "__main__":
    sys.exit(main())

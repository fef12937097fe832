"""The FP4-weight GEMM (``minite_kernels.backends.triton.fp4w``) against cuBLAS on the BF16 weight of the same
shape (``torch.mm(X̂, Ŵᵀ)``: what both the BF16 recipe and the dequantized-weight NVFP4 path run), at the
projections the CUDA-graph sampler runs per decode step (one layer of each ``--shapes``: q/k/v packed, o,
gate/up packed, down).

All times are microseconds of CUDA-graph replay (GPU time, median), with weights streamed from HBM: each graph
cycles through enough distinct weight copies (``--cold-mb``) that no weight is still in the 50 MB L2 when it
comes back, as in a model's decode step. ``copy_bw`` is a 1 GiB device copy (read + write bytes / time);
``fp4w_floor_frac`` = (packed bytes / copy_bw) / time, ``mm_floor_frac`` the same for the BF16 bytes.

1. ``fp4w_shape`` per shape and batch: ``mm_us``, ``fp4w_us`` with the module's table, and with ``--sweep``
   every configuration of :data:`SWEEP` at that batch (``sweep_us``) and the best one;
2. ``fp4w_layer`` per shape and batch: the layer's four projections in sequence, cuBLAS against FP4 (the
   sweep's best per projection where swept, else the table), which is what each decode step pays per layer.
``--write-table`` rewrites the ``TABLE`` block of the kernel module from the sweep: per (N, K) and batch
bucket the best configuration, or None where cuBLAS on the BF16 weight was faster.

    python scripts/bench_fp4w.py [--shapes 0.6b,4b,8b] [--batches 16,64,128] [--sweep] [--write-table]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from timing import gpu_us  # noqa: E402

from minite_kernels.backends.triton import fp4w as F  # noqa: E402
from rollout.models import qwen3_projections  # noqa: E402

#: (BLOCK_N, BLOCK_K, warps, stages, swap_ab) tried by --sweep, each with every power-of-two split-K up to
#: MAX_SPLIT that leaves each split two K steps. These are the configurations within 10% of the best on some
#: 4B / 8B projection at 16 or 64 rows in a wider sweep (BLOCK_N up to 256, 8 warps with 2-3 stages, the other
#: operand order: benchmarks/RESULTS.md), where one warpgroup with a deep pipeline won everywhere
SWEEP = ((64, 128, 4, 4, True), (128, 64, 4, 4, True), (64, 128, 4, 2, True), (64, 256, 4, 3, True),
         (128, 128, 4, 4, True), (64, 64, 4, 4, True), (128, 128, 8, 4, True))
MAX_SPLIT = 16


def copy_bw() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * (1 << 30) / (gpu_us(lambda: dst.copy_(src), 100) * 1e-6)


def _weights(n: int, k: int, copies: int, g: torch.Generator):
    """``copies`` distinct (Ŵ BF16, FP4Weight) pairs of one random weight shape."""
    from minite_kernels.backends.triton.quantize import dequantize_nvfp4_triton, quantize_nvfp4_triton

    out = []
    for _ in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        q = quantize_nvfp4_triton(w, per_token=False)
        pk = F.FP4Weight.empty(n, k, "cuda")
        pk.copy_rows_(0, q.data, q.scales, q.amax)
        out.append((dequantize_nvfp4_triton(q.data, q.scales, q.amax, per_token=False, dtype=torch.bfloat16), pk))
    return out


def _configs(n: int, k: int, only: str = "") -> dict[str, F.FP4WConfig]:
    out = {}
    for bn, bk, w, st, swap in SWEEP:
        if k % bk:
            continue
        s = 1
        while s <= MAX_SPLIT and k % (s * bk) == 0 and k // (s * bk) >= 2:
            key = f"n{bn}k{bk}s{s}w{w}p{st}{'' if swap else 'nt'}"
            if only in key:
                out[key] = F.FP4WConfig(bn, bk, s, w, st, swap)
            s *= 2
    return out


_CONFIG_REPR = re.compile(r"^FP4WConfig\((.*)\)$")


def parse_config(text: str) -> F.FP4WConfig:
    """The inverse of ``repr(FP4WConfig(...))`` (keyword arguments of ints, None and booleans)."""
    m = _CONFIG_REPR.match(text.strip())
    if m is None:
        raise ValueError(f"not an FP4WConfig repr: {text!r}")
    kw = dict(item.split("=") for item in m.group(1).split(", "))
    lit = {"None": None, "True": True, "False": False}
    return F.FP4WConfig(**{key: lit[v] if v in lit else int(v) for key, v in kw.items()})


def table_from_lines(lines: list[str]) -> dict:
    """``best[(n, k)][bucket]`` from swept fp4w_shape records: the best configuration, or None where cuBLAS was
    faster."""
    best: dict = {}
    for line in lines:
        rec = json.loads(line)
        if rec.get("bench") != "fp4w_shape" or "best" not in rec:
            continue
        cfg = parse_config(rec["best"]) if rec["best_us"] < rec["mm_us"] else None
        best.setdefault((rec["N"], rec["K"]), {})[F.m_bucket(rec["batch"])] = cfg
    return best


def write_table(best: dict) -> None:
    """Rewrite the TABLE block of fp4w.py with ``best[(n, k)][bucket] = config or None``; shapes and row buckets
    not measured now keep their entries."""
    best = {key: {**F.TABLE.get(key, {}), **best.get(key, {})} for key in {*F.TABLE, *best}}
    path = pathlib.Path(F.__file__)
    lines = ["TABLE: dict[tuple[int, int], dict[int, FP4WConfig | None]] = {"]
    for (n, k), row in sorted(best.items()):
        items = ", ".join(f"{b}: {'None' if c is None else repr(c)}" for b, c in sorted(row.items()))
        lines.append(f"    ({n}, {k}): {{{items}}},")
    lines.append("}")
    src = path.read_text()
    new = re.sub(r"(# BEGIN TABLE\n).*?(\n# END TABLE)", lambda m: m.group(1) + "\n".join(lines) + m.group(2),
                 src, flags=re.S)
    path.write_text(new)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="0.6b,4b,8b")
    p.add_argument("--batches", default="16,64,128")
    p.add_argument("--sweep", action="store_true", help="time every configuration of SWEEP")
    p.add_argument("--write-table", action="store_true", help="rewrite fp4w.TABLE from the sweep")
    p.add_argument("--sweep-filter", default="", help="sweep only configurations whose key contains this "
                   "(e.g. nt or s4); the table's current configuration is always timed")
    p.add_argument("--rep", type=int, default=40, help="milliseconds of replays per timing")
    p.add_argument("--cold-mb", type=int, default=160, help="distinct weight bytes per graph (BF16 copies)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument("--table-from", default=None, help="rewrite fp4w.TABLE from the fp4w_shape lines of an "
                   "earlier --sweep's JSON lines file, measuring nothing")
    a = p.parse_args()
    if a.table_from:
        write_table(table_from_lines(pathlib.Path(a.table_from).read_text().splitlines()))
        return 0

    def emit(rec: dict) -> None:
        line = json.dumps(rec)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")

    bw = copy_bw()
    emit({"bench": "fp4w_env", "device": torch.cuda.get_device_name(), "copy_bw": bw, "torch": torch.__version__,
          "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    g = torch.Generator(device="cuda").manual_seed(0)
    batches = [int(b) for b in a.batches.split(",")]
    best_table: dict = {}
    for shape in a.shapes.split(","):
        projs = qwen3_projections(shape)
        layer, chosen = {}, {}
        for name, n, k in projs:
            copies = max(2, -(-a.cold_mb * 2**20 // (2 * n * k)))
            layer[name] = ws = _weights(n, k, copies, g)
            for b in batches:
                x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g)
                ref = torch.mm(x, ws[0][0].t())
                y = F.fp4w_linear(x, ws[0][1], None, F.DEFAULT_CONFIG)
                rel = float((y.double() - ref.double()).norm() / ref.double().norm())
                rec = {"bench": "fp4w_shape", "shape": shape, "case": f"{name}_{n}x{k}_b{b}", "N": n, "K": k,
                       "batch": b, "copies": copies, "rel_l2_vs_mm": rel}
                rec["mm_us"] = gpu_us(lambda: [torch.mm(x, w.t()) for w, _ in ws], a.rep) / copies
                cfg = F.table_config(n, k, b) or F.DEFAULT_CONFIG
                rec["table_config"] = repr(cfg)
                rec["fp4w_us"] = gpu_us(lambda: [F.fp4w_linear(x, pk, None, cfg) for _, pk in ws], a.rep) / copies
                best_cfg, best_us = cfg, rec["fp4w_us"]
                if a.sweep:
                    sweep = {}
                    want = F.fp4w_linear(x, ws[0][1], None, F.FP4WConfig(split=1))
                    for key, c in _configs(n, k, a.sweep_filter).items():
                        try:
                            got = F.fp4w_linear(x, ws[0][1], None, c)
                            if not torch.equal(got, want) and float((got.double() - want.double()).norm()
                                                                    / want.double().norm()) > 1e-3:
                                sweep[key] = "wrong result"  # checked against split 1: never tabled
                                continue
                            sweep[key] = gpu_us(lambda: [F.fp4w_linear(x, pk, None, c) for _, pk in ws],
                                                a.rep) / copies
                        except Exception as e:  # a configuration that does not compile is reported, not fatal
                            sweep[key] = f"{type(e).__name__}: {str(e)[:120]}"
                            continue
                        if sweep[key] < best_us:
                            best_cfg, best_us = c, sweep[key]
                    rec["sweep_us"], rec["best"], rec["best_us"] = sweep, repr(best_cfg), best_us
                    best_table.setdefault((n, k), {})[F.m_bucket(b)] = best_cfg if best_us < rec["mm_us"] else None
                    if a.write_table:  # after every shape, so that a run stopped part-way keeps what it measured
                        write_table(best_table)
                chosen[(name, b)] = best_cfg
                rec["speedup_vs_mm"] = rec["mm_us"] / best_us
                rec["fp4w_floor_frac"] = (n * k * 0.5625 / bw) * 1e6 / best_us
                rec["mm_floor_frac"] = (n * k * 2 / bw) * 1e6 / rec["mm_us"]
                emit(rec)
        for b in batches:
            xs = {name: torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g) for name, _, k in projs}
            copies = min(len(ws) for ws in layer.values())

            def chain(fp4: bool, xs=xs, copies=copies, b=b, layer=layer):
                for c in range(copies):
                    for name, _, _ in projs:
                        w, pk = layer[name][c]
                        if fp4:
                            F.fp4w_linear(xs[name], pk, None, chosen[(name, b)])
                        else:
                            torch.mm(xs[name], w.t())

            rec = {"bench": "fp4w_layer", "shape": shape, "batch": b, "copies": copies}
            rec["mm_us"] = gpu_us(lambda: chain(False), a.rep) / copies
            rec["fp4w_us"] = gpu_us(lambda: chain(True), a.rep) / copies
            rec["speedup"] = rec["mm_us"] / rec["fp4w_us"]
            emit(rec)
        del layer
        torch.cuda.empty_cache()
    if a.write_table:
        write_table(best_table)
        emit({"bench": "fp4w_table", "written": str(pathlib.Path(F.__file__).relative_to(REPO)),
              "entries": {f"{n}x{k}": {b: repr(c) for b, c in row.items()} for (n, k), row in best_table.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

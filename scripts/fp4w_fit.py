"""What limits the FP4-weight GEMM, read off recorded sweeps: per batch size, a least-squares line through the
best time of every projection against its packed weight bytes (``bench_fp4w.py --sweep`` JSON lines)::

    t(N, K) ~= t0 + bytes(N, K) / B        bytes = N * K * 0.5625 (E2M1 codes and E4M3 scales)

``t0`` is what a call costs whatever its size (launch, pipeline fill, split-K reduction, the last wave's tail) and
``B`` the rate at which it then streams weights, to compare with the device copy rate (``copy_bw`` of the same
file). Also per call: the L2-to-SM bytes of the re-read activation tiles (every weight-row tile reads the whole
X̂ tile: ``ceil(N / BLOCK_N) * BLOCK_M * K * 2``) beside the weight bytes, for the best configuration and for the
fastest configuration with the fewest such bytes, so the two explanations can be told apart.

Worked example: two projections of 2.36 and 56.6 MB at 6.0 and 25.5 us give B = 54.2 MB / 19.5 us = 2.78 TB/s
and t0 = 6.0 - 2.36 / 2.78 = 5.2 us.

    python scripts/fp4w_fit.py benchmarks/raw/h100_fp4w_async_sweep_*.jsonl
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from minite_kernels.backends.triton import fp4w as F

_KEY = re.compile(r"n(\d+)k(\d+)s(\d+)w(\d+)p(\d+)")  # bench_fp4w's sweep keys


def x_reread_bytes(n: int, k: int, batch: int, key: str) -> int:
    """Bytes of X̂ tiles the programs of sweep configuration ``key`` read (from L2): one [BLOCK_M, K] BF16 tile
    per weight-row tile, BLOCK_M as the kernel's launcher picks it."""
    bn, bk, split, warps, stages = map(int, _KEY.match(key).groups())
    cfg = F.FP4WConfig(block_n=bn, block_k=bk, split=split, num_warps=warps, num_stages=stages)
    return -(-n // bn) * F._block_m(cfg, batch, bk) * k * 2


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(t0 us, rate bytes/s) of the least-squares line t = t0 + bytes / rate through ``(bytes, us)`` points."""
    try:
        slope, t0 = statistics.linear_regression([b for b, _ in points], [t for _, t in points])  # us per byte
    except statistics.StatisticsError as e:
        raise ValueError("the fit needs at least two projections of different sizes") from e
    return t0, 1e6 / slope


def analyse(lines: list[str]) -> dict:
    copy_bw, calls = None, {}
    for line in lines:
        r = json.loads(line)
        if r.get("bench") == "fp4w_env":
            copy_bw = r["copy_bw"]
        if r.get("bench") != "fp4w_shape" or not isinstance(r.get("sweep_us"), dict):
            continue
        n, k, b = r["N"], r["K"], r["batch"]
        timed = [(us, key) for key, us in r["sweep_us"].items() if isinstance(us, (int, float))]
        if not timed:
            continue
        best_us, best = min(timed)
        lean_us, lean = min(timed, key=lambda t: (x_reread_bytes(n, k, b, t[1]), t[0]))
        calls[(r["shape"], r["case"])] = {  # a case measured twice keeps its last sweep
            "shape": r["shape"], "case": r["case"], "batch": b, "weight_bytes": n * k * 0.5625, "best_us": best_us,
            "best": best, "x_reread_bytes": x_reread_bytes(n, k, b, best),
            "fewest_x_bytes": lean, "fewest_x_bytes_us": lean_us,
            "fewest_x_bytes_reread": x_reread_bytes(n, k, b, lean)}
    per_batch = {}
    for b in sorted({c["batch"] for c in calls.values()}):
        pts = [(c["weight_bytes"], c["best_us"]) for c in calls.values() if c["batch"] == b]
        if len({p[0] for p in pts}) < 2:
            continue
        t0, rate = fit(pts)
        per_batch[b] = {"calls": len(pts), "t0_us": t0, "rate_bytes_per_s": rate,
                        "rate_vs_copy_bw": rate / copy_bw if copy_bw else None}
    return {"copy_bw": copy_bw, "fit": per_batch, "calls": list(calls.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="bench_fp4w.py --sweep JSON lines")
    a = p.parse_args(argv)
    lines = [ln for f in a.files for ln in pathlib.Path(f).read_text().splitlines() if ln.strip()]
    out = analyse(lines)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

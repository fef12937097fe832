"""scripts/bench_triage.py on CPU at a tiny size: one JSON line with the ratios and, with --profile, kernel tables."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_triage.py"


def test_bench_triage_cpu_smoke_with_profile():
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--batch", "4", "--seqlen", "256",
                          "--iters", "20", "--warmup", "1", "--threads", "1", "--profile"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    assert d["ratio"] > 0 and d["ratio_eager"] > 0 and d["ratio_nodiag"] > 0 and d["iters"] == 20
    for name in ("triage", "triage_eager", "triage_nodiag"):
        prof = d["profile"][name]
        assert prof["busy_ms_per_call"] > 0 and prof["kernels"]
        # a table of named operators (which ones lead depends on the load of the machine)
        assert all(k["kernel"] and k["calls"] >= 1 and k["ms"] >= 0 for k in prof["kernels"])

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
    assert d["ratio"] > 0 and d["ratio_nodiag"] > 0 and d["iters"] == 20
    for name in ("triage", "triage_nodiag"):
        prof = d["profile"][name]
        assert prof["busy_ms_per_call"] > 0 and prof["kernels"]
    names = {k["kernel"] for k in d["profile"]["triage"]["kernels"]}
    assert "aten::topk" in names  # the diagnostics' 5% quantile runs only with the diagnostics on
    assert "aten::topk" not in {k["kernel"] for k in d["profile"]["triage_nodiag"]["kernels"]}

"""scripts/bench_encode.py --check: every case of the encode benchmark at tiny sizes under Triton's interpreter,
bytes against the reference (the GPU run times the same cases and checks the same bytes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from minite_test_support import SCRIPTS, load_script

pytest.importorskip("triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the timed cases instead")
def test_check_mode_covers_every_case_bytes_equal():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, str(SCRIPTS / "bench_encode.py"), "--check"], env=env, check=False,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in rows] == [
        "fp32_per_token_1x16+qs", "fp32_per_tensor_1x16+qs", "fp32_per_tensor_16x16", "fp32_per_token_1x16_sr",
        "decode_quant_b1_k80", "decode_quant_b3_k80"]
    assert all(r["bytes_equal"] and r["us"] is None for r in rows)


def test_check_mode_needs_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(SCRIPTS / "bench_encode.py"), "--check"], env=env, check=False,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "TRITON_INTERPRET=1" in res.stderr


def test_every_timed_kernel_compiles_for_sm90_offline():
    """``--sass``: the kernels the GPU run times compile (not interpreted) for sm_90 without a GPU."""
    bench = load_script("bench_encode")
    counts = bench.sass_counts()
    assert len(counts) == 10 and all(n > 100 for n in counts.values()), counts
    assert len(set(bench.bf16_sass_digests().values())) == 6  # six different kernels, each compiled

"""scripts/bench_fp4w.py: the table it writes from a recorded sweep (``--table-from``)."""
from __future__ import annotations

import json

import pytest
from minite_test_support import load_script

pytest.importorskip("triton")


def test_table_from_recorded_sweep_lines():
    bench = load_script("bench_fp4w")
    F = bench.F
    fast = F.FP4WConfig(block_n=128, block_k=64, split=2, num_warps=4, num_stages=4, swap_ab=True)
    assert bench.parse_config(repr(fast)) == fast
    assert bench.parse_config(repr(F.FP4WConfig(split=None, swap_ab=False))) == F.FP4WConfig(split=None, swap_ab=False)
    lines = [
        json.dumps({"bench": "fp4w_env", "copy_bw": 1.0}),
        # the kernel won at 64 rows: its best configuration; cuBLAS won at 16: None; unswept: left out
        json.dumps({"bench": "fp4w_shape", "N": 4096, "K": 1024, "batch": 64, "mm_us": 10.0,
                    "best": repr(fast), "best_us": 9.0}),
        json.dumps({"bench": "fp4w_shape", "N": 4096, "K": 1024, "batch": 9, "mm_us": 10.0,
                    "best": repr(fast), "best_us": 11.0}),
        json.dumps({"bench": "fp4w_shape", "N": 64, "K": 64, "batch": 64, "mm_us": 1.0, "fp4w_us": 2.0}),
    ]
    assert bench.table_from_lines(lines) == {(4096, 1024): {64: fast, 16: None}}
    with pytest.raises(ValueError, match="not an FP4WConfig repr"):
        bench.parse_config("Config(block_n=1)")

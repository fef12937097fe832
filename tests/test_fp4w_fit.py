"""scripts/fp4w_fit.py: the fixed cost and streaming rate of the FP4-weight GEMM, fitted from recorded sweeps."""
from __future__ import annotations

import json
import pathlib

import pytest
from minite_test_support import load_script

pytest.importorskip("triton")

REPO = pathlib.Path(__file__).resolve().parents[1]


def _line(n, k, batch, sweep):
    return json.dumps({"bench": "fp4w_shape", "shape": "s", "case": f"p{n}x{k}_b{batch}", "N": n, "K": k,
                       "batch": batch, "sweep_us": sweep})


def test_fit_recovers_a_known_line_and_counts_the_reread_tiles():
    fitmod = load_script("fp4w_fit")
    # t = 5 us + bytes / 2e12 B/s exactly, for two shapes; a slower configuration and a failed one are ignored
    sizes = [(2048, 2048), (8192, 4096)]
    lines = [json.dumps({"bench": "fp4w_env", "copy_bw": 2.5e12})]
    for n, k in sizes:
        t = 5.0 + n * k * 0.5625 / 2e12 * 1e6
        lines.append(_line(n, k, 16, {"n64k128s1w4p4": t, "n128k64s1w4p4": t + 3, "n256k128s1w8p3": "OutOfResources"}))
    out = fitmod.analyse(lines)
    f = out["fit"][16]
    assert f["calls"] == 2 and f["t0_us"] == pytest.approx(5.0) and f["rate_bytes_per_s"] == pytest.approx(2e12)
    assert f["rate_vs_copy_bw"] == pytest.approx(0.8)
    call = out["calls"][0]
    assert call["best"] == "n64k128s1w4p4"
    # 2048 rows in tiles of 64, each reading the whole 16 x 2048 BF16 activation tile
    assert call["x_reread_bytes"] == 32 * 16 * 2048 * 2 == fitmod.x_reread_bytes(2048, 2048, 16, "n64k128s1w4p4")
    assert call["fewest_x_bytes"] == "n128k64s1w4p4" and call["fewest_x_bytes_reread"] == 16 * 16 * 2048 * 2
    with pytest.raises(ValueError, match="at least two projections"):
        fitmod.fit([(1.0, 2.0)])


def test_recorded_h100_sweeps_fit():
    """The committed H100 sweeps give a fixed cost of several microseconds per call at both batch sizes."""
    fitmod = load_script("fp4w_fit")
    files = sorted((REPO / "benchmarks" / "raw").glob("h100_fp4w_async_sweep_*.jsonl"))
    lines = [ln for f in files for ln in f.read_text().splitlines() if ln.strip()]
    out = fitmod.analyse(lines)
    assert set(out["fit"]) == {16, 64}
    for b in (16, 64):
        assert 3.0 < out["fit"][b]["t0_us"] < 12.0 and out["fit"][b]["rate_bytes_per_s"] > 1e12

"""minite_util.choices: the one "did you mean" behind every error that lists valid choices."""
from __future__ import annotations

from minite_util.choices import closest, did_you_mean


def test_closest_and_hint():
    assert closest("nvfp4_per_tokn", ["bf16", "nvfp4_per_token", "mxfp8"]) == "nvfp4_per_token"
    assert did_you_mean("nvfp4_per_tokn", ["bf16", "nvfp4_per_token"]) == "; did you mean 'nvfp4_per_token'?"
    assert closest(3, [1, 3, 30]) == "3"  # compared as strings


def test_nothing_close_gives_no_hint_unless_cutoff_is_zero():
    assert closest("zzz", ["bf16", "mxfp8"]) is None and did_you_mean("zzz", ["bf16", "mxfp8"]) == ""
    assert did_you_mean("zzz", ["bf16", "mxfp8"], cutoff=0.0) in ("; did you mean 'bf16'?", "; did you mean 'mxfp8'?")
    assert did_you_mean("x", []) == ""

from __future__ import annotations

import dataclasses

import pytest

from triage import TriageConfig


def test_defaults_match_spec():
    c = TriageConfig()
    assert (c.gate_segment_len, c.repair_segment_len) == (64, 128)
    assert (c.gate_tier_low, c.gate_tier_high) == (-1.5, -0.5)
    assert (c.gate_weight_low, c.gate_weight_mid, c.gate_weight_high) == (0.1, 0.3, 1.0)
    assert (c.gate_tail_threshold, c.gate_tail_k_cap, c.gate_tail_attenuation) == (-6.0, 2, 0.9)
    assert (c.repair_boundary, c.repair_huber_delta, c.repair_coef) == (-0.5, 1.0, 0.1)
    assert c.tis_cap == 2.0
    assert (c.clip_ratio_low, c.clip_ratio_high, c.clip_ratio_c) == (0.2, 0.28, 3.0)
    assert c.gate and c.repair and c.tis


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TriageConfig().gate = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gate_segment_len": 0}, "gate_segment_len"),
        ({"repair_segment_len": -128}, "repair_segment_len"),
        ({"gate_tail_k_cap": 0}, "gate_tail_k_cap"),
        ({"gate_tier_low": -0.5, "gate_tier_high": -1.5}, "gate_tier_low"),
        ({"gate_weight_low": 0.5, "gate_weight_mid": 0.3}, "gate_weight_low"),
        ({"gate_weight_high": 1.5}, "gate_weight_high"),
        ({"gate_tail_attenuation": 1.0}, "gate_tail_attenuation"),
        ({"repair_huber_delta": 0.0}, "repair_huber_delta"),
        ({"repair_coef": -0.1}, "repair_coef"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
        ({"repair_boundary": float("nan")}, "repair_boundary"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TriageConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"gate": 1}, "gate"), ({"gate_segment_len": 64.0}, "gate_segment_len")]
)
def test_wrong_types_name_the_field(kwargs, field):
    with pytest.raises(TypeError, match=field):
        TriageConfig(**kwargs)


def test_from_mapping_suggests_closest_field():
    assert TriageConfig.from_mapping({"repair_coef": 0.05, "_target_": "x"}).repair_coef == 0.05
    with pytest.raises(ValueError, match="did you mean 'repair_coef'"):
        TriageConfig.from_mapping({"repair_coeff": 0.05})


def test_import_triage_does_not_import_verl():
    import subprocess
    import sys

    code = "import sys, triage; assert not [m for m in sys.modules if m == 'verl' or m.startswith('verl.')]"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]

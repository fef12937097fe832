"""One colour per arm role in every study: the same role gets the same colour whatever its position, and an arm
without a role never takes a role's colour."""
from __future__ import annotations

import json

from trainers.palette import EXTRA_COLOURS, ROLE_COLOURS, colour, colours
from trainers.plots import plot_groups


def test_roles_keep_their_colour_across_studies():
    assert colour("tis_nvfp4") == colour("tis_rollout_nvfp4") == colour("tis") == ROLE_COLOURS["tis"]
    assert colour("triage_nvfp4") == colour("triage_bf16") == colour("triage") == ROLE_COLOURS["triage"]
    assert colour("bf16") == colour("on_policy") == ROLE_COLOURS["reference"]
    assert colour("nvfp4") == colour("rollout_nvfp4") == colour("none") == ROLE_COLOURS["uncorrected"]
    assert len({colour(a) for a in ("on_policy", "none", "tis", "triage", "gate_only", "repair_only")}) == 6
    assert colours(["triage_nvfp4", "nvfp4"]) == {"triage_nvfp4": ROLE_COLOURS["triage"],
                                                   "nvfp4": ROLE_COLOURS["uncorrected"]}
    other = colours(["bf16", "fp8_x", "fp8_y"])
    assert other["fp8_x"] != other["fp8_y"] and {other["fp8_x"], other["fp8_y"]} <= set(EXTRA_COLOURS)
    assert not set(EXTRA_COLOURS) & set(ROLE_COLOURS.values())


def test_study_figures_colour_arms_by_role(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = {}
    original = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        if kwargs.get("label"):
            drawn[kwargs["label"].split(" (")[0]] = kwargs.get("color")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    groups = {}
    for arm in ("triage_nvfp4", "nvfp4"):  # TRIAGE first: position must not decide the colour
        run = tmp_path / arm
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1 * s}) + "\n"
                                                   for s in range(1, 6)))
        groups[arm] = [run]
    out = plot_groups(groups, tmp_path / "r.png", 3, panels=1)
    assert out.stat().st_size > 1000
    assert drawn == {"triage_nvfp4": ROLE_COLOURS["triage"], "nvfp4": ROLE_COLOURS["uncorrected"]}

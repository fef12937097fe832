"""minite_kernels.options: one frozen options object, read from the environment once."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from minite_kernels.options import FIELDS, Options, options, set_env_option, use_options


def test_defaults_are_the_first_valid_value_of_each_field():
    assert Options().to_dict() == {name: valid[0] for name, (_, valid) in FIELDS.items()}


def test_from_env_strips_lowercases_and_names_the_variable():
    got = Options.from_env({"MINITE_TRITON_GEMM": " Exact ", "MINITE_LINEAR_LANE": "off", "OTHER": "x"})
    assert got == Options(gemm="exact", lane="off")
    with pytest.raises(ValueError, match=r"MINITE_TRITON_GEMM='exakt' is not valid; did you mean 'exact'\?"):
        Options.from_env({"MINITE_TRITON_GEMM": "exakt"})


def test_bad_values_and_fields_are_refused():
    with pytest.raises(ValueError, match=r"Options.decode='of' is not valid; did you mean 'off'\?; valid: recipe, auto, off"):
        Options(decode="of")
    with pytest.raises(TypeError, match=r"unknown option 'gem'; did you mean 'gemm'\?"):
        Options().replace(gem="exact")
    with pytest.raises(ValueError, match="'MINITE_GEMM' is not a minite option variable"):
        set_env_option("MINITE_GEMM", "exact")


def test_scoped_and_process_defaults(minite_options):
    base = options()
    with use_options(gemm="exact") as inner:
        assert options() is inner and inner.gemm == "exact" and inner.decode == base.decode
        with use_options(decode="off"):
            assert (options().gemm, options().decode) == ("exact", "off")
        assert options().decode == base.decode
    assert options() == base
    minite_options(pdl="on")
    assert options().pdl == "on"
    seen = []
    with use_options(gemm="exact"):  # a scoped change stays in its context: a new thread sees the default
        t = threading.Thread(target=lambda: seen.append(options()))
        t.start()
        t.join()
    assert seen[0].gemm == base.gemm and seen[0].pdl == "on"


def test_options_override_only_the_kernel_fields_they_set():
    """``recipe`` (the default) leaves a recipe's kernel choice as it is; any other value overrides that field of
    every recipe's choice; ``launch`` and ``pdl`` are no kernel choice."""
    from minite_kernels.options import resolve_kernels
    from minite_kernels.recipes import KernelChoice

    mine = KernelChoice(gemm="exact", save_activations="packed")
    assert resolve_kernels(mine, Options()) is mine
    assert Options(launch="jit", pdl="on").overrides == {}
    over = Options(decode="off", gemm="exact_fused")
    assert over.overrides == {"gemm": "exact_fused", "decode": "off"}
    assert resolve_kernels(mine, over) == KernelChoice(gemm="exact_fused", decode="off", save_activations="packed")
    assert resolve_kernels(mine, over) is resolve_kernels(mine, over)  # memoised per (choice, options) pair
    with use_options(lane="off"):
        assert resolve_kernels() == KernelChoice(lane="off")


def test_the_environment_is_read_once_at_import():
    code = ("import os; os.environ['MINITE_TRITON_DECODE'] = 'off'; "
            "from minite_kernels.options import options; a = options().decode; "
            "os.environ['MINITE_TRITON_DECODE'] = 'auto'; print(a, options().decode)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["off", "off"]


@pytest.mark.parametrize("at_import, later", [("0", "1"), ("1", "0")])
def test_the_triton_interpreter_switch_is_read_once_at_import(at_import, later):
    """``@triton.jit`` makes a kernel interpreted or compiled when its module is imported; the backend's host code
    reads ``TRITON_INTERPRET`` then too, so a later change cannot make the two disagree."""
    code = (f"import os; os.environ['TRITON_INTERPRET'] = {at_import!r}; import torch; "
            "from minite_kernels.backends.triton._common import interpret_mode, kernel_device_ok; "
            f"os.environ['TRITON_INTERPRET'] = {later!r}; print(interpret_mode(), kernel_device_ok(torch.zeros(1)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    expected = str(at_import == "1")
    assert out.stdout.split() == [expected, expected]

"""The cached Triton launcher (``backends/triton/launcher.py``): its key determines Triton's specialization,
and a cached launch passes ``CompiledKernel.run`` what ``JITFunction.run`` would."""

from __future__ import annotations

import pytest
import torch

from minite_kernels.options import Options, options

triton = pytest.importorskip("triton")
from hypothesis import given, settings
from hypothesis import strategies as st

from minite_kernels.backends.triton import launcher as L


def _native_spec(a):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, a, False, True, True)


_EDGES = [0, 1, 2, 15, 16, 17, 31, 32, 48, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, -1, -16, -17]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_EDGES), st.integers(-(2**40), 2**40)), min_size=2, max_size=6))
def test_equal_int_keys_mean_equal_triton_specializations(values):
    by_key: dict = {}
    for v in values:
        by_key.setdefault(L.arg_key(v), set()).add(_native_spec(v))
    assert all(len(specs) == 1 for specs in by_key.values()), by_key


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int16, torch.float32, torch.bool])
def test_equal_tensor_keys_mean_equal_triton_specializations(dtype):
    base = torch.zeros(256, dtype=torch.uint8)
    by_key: dict = {}
    for off in range(0, 64, 2 if dtype == torch.int16 else 4 if dtype in (torch.int32, torch.float32) else 1):
        t = base[off : off + 64].view(dtype)
        by_key.setdefault(L.arg_key(t), set()).add(_native_spec(t))
    assert len(by_key) == 2  # aligned and not
    assert all(len(specs) == 1 for specs in by_key.values()), by_key


def test_unkeyed_argument_types():
    assert L.arg_key(1.5) is None and L.arg_key(None) is None and L.arg_key(True) is None


def test_verified_versions():
    assert L.triton_version_ok("3.6.0") and L.triton_version_ok("3.6")
    assert not L.triton_version_ok("3.60.1") and not L.triton_version_ok("3.5.1")


class _Param:
    def __init__(self, name, default=None, has_default=False):
        self.name, self.default, self.has_default = name, default, has_default


class _Compiled:
    def __init__(self, tag):
        self.tag, self.function, self.packed_metadata = tag, f"fn-{tag}", f"meta-{tag}"
        self.calls = []

    def run(self, *a):
        self.calls.append(a)


class _FakeJit:
    """Stands in for a JITFunction(x, n, BLOCK: constexpr, FLAG: constexpr = 7): compiles one kernel per
    (alignment of x, n == 1, n % 16 == 0, BLOCK) like Triton, and records the grids it launched."""

    def __init__(self):
        self.params = [_Param("x"), _Param("n"), _Param("BLOCK"), _Param("FLAG", 7, True)]
        self.pre_run_hooks = []
        self.compiled: dict = {}
        self.jit_grids = []

    def __getitem__(self, grid):
        def runner(x, n, **kw):
            self.jit_grids.append(grid)
            tag = (x.data_ptr() % 16 == 0, n == 1, n % 16 == 0, kw["BLOCK"])
            return self.compiled.setdefault(tag, _Compiled(tag))

        return runner


@pytest.fixture
def fake():
    fn = _FakeJit()
    lau = L.CachedLauncher(fn)
    lau._enabled = True  # the fake is not a JITFunction
    lau._device, lau._stream = (lambda: 0), (lambda dev: 1234)
    assert options().launch == "cached"
    return fn, lau


def test_first_call_compiles_then_cached_launch_passes_constexprs_and_defaults(fake):
    fn, lau = fake
    x = torch.zeros(64, dtype=torch.int32)
    lau((3,), x, 32, BLOCK=8, num_warps=4)  # compiles through the JIT path
    assert fn.jit_grids == [(3,)] and lau.jit_launches == 1
    lau((5, 2), x, 48, BLOCK=8, num_warps=4)  # same key (aligned, n % 16 == 0): direct
    assert fn.jit_grids == [(3,)] and lau.direct_launches == 1
    (k,) = fn.compiled.values()
    # grid, stream, function, metadata, no launch metadata or hooks, then x, n, BLOCK=8, FLAG's default 7
    assert k.calls == [(5, 2, 1, 1234, k.function, k.packed_metadata, None, None, None, x, 48, 8, 7)]


def test_a_new_specialization_goes_through_jit(fake):
    fn, lau = fake
    x = torch.zeros(64, dtype=torch.int32)
    lau((1,), x, 32, BLOCK=8)
    lau((1,), x[1:], 32, BLOCK=8)  # misaligned pointer
    lau((1,), x, 33, BLOCK=8)  # n not a multiple of 16
    lau((1,), x, 1, BLOCK=8)  # n == 1 is a constant for Triton
    lau((1,), x, 32, BLOCK=16)  # another constexpr
    assert lau.jit_launches == 5 and lau.direct_launches == 0 and len(fn.compiled) == 5


def test_jit_mode_hooks_and_unkeyed_args_bypass_the_cache(fake, minite_options):
    fn, lau = fake
    x = torch.zeros(64, dtype=torch.int32)
    lau((1,), x, 32, BLOCK=8)
    minite_options(launch="jit")
    lau((1,), x, 32, BLOCK=8)
    minite_options(launch="cached")
    fn.pre_run_hooks.append(lambda *a, **k: None)
    lau((1,), x, 32, BLOCK=8)
    fn.pre_run_hooks.clear()
    lau((1,), x, 2.5, BLOCK=8)  # a float argument is not keyed
    assert lau.jit_launches == 4 and lau.direct_launches == 0
    lau((1,), x, 32, BLOCK=8)
    assert lau.direct_launches == 1


def test_launch_hooks_bypass_the_cache(fake, monkeypatch):
    from triton import knobs

    _fn, lau = fake
    x = torch.zeros(64, dtype=torch.int32)
    lau((1,), x, 32, BLOCK=8)
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):
        f = lambda *a: None
        hook.add(f)
        try:
            lau((1,), x, 32, BLOCK=8)
        finally:
            hook.remove(f)
    else:  # pragma: no cover - older Triton: a plain attribute
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
        lau((1,), x, 32, BLOCK=8)
    assert lau.jit_launches == 2 and lau.direct_launches == 0


def test_invalid_launch_mode_names_the_choices():
    with pytest.raises(ValueError, match="MINITE_TRITON_LAUNCH='fast' is not valid; valid: cached, jit"):
        Options.from_env({"MINITE_TRITON_LAUNCH": "fast"})

"""A cached launcher for the hot kernels: Triton's own compiled kernel, launched without re-binding (issue #6).

``kernel[grid](*args, **kw)`` goes through ``JITFunction.run`` on every call: it binds every argument,
specializes each one in C, hashes the specialization into a cache key, checks the kernel's globals and builds
the launch metadata. On the H200's host that is ~30 µs per launch against ~7 µs for one ATen op, and the learner
launches the per-token quantizer once per linear input.

:class:`CachedLauncher` keeps the ``CompiledKernel`` that the first ``JITFunction.run`` returned, under a key
that determines Triton's specialization of the call, and launches it directly afterwards::

    key = (device, kw, [spec(a) for a in args])
    spec(tensor) = (dtype, data_ptr % 16 == 0)                   Triton: ("*<dtype>", "D" or "")
    spec(int v)  = (v == 1, v % 16 == 0, i32/i64/u64 range)      Triton: ("constexpr", 1) or ("i32", "D" or "")

Equal keys give equal Triton specializations (``tests/minite_kernels/test_triton_launcher.py`` checks it
against Triton's ``native_specialize_impl``), so the cached kernel is the one ``run`` would have picked.
Example: a [16, 2048] bf16 input at a 16-byte aligned address and one at an odd 4-byte offset get different
keys (``D`` vs no alignment hint), hence different compiled kernels, exactly as in ``JITFunction.run``.

Only positional tensors and ints are keyed; any other argument type, launch hooks (a profiler such as
proton), pre-run hooks or a Triton release other than the verified ones send the call through
``JITFunction.run`` unchanged. ``MINITE_TRITON_LAUNCH=jit`` turns the cache off. Like any compiled-kernel
cache, it does not follow ``TRITON_DEBUG`` or instrumentation settings changed after a kernel's first launch.
"""

from __future__ import annotations

import torch
import triton

from minite_kernels.options import FIELDS, options

#: Triton releases whose ``JITFunction.run`` / ``CompiledKernel.run`` calling convention and argument
#: specialization rules this module reproduces (read from their sources, checked by the tests)
VERIFIED_TRITON = ("3.6",)
LAUNCH_MODES = FIELDS["launch"][1]


def launch_mode() -> str:
    """``options().launch``: ``cached`` (default) or ``jit`` (always ``JITFunction.run``)."""
    return options().launch


_I32 = 2**31
_U63 = 2**63


def triton_version_ok(version: str | None = None) -> bool:
    v = triton.__version__ if version is None else version
    return any(v == r or v.startswith(r + ".") for r in VERIFIED_TRITON)


def args_key(args: tuple) -> tuple | None:
    """What Triton specializes the runtime arguments on, flattened (a dtype starts a tensor's entry, so the
    flat tuple parses one way), or None if an argument has a type this launcher does not key."""
    key = []
    for a in args:
        if type(a) is int:
            key += (a == 1, a % 16 == 0, -_I32 <= a < _I32, a < _U63)
        elif isinstance(a, torch.Tensor):
            key += (a.dtype, a.data_ptr() % 16 == 0)
        else:
            return None
    return tuple(key)


def arg_key(a) -> tuple | None:
    """:func:`args_key` of one argument."""
    return args_key((a,))


def _hooks_idle(runtime) -> bool:
    for h in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return False
    return True


class CachedLauncher:
    """``launcher(grid, *args, **kw)`` launches ``fn`` as ``fn[grid](*args, **kw)`` would.

    ``args``: the runtime arguments, positionally, in signature order; ``kw``: constexprs and launch options
    (``num_warps``...), by keyword.
    """

    def __init__(self, fn) -> None:
        from triton import knobs

        self.fn = fn
        self._cache: dict[tuple, tuple] = {}
        self._enabled = triton_version_ok() and isinstance(fn, triton.runtime.jit.JITFunction)
        self._runtime = knobs.runtime
        self._device = self._stream = None
        self.direct_launches = 0  # counters for tests and benchmarks
        self.jit_launches = 0
        #: tests: on every cached launch, also ask ``JITFunction``'s own binder and cache which compiled kernel
        #: it would launch, and raise if it is not the cached one
        self.verify = False

    def __call__(self, grid: tuple, *args, **kw) -> None:
        if (
            self._enabled
            and launch_mode() == "cached"
            and not self.fn.pre_run_hooks
            and _hooks_idle(self._runtime)
        ):
            key = self._key(args, kw)
            hit = self._cache.get(key) if key is not None else None
            if hit is not None:
                kernel, tail = hit
                if self.verify:
                    self._verify(kernel, key[0], args, kw)
                n = len(grid)
                kernel.run(
                    grid[0],
                    grid[1] if n > 1 else 1,
                    grid[2] if n > 2 else 1,
                    self._stream(key[0]),
                    kernel.function,
                    kernel.packed_metadata,
                    None,
                    None,
                    None,
                    *args,
                    *tail,
                )
                self.direct_launches += 1
                return
            kernel = self.fn[grid](*args, **kw)
            self.jit_launches += 1
            if key is not None:
                self._remember(key, kernel, args, kw)
            return
        self.fn[grid](*args, **kw)
        self.jit_launches += 1

    def _key(self, args: tuple, kw: dict) -> tuple | None:
        if self._device is None:
            from triton.runtime.driver import driver

            self._device = driver.active.get_current_device
            self._stream = driver.active.get_current_stream
        spec = args_key(args)
        if spec is None:
            return None
        return (self._device(), tuple(kw.items()), spec)

    def jit_choice(self, device: int, args: tuple, kw: dict):
        """The compiled kernel ``JITFunction.run`` would launch for these arguments (None if not compiled)."""
        from triton import knobs
        from triton.runtime.jit import compute_cache_key

        kw = dict(kw)  # what JITFunction.run adds before binding
        kw["debug"] = kw.get("debug", self.fn.debug) or knobs.runtime.debug
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        kernel_cache, kernel_key_cache, _target, _backend, binder = self.fn.device_caches[device]
        _bound, specialization, options = binder(*args, **kw)
        return kernel_cache.get(compute_cache_key(kernel_key_cache, specialization, options))

    def _verify(self, kernel, device: int, args: tuple, kw: dict) -> None:
        chosen = self.jit_choice(device, args, kw)
        if hasattr(chosen, "result"):
            chosen = chosen.result()
        if chosen is not kernel:
            raise AssertionError(
                f"{self.fn.__name__}: cached launch key {self._key(args, kw)} picked a different compiled kernel "
                "than JITFunction.run would"
            )

    def _remember(self, key: tuple, kernel, args: tuple, kw: dict) -> None:
        """Store the compiled kernel with the values of the parameters after the positional ones (constexprs
        and defaults), in signature order, as ``JITFunction.run`` passes them to ``CompiledKernel.run``."""
        if hasattr(kernel, "result"):
            kernel = kernel.result()
        if not all(hasattr(kernel, n) for n in ("run", "function", "packed_metadata")):
            self._enabled = False  # an unexpected CompiledKernel: stay on JITFunction.run
            return
        params = self.fn.params
        tail = []
        for p in params[len(args) :]:
            if p.name in kw:
                tail.append(kw[p.name])
            elif p.has_default:
                tail.append(p.default)
            else:
                self._enabled = False
                return
        self._cache[key] = (kernel, tuple(tail))

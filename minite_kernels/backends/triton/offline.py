"""Compile the backend's kernels for a GPU that is not here, and read what came out (issue #6 tooling).

Triton picks register layouts from axis order and contiguity; a harmless-looking change of tile shape can
move a hot loop's data through shared memory while every byte test still passes. ``compile_offline`` runs
Triton's bundled compiler for a target architecture (sm_90 by default) without a device, with the
launcher's specializations mirrored (16-byte aligned pointers, chosen integer arguments divisible by 16), so
CPU tests (``tests/minite_kernels/test_triton_layout.py``) and ``scripts/kernel_asm.py`` see the layouts the
GPU run compiles, and where a kernel launched with programmatic dependent launch first touches global memory
(:func:`first_global_access`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: argument types the decode kernels share (the pair kernel here, the baseline of ``scripts/decode_planes.py``): the
#: packed weight, its scales and amax, the output, the split-K workspace and the sizes
DECODE_COMMON_TYPES = {
    "xamax_ptr": "*fp32",
    "w_ptr": "*i32",
    "ws_ptr": "*u8",
    "wamax_ptr": "*fp32",
    "out_ptr": "*bf16",
    "part_ptr": "*fp32",
    "cnt_ptr": "*i32",
    "B": "i32",
    "N": "i32",
    "K": "i32",
}
#: argument types of ``decode_kernels._decode_pairs_kernel`` (the pair decode kernel)
DECODE_PAIRS_TYPES = {"xp_ptr": "*i32", "xs_ptr": "*u8", "kb_per_split": "i32", **DECODE_COMMON_TYPES}


def pair_constexprs(
    block_n: int, block_kb: int, block_b: int, *, stages: int = 1, prefetch: bool = False, split: int = 1
) -> dict:
    """The constexprs of ``decode_kernels._decode_pairs_kernel`` for one launch configuration, compiled (not
    interpreted)."""
    return {
        "BLOCK_N": block_n,
        "BLOCK_KB": block_kb,
        "BLOCK_B": block_b,
        "SPLIT": split,
        "INTERP": False,
        "STAGES": stages,
        "PREFETCH": prefetch,
    }


def compile_offline(
    kernel,
    types: dict[str, str],
    constexprs: dict[str, object],
    *,
    warps: int = 4,
    stages: int | None = None,
    arch: int = 90,
    divisible_by_16: Iterable[str] = (),
) -> dict:
    """``kernel``'s compiled artefacts (``ttgir``, ``ptx``, ``cubin``, ...) for CUDA compute capability
    ``arch``. Arguments missing from ``types`` are constexprs (a constexpr missing from ``constexprs`` takes
    the kernel's default); pointers are specialized as 16-byte aligned, and so are the integer arguments
    named in ``divisible_by_16``; ``stages``: the pipeline depth (default: Triton's)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    declared = inspect.signature(kernel.fn).parameters.items()
    defaults = {
        n: p.default for n, p in declared if p.default is not inspect.Parameter.empty and n not in types
    }
    constexprs = {**defaults, **constexprs}
    div16 = [n for n, t in types.items() if t.startswith("*")] + list(divisible_by_16)
    src = ASTSource(
        fn=kernel,
        signature={n: types.get(n, "constexpr") for n in names},
        constexprs={(names.index(n),): v for n, v in constexprs.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in div16},
    )
    options = {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return dict(compiled.asm, shared=getattr(compiled.metadata, "shared", None))


def ptxas_messages(ptx: str, arch: int = 90) -> list[str]:
    """What Triton's bundled ``ptxas -v`` says about ``ptx`` for ``sm_{arch}a`` beyond the usual resource lines:
    its performance advisories, e.g. C7515 when it serializes the asynchronous MMAs (``wgmma``) that Triton
    pipelined, which the compiled code shows only as a wait after every MMA."""
    import os
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(arch).path, f"-arch=sm_{arch}a", "-v", src, "-o", os.path.join(d, "k.cubin")]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return [line for line in log.splitlines() if "Potential Performance Loss" in line]


def sass(cubin: bytes) -> list[str]:
    """The machine instructions of a compiled kernel (``compile_offline(...)["cubin"]``) in program order, as
    Triton's bundled ``cuobjdump -sass`` prints them (predicate, opcode and operands; addresses, encodings and
    comments dropped): what ptxas made of the PTX, e.g. whether it moved a load above ``griddepcontrol.wait``
    (``ACQBULK``)."""
    import os
    import subprocess
    import tempfile

    from triton import knobs

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", path], capture_output=True, text=True,
                             check=True).stdout
    return [m.group(1).strip() for m in re.finditer(r"^\s*/\*[0-9a-f]{4}\*/\s*(.*?)\s*;", out, re.MULTILINE)]


_GLOBAL_ACCESS = re.compile(
    r"\b(?:ld|st|atom|red)\.global\b"  # loads, stores, atomics
    r"|\bcp\.async\.(?:ca|cg)\.shared\.global\b"  # asynchronous copies into shared memory
    r"|\bcp\.async\.bulk\.(?:shared|tensor)"  # bulk and tensor copies (not cp.async.bulk.prefetch)
)


def first_global_access(ptx: str) -> int:
    """Offset in a PTX listing of the first instruction that reads or writes global memory: a load, store or
    atomic, or an asynchronous copy into shared memory (``cp.async``, bulk and tensor copies). L2 prefetches
    (``cp.async.bulk.prefetch``) move no data and do not count. Raises if there is none."""
    m = _GLOBAL_ACCESS.search(ptx)
    if m is None:
        raise ValueError("no global memory access in the PTX listing")
    return m.start()


#: SASS opcodes that read or write global memory (``LDGDEPBAR``, ``LDS``/``STS`` and ``LDC`` do not)
_SASS_GLOBAL = re.compile(r"(?:LDG|LDGSTS|STG|ATOMG|REDG|RED|LD|ST|ATOM|UBLKCP|UTMALDG|UTMASTG)(?:\.|$)")


def first_global_sass(instructions: list[str]) -> int:
    """Index in :func:`sass`'s list of the first instruction that reads or writes global memory (loads, stores,
    atomics, asynchronous and bulk copies; not the L2 prefetch ``UBLKPF``). Raises if there is none."""
    for i, ins in enumerate(instructions):
        op = re.match(r"(?:@!?\w+\s+)?(\S+)", ins).group(1)
        if _SASS_GLOBAL.match(op):
            return i
    raise ValueError("no global memory access in the SASS listing")


def ops_in_loop(ttgir: str, op: str) -> int:
    """How many ``op`` lines of a Triton GPU IR listing sit inside ``scf.for`` bodies."""
    depth, count = 0, 0
    for line in ttgir.splitlines():
        if "scf.for" in line:
            depth += 1
        elif depth and line.strip().startswith("scf.yield"):
            depth -= 1
        elif depth and op in line:
            count += 1
    return count


_BLOCKED = re.compile(
    r"^(#\w+) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], "
    r"warpsPerCTA = \[([\d, ]+)\]",
    re.MULTILINE,
)
_CONVERT = re.compile(r"ttg\.convert_layout .*: tensor<[^,>]+, (#[\w.<>{}=, ]+?)> -> tensor<[^,>]+, (#.+)>")
_SLICE = re.compile(r"#ttg\.slice<\{dim = (\d+), parent = (#\w+)\}")


def _register_equivalent(src: str, dst: str, blocked: dict) -> bool:
    """A 1-D blocked layout and a slice of a 2-D blocked parent that spread the elements over the same
    threads the same way (the parent does not spread along the sliced dimension): a conversion between
    them moves no data."""
    m = _SLICE.match(dst)
    if src not in blocked or m is None or m.group(2) not in blocked:
        return False
    dim, (p_spt, p_tpw, p_wpc) = int(m.group(1)), blocked[m.group(2)]
    s_spt, s_tpw, s_wpc = blocked[src]
    if len(s_spt) != 1 or len(p_spt) != 2 or p_tpw[dim] != 1 or p_wpc[dim] != 1:
        return False
    keep = 1 - dim
    return (s_spt[0], s_tpw[0], s_wpc[0]) == (p_spt[keep], p_tpw[keep], p_wpc[keep])


def moving_conversions_in_loop(ttgir: str) -> list[str]:
    """The ``ttg.convert_layout`` lines inside ``scf.for`` bodies that move data between threads (through
    shared memory or shuffles): all but those between register-equivalent layouts."""
    blocked = {
        m.group(1): tuple(tuple(int(v) for v in m.group(i).split(",")) for i in (2, 3, 4))
        for m in _BLOCKED.finditer(ttgir)
    }
    depth, moving = 0, []
    for line in ttgir.splitlines():
        if "scf.for" in line:
            depth += 1
        elif depth and line.strip().startswith("scf.yield"):
            depth -= 1
        elif depth and "ttg.convert_layout" in line:
            m = _CONVERT.search(line)
            if m is None or not _register_equivalent(m.group(1), m.group(2), blocked):
                moving.append(line.strip())
    return moving


__all__ = [
    "DECODE_COMMON_TYPES",
    "DECODE_PAIRS_TYPES",
    "compile_offline",
    "first_global_access",
    "first_global_sass",
    "moving_conversions_in_loop",
    "ops_in_loop",
    "pair_constexprs",
    "ptxas_messages",
    "sass",
]

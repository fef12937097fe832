"""What the decode kernels compile to, without a GPU (profiling aid for issue #6: why a kernel is slower than
its memory traffic allows).

Compiles ``_decode_linear_kernel`` (the first formulation, ``scripts/decode_planes.py``) and
``decode_kernels._decode_pairs_kernel`` (the fp16x2 pair kernel the backend runs) for sm_90 with Triton's
bundled compiler (no device needed) and prints one JSON line per configuration:
- the number of ``ttg.convert_layout`` / ``ttg.local_alloc`` ops inside the main loop of the Triton GPU IR
  (each one a round trip through shared memory; the first FMA formulation had eight per iteration, which is
  what made it slow on the H200);
- the PTX opcode mix, and for the pair kernel the SASS instructions of the K loop by opcode (``nvdisasm``),
  the number that bounds its issue rate.
The launcher's specializations are mirrored (16-byte aligned pointers, N/K divisible by 16): without them
the layouts differ from what the GPU run compiles. The TTGIR, PTX and SASS are written to ``--out``.

    python scripts/kernel_asm.py --out /tmp/kernel_asm [--arch 90]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re

from decode_planes import DECODE_PLANES_TYPES, _decode_linear_kernel

from minite_kernels.backends.triton.offline import (
    DECODE_PAIRS_TYPES,
    compile_offline,
    ops_in_loop,
    pair_constexprs,
)

#: (rows B = BLOCK_B, BLOCK_N, BLOCK_KW, warps, x_perm, tensor-core path, one_dot): the
#: launch defaults of decode_planes.decode_linear
CONFIGS = (
    (1, 8, 64, 4, True, False, False),
    (2, 8, 64, 4, True, False, False),
    (4, 8, 64, 4, True, False, False),
    (4, 8, 64, 4, False, False, False),
    (16, 64, 16, 4, True, True, False),
    (16, 128, 32, 4, True, True, False),
    (64, 128, 32, 4, True, True, True),
)


def _ptx_mix(ptx: str) -> dict:
    ops = collections.Counter()
    for line in ptx.splitlines():
        m = re.match(r"\s+(?:@%p\d+\s+)?([a-z][a-z0-9]*)[.\s]", line)
        if m:
            ops[m.group(1)] += 1
    return dict(ops.most_common(16))


#: integer arguments the launcher specializes as divisible by 16 at the benchmark shapes
_DIV16 = ("N", "K")
#: pair kernel (rows B = BLOCK_B, BLOCK_N, BLOCK_KB, warps, pipeline stages, register double buffer): the
#: launch defaults (wide weights at 1, 2, 4 rows; long K; q; o at 4 rows), then earlier defaults for comparison
PAIR_CONFIGS = (
    (1, 16, 32, 4, 1, True),
    (2, 16, 32, 4, 1, False),
    (4, 16, 32, 4, 1, False),
    (1, 4, 128, 4, 1, True),
    (1, 16, 64, 4, 1, True),
    (4, 8, 64, 4, 1, False),
    (1, 8, 64, 4, 3, False),
    (1, 4, 128, 4, 2, False),
    (1, 16, 32, 4, 1, False),
)


def _sass_loop_mix(cubin: bytes, path: str) -> dict:
    """SASS opcodes between the first loop label and its backward branch (``nvdisasm`` bundled with
    Triton); empty when the disassembler is missing."""
    import subprocess

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with open(path + ".cubin", "wb") as f:
        f.write(cubin)
    try:
        sass = subprocess.run(
            [tool, "-c", path + ".cubin"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    with open(path + ".sass", "w") as f:
        f.write(sass)
    labels = re.findall(r"^(\.L_x_\d+):", sass, flags=re.MULTILINE)
    ops = collections.Counter()
    for label in labels:  # the loop body starts at the label its backward branch targets
        start = sass.index(label + ":")
        end = sass.find(f"BRA `({label})", start)
        if end < 0:
            continue
        for line in sass[start:end].splitlines():
            m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", line)
            if m:
                ops[m.group(1)] += 1
        break
    return {"total": sum(ops.values()), **dict(ops.most_common(12))}


def _report(ck, name: str, args, sass: bool = False) -> None:
    for ext in ("ttgir", "ptx"):
        with open(os.path.join(args.out, f"{name}.{ext}"), "w") as f:
            f.write(ck.get(ext, "") or "")
    ttgir = ck.get("ttgir") or ""
    rec = {
        "kernel": name,
        "arch": args.arch,
        "convert_layouts_in_loop": ops_in_loop(ttgir, "ttg.convert_layout"),
        "shared_stores_in_loop": ops_in_loop(ttgir, "ttg.local_alloc"),
        "convert_layouts_total": ttgir.count("ttg.convert_layout"),
        "shared_mem_bytes": ck.get("shared"),
        "ptx_mix": _ptx_mix(ck.get("ptx") or ""),
    }
    if sass and ck.get("cubin"):
        rec["sass_loop"] = _sass_loop_mix(ck["cubin"], os.path.join(args.out, name))
    print(json.dumps(rec), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="kernel_asm")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for (90: Hopper)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from minite_kernels.backends.triton import decode_kernels as dec

    for bb, bn, bkw, warps, perm, use_dot, one_dot in CONFIGS:
        const = {
            "BLOCK_N": bn,
            "BLOCK_KW": bkw,
            "BLOCK_B": bb,
            "SPLIT": 1,
            "USE_DOT": use_dot,
            "DOT_F32": False,
            "X_PERM": perm,
            "ONE_DOT": one_dot,
        }
        ck = compile_offline(
            _decode_linear_kernel,
            DECODE_PLANES_TYPES,
            const,
            warps=warps,
            arch=args.arch,
            divisible_by_16=_DIV16 + ("kw_per_split",),
        )
        _report(ck, f"b{bb}_{bn}x{bkw}w{warps}{'p' if perm else ''}{'o' if one_dot else ''}", args)
    for bb, bn, bkb, warps, stages, prefetch in PAIR_CONFIGS:
        ck = compile_offline(
            dec._decode_pairs_kernel,
            DECODE_PAIRS_TYPES,
            pair_constexprs(bn, bkb, bb, stages=stages, prefetch=prefetch),
            warps=warps,
            arch=args.arch,
            divisible_by_16=_DIV16 + ("kb_per_split",),
        )
        _report(ck, f"pairs_b{bb}_{bn}x{bkb}w{warps}{'r' if prefetch else f's{stages}'}", args, sass=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

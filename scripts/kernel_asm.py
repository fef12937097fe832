"""What the decode kernels compile to (profiling aid for issue #6: why a kernel is slower than its memory
traffic allows). Prints one JSON line per configuration: registers, spills, the number of
``ttg.convert_layout`` ops in the Triton GPU IR (each one a round trip through shared memory: eight per
loop iteration was what made the first FMA formulation slow) and the PTX opcode mix; writes the TTGIR,
PTX (and SASS where Triton provides it) into ``--out``.

    python scripts/kernel_asm.py --out /tmp/asm
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re

import torch


def _mix(ptx: str) -> dict:
    ops = collections.Counter()
    for line in ptx.splitlines():
        m = re.match(r"\s+(?:@%p\d+\s+)?([a-z][a-z0-9]*)[.\s]", line)
        if m:
            ops[m.group(1)] += 1
    return dict(ops.most_common(24))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="kernel_asm")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from minite_kernels.backends.triton import decode as dec
    from minite_kernels.backends.triton import quantize_nvfp4_triton

    n, k = 9728, 2560
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    wd, ws, wa, *_ = quantize_nvfp4_triton(w, per_token=False, tile16=True)
    for b, bn, bkw, nw, perm in ((1, 16, 64, 4, False), (4, 16, 64, 4, False), (16, 128, 32, 4, True)):
        one = b > 4
        x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)
        q = quantize_nvfp4_triton(x, per_token=True, write_packed=False, write_qs=True)
        xin = dec.permute_for_decode(q.qs) if perm else q.qs
        dec.decode_linear(
            xin, q.amax, wd, ws, wa, block_n=bn, block_kw=bkw, num_warps=nw, x_perm=perm, one_dot=one
        )
        ck = dec.LAST_KERNEL["v2"]
        name = f"b{b}_{bn}x{bkw}w{nw}{'p' if perm else ''}"
        ptx = ck.asm.get("ptx") or ""
        for ext in ("sass", "ttgir", "ptx"):
            with open(os.path.join(args.out, f"{name}.{ext}"), "w") as f:
                f.write(ck.asm.get(ext, "") or "")
        print(
            json.dumps(
                {
                    "kernel": name,
                    "n_regs": getattr(ck, "n_regs", None),
                    "n_spills": getattr(ck, "n_spills", None),
                    "convert_layouts": (ck.asm.get("ttgir") or "").count("ttg.convert_layout"),
                    "ptx_mix": _mix(ptx),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Instruction mix of the decode kernels' compiled SASS (profiling aid for issue #6: why a kernel is slower
than its memory traffic allows). Prints one JSON line per configuration: opcode counts of the whole kernel,
registers, spills, and the Triton GPU IR layouts; writes the full SASS/TTGIR next to ``--out``.

    python scripts/kernel_asm.py --out /tmp/asm
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re

import torch


def _mix(sass: str) -> dict:
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return dict(ops.most_common())


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
        sass = ck.asm.get("sass") or ""
        for ext in ("sass", "ttgir", "ptx"):
            with open(os.path.join(args.out, f"{name}.{ext}"), "w") as f:
                f.write(ck.asm.get(ext, "") or "")
        print(
            json.dumps(
                {
                    "kernel": name,
                    "n_regs": getattr(ck, "n_regs", None),
                    "n_spills": getattr(ck, "n_spills", None),
                    "sass_lines": sass.count("\n"),
                    "mix": _mix(sass),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

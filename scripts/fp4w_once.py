"""Run the FP4-weight GEMM a few times at one shape and configuration (a target for ``ncu``; no timing here).

    ncu --clock-control none -k regex:_fp4w_kernel -c 1 --section WarpStateStats python scripts/fp4w_once.py \
        --n 19456 --k 2560 --m 64 --config 'block_n=128,num_warps=8,split=2'
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from minite_kernels.backends.triton import fp4w as F


def parse_config(text: str) -> F.FP4WConfig:
    """``key=value,...`` over :class:`FP4WConfig`'s integer fields."""
    kw = {}
    for part in filter(None, text.split(",")):
        key, _, val = part.partition("=")
        kw[key] = int(val)
    return F.FP4WConfig(**kw)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--config", default="")
    p.add_argument("--calls", type=int, default=3)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(a.n, a.k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    from minite_kernels.backends.triton.quantize import quantize_nvfp4_triton

    q = quantize_nvfp4_triton(w, per_token=False)
    pk = F.FP4Weight.empty(a.n, a.k, "cuda")
    pk.copy_rows_(0, q.data, q.scales, q.amax)
    x = torch.randn(a.m, a.k, device="cuda", dtype=torch.bfloat16, generator=g)
    cfg = parse_config(a.config)
    for _ in range(a.calls):
        F.fp4w_linear(x, pk, None, cfg)
    torch.cuda.synchronize()
    print(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark the Triton NVFP4 kernels against BF16 torch, the emulated torch reference and torchao.

Every case prints one JSON line (``{"bench": ..., "case": ..., ...ratios}``) and appends it to ``--out``.
Timings come from ``timing.gpu_ms``: Triton's ``do_bench`` (CUDA events, L2 flushed between repetitions,
median), or CUDA-graph replay for the decode cases, whose kernels are a few microseconds long. Each section is a
file of ``kernel_bench/``; this file only parses the arguments and runs the sections asked for.

    python scripts/bench_kernels.py --only copy,quantize,linear,decode,logprobs,weight_sync,optim,model

Sections:
  copy         device copy bandwidth (8192x8192 bf16 and 1 GiB), the ceiling for the memory-bound kernels
  quantize     NVFP4 quantize of 8192x8192 bf16: fraction of copy bandwidth (bytes read + written)
  linear       W4A4 linear at Qwen3-4B shapes (4096 tokens): fwd and fwd+bwd vs BF16, emulated, torchao
  decode       packed-FP4 decode linear at batch 1/4/16 vs BF16 F.linear (scripts/bench_decode.py: the pair
               kernel against the first formulation, with its launch sweep)
  logprobs     log-probs + entropy, vocab 151,936, 8 x 4096 tokens: peak memory and time vs naive
  weight_sync  re-quantize all linears of a Qwen3-1.7B-shaped model: ms per billion params, bandwidth
  optim        AdamW that records each weight's amax, against torch's fused AdamW, and the sync it feeds
  model        fwd+bwd of a random Qwen3-1.7B-shaped model, seq 4096: bf16 vs NVFP4 recipes
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from kernel_bench import common  # scripts/ is on sys.path when run as a script
from kernel_bench.decode import bench_decode
from kernel_bench.linear import bench_linear
from kernel_bench.logprobs import bench_logprobs
from kernel_bench.memory import bench_copy, bench_quantize
from kernel_bench.model import bench_model
from kernel_bench.weights import bench_optim, bench_weight_sync

SECTIONS = {
    f.__name__: f
    for f in (
        bench_copy,
        bench_quantize,
        bench_linear,
        bench_decode,
        bench_logprobs,
        bench_weight_sync,
        bench_optim,
        bench_model,
    )
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of: {', '.join(SECTIONS)}")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--lp-tokens", type=int, default=8 * 4096)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--model-emulated", action="store_true")
    p.add_argument(
        "--model-rounds",
        type=int,
        default=1,
        help="> 1: time bf16 / nvfp4 (each --model-variants value) in alternation this many rounds; medians",
    )
    p.add_argument(
        "--model-variants",
        default="MINITE_SAVE_ACTIVATIONS=dequantized,packed",
        help="VAR=V1,V2,...: the environment switch whose values the interleaved model bench compares",
    )
    p.add_argument("--decode-sweep", action="store_true", help="time several decode block configs")
    p.add_argument(
        "--decode-batches",
        type=lambda v: [int(b) for b in v.split(",")],
        default=[1, 4, 16],
        help="comma list of decode batch sizes (default 1,4,16: the issue's)",
    )
    p.add_argument("--optim-sweep", action="store_true", help="optim: sweep the AdamW kernel's launch sizes")
    p.add_argument("--profile", action="store_true", help="profile one model step (CPU- vs GPU-bound)")
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="model: where the host time of a step goes (use a tiny --seq); cProfile and op tables on stderr",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "kernels", "error": "needs a CUDA GPU"}))
        return 2
    common.set_out(args.out)
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}")
    import triton

    common.emit(
        {
            "bench": "env",
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    args.copy_gbps = None
    for name in names:
        SECTIONS[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time the NVFP4 quantizers whose E2M1 encode is ``nvfp4_jit._e2m1_rn`` (issue #42: the encode written once),
checking their bytes against the reference on the way.

The BF16 fast path (``quantize_bf16.py``) is not timed here: its source changed only in where the encode is
imported from, and ``--sass`` checks that its per-token kernel compiles to the same machine code. What changed
are the generic kernels (fp32 inputs, stochastic rounding) and the decode activation quantizer
(``quantize_for_decode``). Run it once per tree, the trees taking turns, to compare an older encode with this
one on the same machine:

    python scripts/bench_encode.py --out encode.jsonl                       # this tree
    PYTHONPATH=.ab/REV python scripts/bench_encode.py --out encode.jsonl    # the kernels of .ab/REV

One JSON line per case: ``{"bench": "encode", "case", "tree", "us", "bytes_equal"}``; ``tree`` is the folder
``minite_kernels`` was imported from. Cases: 4096 x 4096 fp32 per token and per tensor (1x16, 16x16), with
``qs``, and per token with stochastic rounding (``do_bench``, L2 flushed); the decode quantizer at 1, 16 and
64 rows of K = 2560 and 9728 (CUDA-graph replay: a few microseconds each). Exits 1 if any bytes differ.

    TRITON_INTERPRET=1 python scripts/bench_encode.py --check   # CPU: the same cases at tiny sizes, bytes only
    python scripts/bench_encode.py --sass   # CPU: machine instructions of each kernel, compiled for sm_90 offline
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch


def _heavy(m: int, k: int, seed: int, device: str, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))
    return x.to(dtype).to(device)


def _tree() -> str:
    """The folder ``minite_kernels`` is imported from: this tree, or an older one first on ``PYTHONPATH``."""
    import minite_kernels

    return str(pathlib.Path(minite_kernels.__file__).resolve().parents[1])


def _equal(out, ref) -> bool:
    return torch.equal(out.data.cpu(), ref.data) and torch.equal(
        out.scales.view(torch.uint8).cpu(), ref.scales.view(torch.uint8)
    )


def run(out_path: str | None, *, check: bool = False) -> list[dict]:
    """Every case's row; ``check``: tiny sizes on the CPU (Triton's interpreter), bytes only (``us`` None)."""
    from timing import gpu_ms, gpu_us  # scripts/ is on sys.path when run as a script

    from minite_kernels.backends.triton import quantize_for_decode, quantize_nvfp4_triton
    from minite_kernels.formats import quantize_nvfp4, random_bytes

    tree = _tree()
    dev = "cpu" if check else "cuda"
    rows: list[dict] = []

    def emit(case: str, fn, equal: bool, *, graph: bool = False) -> None:
        us = None if check else round(gpu_us(fn) if graph else 1e3 * gpu_ms(fn), 3)
        rec = {"bench": "encode", "case": case, "tree": tree, "us": us, "bytes_equal": equal}
        rows.append(rec)
        print(json.dumps(rec), flush=True)

    n = 32 if check else 4096
    x = _heavy(n, n, seed=0, device=dev)
    for name, kw, scaling, tile in (
        ("fp32_per_token_1x16+qs", {"per_token": True, "write_qs": True}, "per_token", (1, 16)),
        ("fp32_per_tensor_1x16+qs", {"per_token": False, "write_qs": True}, "per_tensor", (1, 16)),
        ("fp32_per_tensor_16x16", {"per_token": False, "tile16": True}, "per_tensor", (16, 16)),
    ):
        ref = quantize_nvfp4(x.cpu(), scaling=scaling, tile=tile)
        equal = _equal(quantize_nvfp4_triton(x, **kw), ref)
        emit(name, lambda kw=kw: quantize_nvfp4_triton(x, **kw), equal)
    rb = random_bytes(x.shape, generator=torch.Generator().manual_seed(1), device="cpu")
    gen = torch.Generator().manual_seed(1)
    ref = quantize_nvfp4(x.cpu(), scaling="per_token", rounding="stochastic", generator=gen)
    rb = rb.to(dev)
    equal = _equal(quantize_nvfp4_triton(x, per_token=True, rbits=rb), ref)
    emit("fp32_per_token_1x16_sr", lambda: quantize_nvfp4_triton(x, per_token=True, rbits=rb), equal)

    for k in (80,) if check else (2560, 9728):
        for b in (1, 3) if check else (1, 16, 64):
            h = _heavy(b, k, seed=k + b, device=dev, dtype=torch.bfloat16)
            equal = _equal(quantize_for_decode(h, pdl=False)[0], quantize_nvfp4(h.cpu(), scaling="per_token"))
            emit(f"decode_quant_b{b}_k{k}", lambda h=h: quantize_for_decode(h, pdl=False), equal, graph=True)
    if out_path:
        with open(out_path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


#: the argument types the offline compile specializes (``offline.compile_offline``): fp32 into the generic
#: quantizers (BF16 takes the word-wise path), bf16 activations into the decode quantizer
_TOKEN_TYPES = {"x_ptr": "*fp32", "data_ptr": "*u8", "scales_ptr": "*u8", "qs_ptr": "*bf16", "amax_out_ptr": "*fp32",
                "rbits_ptr": "*u8", "M": "i32", "K": "i32", "stride_m": "i32", "stride_k": "i32"}
_ACT_TYPES = {"x_ptr": "*bf16", "xp_ptr": "*i32", "data_ptr": "*u8", "scales_ptr": "*u8", "amax_ptr": "*fp32",
              "nonfinite_ptr": "*i1", "K": "i32", "stride_x": "i32"}


def sass_counts() -> dict[str, int]:
    """Machine instructions (``cuobjdump -sass`` lines, padding included) of the kernels this benchmark times, at
    the launch parameters the library uses, compiled for sm_90 without a GPU."""
    from minite_kernels.backends.triton import decode_kernels as dk
    from minite_kernels.backends.triton import quantize_kernels as qk
    from minite_kernels.backends.triton.offline import compile_offline, sass

    def n(kernel, types, constexprs, warps=4) -> int:
        return len(sass(compile_offline(kernel, types, constexprs, warps=warps)["cubin"]))

    out = {}
    for sr in (False, True):
        for qs in (False, True):
            flags = {"SR": sr, "WRITE_PACKED": True, "WRITE_QS": qs}
            out[f"per_token sr={sr} qs={qs}"] = n(qk._quantize_per_token_kernel, _TOKEN_TYPES,
                                                  {"BLOCK_M": 1, "BLOCK_K": 256, **flags})
            out[f"per_tensor sr={sr} qs={qs}"] = n(qk._quantize_per_tensor_kernel,
                                                   {**_TOKEN_TYPES, "scratch_ptr": "*i32"},
                                                   {"BLOCK_M": 8, "BLOCK_K": 256, "TILE16": False, **flags})
    for nb in (256, 1024):  # K = 2560 and 9728 (next power of two of K / 16)
        out[f"decode_quant NB={nb}"] = n(dk._pairs_act_quant_kernel, _ACT_TYPES, {"NB": nb, "CH": 32, "PDL": False},
                                         warps=4 if nb <= 256 else 8)
    return out


def bf16_sass_digests() -> dict[str, str]:
    """A digest of the machine code of the BF16 word-wise quantizers (``quantize_bf16.py``), which this benchmark does
    not time: equal digests from two trees mean the same kernels."""
    import hashlib

    from minite_kernels.backends.triton import quantize_bf16 as qb
    from minite_kernels.backends.triton.offline import compile_offline, sass

    token = {"xw_ptr": "*i32", "data_ptr": "*i32", "scales_ptr": "*u8", "qs_ptr": "*i32", "deq_ptr": "*i32",
             "amax_ptr": "*fp32", "nonfinite_ptr": "*i1", "rb_ptr": "*i16", "M": "i32", "KW": "i32", "stride_w": "i32"}
    out = {}
    for sr in (False, True):
        for qs, deq in ((False, False), (True, False), (False, True)):
            cx = {"BLOCK_M": 2, "NB": 128, "ALIGN4": True, "SR": sr, "WRITE_PACKED": True, "WRITE_QS": qs,
                  "WRITE_DEQ": deq, "RNE_INT": False}
            ops = sass(compile_offline(qb._quant_token_kernel_bf16, token, cx)["cubin"])
            out[f"bf16_token sr={sr} qs={qs} deq={deq}"] = hashlib.sha1("\n".join(ops).encode()).hexdigest()[:12]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.add_argument("--check", action="store_true", help="tiny sizes, bytes only (CPU, under TRITON_INTERPRET=1)")
    p.add_argument("--sass", action="store_true", help="machine instruction counts, compiled offline (no GPU)")
    args = p.parse_args(argv)
    if args.sass:
        print(json.dumps({"bench": "encode_sass", "tree": _tree(), "instructions": sass_counts(),
                          "bf16_sass_sha1": bf16_sass_digests()}))
        return 0
    if args.check and os.environ.get("TRITON_INTERPRET") != "1":
        print("--check runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    if not args.check and not torch.cuda.is_available():
        print("bench_encode.py times compiled kernels and needs a CUDA GPU (or --check on the CPU)", file=sys.stderr)
        return 2
    rows = run(args.out, check=args.check)
    return 0 if all(r["bytes_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

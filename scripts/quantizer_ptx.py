"""The quantizer kernels' PTX for sm_90, compiled here without a GPU, to show that a refactor of their Triton
source changed no instruction (issue #42: the NVFP4 block scale written once, ``nvfp4_jit._block_scale``).

Compiles each NVFP4 quantizer kernel (the fp32 generic ones, the BF16 ones, the weight-sync grouped one, the
decode path's activation quantizer) at representative constexprs with ``offline.compile_offline`` and writes its
PTX without the DWARF debug sections, whose label numbers move with the source lines. Identical PTX means
identical SASS, so no timing can differ.

    python scripts/quantizer_ptx.py dump /tmp/ptx/after                 # this tree
    PYTHONPATH=<other tree> python scripts/quantizer_ptx.py dump /tmp/ptx/before
    python scripts/quantizer_ptx.py compare /tmp/ptx/before /tmp/ptx/after   # JSON: instructions, lines differing
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

_TOKEN = {"xw_ptr": "*i32", "data_ptr": "*i32", "scales_ptr": "*u8", "qs_ptr": "*i32", "deq_ptr": "*i32",
          "amax_ptr": "*fp32", "nonfinite_ptr": "*i8", "rb_ptr": "*i16", "M": "i32", "KW": "i32", "stride_w": "i32"}
_FP32 = {"x_ptr": "*fp32", "data_ptr": "*u8", "scales_ptr": "*u8", "qs_ptr": "*bf16", "amax_out_ptr": "*fp32",
         "rbits_ptr": "*u8", "M": "i32", "K": "i32", "stride_m": "i32", "stride_k": "i32"}
_PAIRS = {"x_ptr": "*bf16", "xp_ptr": "*i32", "data_ptr": "*u8", "scales_ptr": "*u8", "amax_ptr": "*fp32",
          "nonfinite_ptr": "*i1", "K": "i32", "stride_x": "i32"}
_BF16_FLAGS = {"WRITE_QS": False, "RNE_INT": False}


def cases() -> dict:
    from minite_kernels.backends.triton import decode_kernels as D
    from minite_kernels.backends.triton import quantize_bf16 as Q
    from minite_kernels.backends.triton import quantize_kernels as F

    return {
        "token_bf16_deq": (Q._quant_token_kernel_bf16, _TOKEN, dict(
            BLOCK_M=16, NB=32, NB2=0, ALIGN4=True, SR=False, WRITE_PACKED=True, WRITE_DEQ=True, **_BF16_FLAGS)),
        "token_bf16_sr_split": (Q._quant_token_kernel_bf16, _TOKEN, dict(
            BLOCK_M=4, NB=128, NB2=32, ALIGN4=True, SR=True, WRITE_PACKED=True, WRITE_QS=True, WRITE_DEQ=False,
            RNE_INT=False)),
        "tensor_bf16_16x16": (Q._quant_tensor_kernel_bf16, dict(_TOKEN, scratch_ptr="*i32"), dict(
            BLOCK_M=16, NB=32, ALIGN4=True, TILE16=True, SR=False, WRITE_PACKED=True, WRITE_QS=True, WRITE_DEQ=True,
            RNE_INT=False)),
        "grouped_sync": (Q._grouped_quant_kernel, {"tab_ptr": "*i64", "qmap_ptr": "*i32", "scratch_ptr": "*i32"},
                         dict(BLOCK_M=16, NB=32, TILE16=True, WRITE_DEQ=True, **_BF16_FLAGS)),
        "fp32_tensor_16x16": (F._quantize_per_tensor_kernel, dict(_FP32, scratch_ptr="*i32"), dict(
            BLOCK_M=16, BLOCK_K=64, TILE16=True, SR=False, WRITE_PACKED=True, WRITE_QS=True)),
        "fp32_tensor_sr": (F._quantize_per_tensor_kernel, dict(_FP32, scratch_ptr="*i32"), dict(
            BLOCK_M=16, BLOCK_K=64, TILE16=False, SR=True, WRITE_PACKED=True, WRITE_QS=False)),
        "fp32_token": (F._quantize_per_token_kernel, _FP32, dict(
            BLOCK_M=8, BLOCK_K=64, SR=False, WRITE_PACKED=True, WRITE_QS=True)),
        "decode_pairs_quant": (D._pairs_act_quant_kernel, _PAIRS, dict(NB=256, CH=32, PDL=False)),
    }


def code_lines(ptx: str) -> list[str]:
    """The PTX without comments, ``.loc``/``.file`` directives and the DWARF sections' data (``.b8``..``.b64``)."""
    skip = (".loc", ".file", "//", ".section", ".b8", ".b16", ".b32", ".b64", "$L__")
    return [ln for ln in (raw.split("//")[0].rstrip() for raw in ptx.splitlines()) if ln.strip()
            and not ln.strip().startswith(skip)]


def dump(out: pathlib.Path) -> dict:
    from minite_kernels.backends.triton.offline import compile_offline

    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, (kernel, types, constexprs) in cases().items():
        lines = code_lines(compile_offline(kernel, types, constexprs)["ptx"])
        (out / f"{name}.ptx").write_text("\n".join(lines) + "\n")
        counts[name] = sum(1 for ln in lines if not ln.strip().startswith((".", "{", "}")))
    return counts


def compare(a: pathlib.Path, b: pathlib.Path) -> dict:
    res = {}
    for fa in sorted(a.glob("*.ptx")):
        la, lb = fa.read_text().splitlines(), (b / fa.name).read_text().splitlines()
        res[fa.stem] = {"lines": [len(la), len(lb)], "identical": la == lb,
                        "lines_differing": sum(x != y for x, y in zip(la, lb)) + abs(len(la) - len(lb))}
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    if args.what == "dump":
        print(json.dumps({"bench": "quantizer_ptx", "instructions": dump(pathlib.Path(args.out))}))
    else:
        print(json.dumps({"bench": "quantizer_ptx_compare", "kernels": compare(pathlib.Path(args.a),
                                                                               pathlib.Path(args.b))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The register layouts Triton gives hot kernels, checked without a GPU (issue #6): the BF16 quantize tiles,
and the K loop of the pair decode kernel (at the end of the file).

Triton's coalescing pass orders the tile axes by contiguity and breaks ties by axis index. When the tiles were
row-major ``[rows, blocks, 4 words]``, the lanes of a warp therefore went down the rows
(``threadsPerWarp = [16, 2, 1]``): a warp's 16-byte load touched 16 cache lines for 512 useful bytes, which
capped the weight-sync pass at 75% of copy bandwidth (benchmarks/RESULTS.md, issue #6). The tiles are now
block-major ``[blocks, rows, 4]``. This test compiles the kernels for sm_90 with Triton's bundled compiler
and checks that the 16-byte load tile puts all 32 lanes along the blocks.
"""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

from minite_kernels.backends.triton import quantize_bf16 as Q
from minite_kernels.backends.triton.offline import (
    DECODE_PAIRS_TYPES,
    compile_offline,
    first_global_access,
    moving_conversions_in_loop,
    pair_constexprs,
)

_TOKEN_TYPES = {
    "xw_ptr": "*i32",
    "data_ptr": "*i32",
    "scales_ptr": "*u8",
    "qs_ptr": "*i32",
    "deq_ptr": "*i32",
    "amax_ptr": "*fp32",
    "nonfinite_ptr": "*i8",
    "rb_ptr": "*i16",
    "M": "i32",
    "KW": "i32",
    "stride_w": "i32",
}
_GROUPED_TYPES = {"tab_ptr": "*i64", "qmap_ptr": "*i32", "scratch_ptr": "*i32"}
_FLAGS = {"WRITE_QS": False, "WRITE_DEQ": False, "RNE_INT": False}


def _ttgir(kernel, types: dict, constexprs: dict, warps: int) -> str:
    return compile_offline(kernel, types, constexprs, warps=warps)["ttgir"]


def _load_tile_lanes(ttgir: str) -> list[int]:
    """threadsPerWarp of the 3-D layout whose threads hold 4 consecutive words (the 16-byte loads)."""
    for m in re.finditer(
        r"#ttg\.blocked<\{sizePerThread = \[1, 1, 4\], threadsPerWarp = \[([0-9, ]+)\]", ttgir
    ):
        return [int(v) for v in m.group(1).split(",")]
    raise AssertionError("no [1, 1, 4] blocked layout in the TTGIR")


@pytest.mark.parametrize(
    "kernel,types,constexprs,warps",
    [
        # the weight-sync pass: 16 x 32-block tiles, the library's defaults
        (
            Q._grouped_quant_kernel,
            _GROUPED_TYPES,
            dict(BLOCK_M=16, NB=32, TILE16=True, **_FLAGS),
            4,
        ),
        # per-tensor 1x16: 8 rows x 32 blocks
        (
            Q._quant_tensor_kernel_bf16,
            dict(_TOKEN_TYPES, scratch_ptr="*i32"),
            dict(BLOCK_M=8, NB=32, ALIGN4=True, TILE16=False, SR=False, WRITE_PACKED=True, **_FLAGS),
            4,
        ),
        # per-token, short rows (K = 512): 16 rows per program
        (
            Q._quant_token_kernel_bf16,
            _TOKEN_TYPES,
            dict(BLOCK_M=16, NB=32, NB2=0, ALIGN4=True, SR=False, WRITE_PACKED=True, **_FLAGS),
            4,
        ),
    ],
    ids=["grouped_16x16", "tensor_1x16", "token_16_rows"],
)
def test_lanes_run_along_the_blocks(kernel, types, constexprs, warps):
    lanes = _load_tile_lanes(_ttgir(kernel, types, constexprs, warps))
    assert lanes == [32, 1, 1], (
        f"threadsPerWarp {lanes}: the lanes must span the blocks (axis 0), not the rows"
    )


# --- the pair decode kernel ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bn,bkb,bb,stages,prefetch",
    [
        (16, 32, 1, 1, True),
        (4, 128, 1, 1, True),
        (4, 128, 2, 1, True),
        (16, 64, 1, 1, True),
        (8, 64, 4, 1, False),
        (16, 32, 2, 1, False),
        (16, 32, 4, 1, False),
        (8, 64, 1, 3, False),
    ],
    ids=["wide_b1", "long_k_b1", "long_k_b2", "q_b1", "o_b4", "wide_b2", "wide_b4", "pipelined"],
)
def test_pair_decode_loop_stays_in_registers(bn, bkb, bb, stages, prefetch):
    """The K loop of the pair kernel at the launch defaults: no layout conversion inside it that moves data
    (the 4 x 128-block tiles keep one between register-equivalent layouts, which lowers to nothing). Loading each
    block's 8 activation pair words as one [blocks, 8] tile and splitting it made Triton move the tile
    through shared memory every iteration (4 barriers per iteration at batch 1, RESULTS.md, issue #6); the
    kernel loads them as 8 rows of ``[B, 8, K/16]`` instead. The packed fp16x2 product
    (inline PTX) must reach the compiled code, the pipelined configuration must use asynchronous copies and
    the register double buffer (the other launch defaults) none."""
    from minite_kernels.backends.triton import decode_kernels as D

    asm = compile_offline(
        D._decode_pairs_kernel,
        DECODE_PAIRS_TYPES,
        pair_constexprs(bn, bkb, bb, stages=stages, prefetch=prefetch),
        # what the launcher specializes for the model shapes: sizes divisible by 16
        divisible_by_16=("N", "K", "kb_per_split"),
    )
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    assert moving_conversions_in_loop(ttgir) == []
    assert ptx.count("fma.rn.f16x2") >= 7 * bb  # 7 fused + 1 multiply per block and activation row
    assert ("async_copy_global_to_local" in ttgir) == (stages > 1)


# --- programmatic dependent launch on the decode path ------------------------------------------------------

_PAIR_QUANT_TYPES = {
    "x_ptr": "*bf16",
    "xp_ptr": "*i32",
    "data_ptr": "*u8",
    "scales_ptr": "*u8",
    "amax_ptr": "*fp32",
    "nonfinite_ptr": "*i1",
    "K": "i32",
    "stride_x": "i32",
}


def _params_behind(ptx: str, kernel, types: dict, reg: str) -> set[str]:
    """The kernel arguments whose value flows into PTX register ``reg`` (its definitions traced back to
    ``ld.param``; argument ``i`` of the listing is the ``i``-th non-constexpr argument)."""
    params = [n for n in kernel.arg_names if n in types]
    defs: dict[str, list[str]] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+(%\w+),\s*(.*);", line)
        if m:
            op, dst, rest = m.groups()
            if op.startswith("ld.param"):
                defs.setdefault(dst, []).append("param:" + params[int(re.search(r"param_(\d+)", rest)[1])])
            else:
                defs.setdefault(dst, []).extend(re.findall(r"%\w+", rest))
    found, todo, seen = set(), [reg], set()
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        for src in defs.get(r, []):
            (found.add(src[6:]) if src.startswith("param:") else todo.append(src))
    return found


def test_params_behind_traces_addresses():
    """The tracer on a synthetic listing: an address built from two arguments reaches both."""
    ptx = """
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u32 	%r1, [k_param_1];
	mul.wide.s32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	@%p1 ld.global.b32 { %r2 }, [ %rd3 + 0 ];
"""

    class K:
        arg_names = ("a", "n", "c")

    assert _params_behind(ptx, K, {"a": "*i32", "c": "i32"}, "%rd3") == {"a", "c"}
    assert _params_behind(ptx, K, {"a": "*i32", "c": "i32"}, "%rd1") == {"a"}


def test_pair_decode_reads_only_weights_before_the_wait():
    """With ``PDL`` and the register double buffer the first weight tile is loaded before
    ``griddepcontrol.wait`` (the weights are not written by the kernel it waits for); every load before the
    wait must take its address from the weight or scale pointer alone, never from the activations."""
    from minite_kernels.backends.triton import decode_kernels as D

    cx = {
        "BLOCK_N": 4,
        "BLOCK_KB": 128,
        "BLOCK_B": 2,
        "SPLIT": 1,
        "INTERP": False,
        "STAGES": 1,
        "PREFETCH": True,
    }
    ptx = compile_offline(D._decode_pairs_kernel, DECODE_PAIRS_TYPES, dict(cx, PDL=True))["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    early = re.findall(r"ld\.global[\w.]*\s+\{[^}]*\},\s*\[\s*(%rd\d+)", ptx[:wait])
    assert len(early) == 8 + 4  # 4 x 128 tile: 2 weight words and one scale byte per thread and row
    for reg in early:
        assert _params_behind(ptx, D._decode_pairs_kernel, DECODE_PAIRS_TYPES, reg) <= {
            "w_ptr",
            "ws_ptr",
            "N",
            "K",
            "kb_per_split",
        }, reg
    assert ptx.index("griddepcontrol.launch_dependents") < min(ptx.index(m) for m in early)


@pytest.mark.parametrize("split,bn,stages", [(1, 8, 2), (2, 16, 1)], ids=["one_split", "split_k"])
def test_pair_decode_waits_before_reading(split, bn, stages):
    """With ``PDL`` the pair kernel may start while the kernel that writes its activations still runs. Before
    ``griddepcontrol.wait`` it may only prefetch its weights into L2 (one bulk prefetch for the weight bytes
    and one for the scales per contiguous range: 2 with one split, 2 per row with split-K); every load comes
    after the wait. Without ``PDL`` no grid dependency control is compiled at all."""
    from minite_kernels.backends.triton import decode_kernels as D

    cx = {"BLOCK_N": bn, "BLOCK_KB": 32, "BLOCK_B": 1, "SPLIT": split, "INTERP": False, "STAGES": stages}
    ptx = compile_offline(D._decode_pairs_kernel, DECODE_PAIRS_TYPES, dict(cx, PDL=True))["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < wait < first_global_access(ptx)
    prefetches = [m.start() for m in re.finditer(r"cp\.async\.bulk\.prefetch\.L2\.global", ptx)]
    assert len(prefetches) == (2 if split == 1 else 2 * bn) and max(prefetches) < wait
    off = compile_offline(D._decode_pairs_kernel, DECODE_PAIRS_TYPES, dict(cx, PDL=False))["ptx"]
    assert "griddepcontrol" not in off and "prefetch" not in off


def test_pair_quantizer_waits_before_reading():
    """The activation quantizer lets its dependent launch at once and reads ``x`` only after the wait."""
    from minite_kernels.backends.triton import decode_kernels as D

    ptx = compile_offline(D._pairs_act_quant_kernel, _PAIR_QUANT_TYPES, {"NB": 256, "CH": 32, "PDL": True})[
        "ptx"
    ]
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < wait < first_global_access(ptx)


def test_moving_conversions_tells_register_equivalent_layouts_apart():
    """A 1-D layout into a slice of a parent that spreads the same way moves nothing; a parent that also
    spreads threads along the sliced dimension, or a 2-D to 2-D conversion, moves data."""
    one_d = "sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]"
    rows = "sizePerThread = [1, 1], threadsPerWarp = [1, 32], warpsPerCTA = [1, 4], order = [1, 0]"
    two_rows = "sizePerThread = [1, 1], threadsPerWarp = [2, 16], warpsPerCTA = [1, 4], order = [1, 0]"
    vec, tile = "tensor<128xf16", "tensor<4x128xf32"
    ttgir = f"""#a = #ttg.blocked<{{{one_d}}}>
#p = #ttg.blocked<{{{rows}}}>
#q = #ttg.blocked<{{{two_rows}}}>
scf.for %i = %c0 to %n step %c1 {{
  %0 = ttg.convert_layout %x : {vec}, #a> -> {vec}, #ttg.slice<{{dim = 0, parent = #p}}>>
  %1 = ttg.convert_layout %x : {vec}, #a> -> {vec}, #ttg.slice<{{dim = 0, parent = #q}}>>
  %2 = ttg.convert_layout %y : {tile}, #p> -> {tile}, #q>
  scf.yield
}}
%3 = ttg.convert_layout %y : {tile}, #p> -> {tile}, #q>
"""
    moving = moving_conversions_in_loop(ttgir)
    assert [m.split(" =")[0] for m in moving] == ["%1", "%2"]


_NORM_TYPES = {"h_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*bf16", "hout_ptr": "*bf16", "x_ptr": "*bf16",
               "deq_ptr": "*bf16", "M": "i32", "NBK": "i32", "inv_k": "fp32", "eps": "fp32"}
_SILU_TYPES = {"g_ptr": "*bf16", "u_ptr": "*bf16", "x_ptr": "*bf16", "deq_ptr": "*bf16", "M": "i32", "NBK": "i32",
               "stride_g": "i32", "stride_u": "i32"}


@pytest.mark.parametrize("nb,residual", [(64, True), (64, False), (160, True), (1024, True)])
def test_norm_quant_kernel_keeps_rows_in_registers(nb, residual):
    """``norm_quant._add_rms_norm_deq_kernel`` compiles for sm_90 with the BF16 quantizer's block-major load tile
    (32 lanes along the blocks) and moves no data between threads except its two row reductions."""
    from minite_kernels.backends.triton.norm_quant import _add_rms_norm_deq_kernel, _warps

    nb = triton.next_power_of_2(nb)
    warps = _warps(nb)

    ttgir = _ttgir(_add_rms_norm_deq_kernel, _NORM_TYPES,
                   {"NB": nb, "HAS_Y": residual, "WRITE_X": False, "RNE_INT": False}, warps)
    assert "ttg.convert_layout" not in ttgir
    lanes = _load_tile_lanes(ttgir)
    assert lanes[0] == 32, lanes


@pytest.mark.parametrize("nb", [192, 608])
def test_silu_mul_quant_kernel_keeps_rows_in_registers(nb):
    """``norm_quant._silu_mul_deq_kernel`` (MLP widths 3072 and 9728: 192 and 608 blocks) compiles for sm_90 with
    the block-major load tile and no layout conversion."""
    from minite_kernels.backends.triton.norm_quant import _silu_mul_deq_kernel, _warps

    nb = triton.next_power_of_2(nb)
    ttgir = _ttgir(_silu_mul_deq_kernel, _SILU_TYPES, {"NB": nb, "WRITE_X": False, "RNE_INT": False}, _warps(nb))
    assert "ttg.convert_layout" not in ttgir
    assert _load_tile_lanes(ttgir)[0] == 32


@pytest.mark.parametrize("which", ["add_rms_norm", "silu_mul"])
def test_norm_quant_kernels_let_the_next_kernel_launch_first(which):
    """With ``PDL`` the fused norm/SiLU kernels execute ``griddepcontrol.launch_dependents`` before they touch
    global memory, so the FP4-weight GEMM launched after them with programmatic dependent launch starts (and
    prefetches its weights) while they run. They are not launched with PDL themselves, so they do not wait.
    Without ``PDL`` no grid dependency control is compiled."""
    from minite_kernels.backends.triton import norm_quant as NQ

    if which == "add_rms_norm":
        kernel, types, cx = NQ._add_rms_norm_deq_kernel, _NORM_TYPES, {"NB": 256, "HAS_Y": True}
    else:
        kernel, types, cx = NQ._silu_mul_deq_kernel, _SILU_TYPES, {"NB": 1024}
    cx = dict(cx, WRITE_X=False, RNE_INT=False)
    warps = NQ._warps(cx["NB"])
    ptx = compile_offline(kernel, types, dict(cx, PDL=True), warps=warps)["ptx"]
    assert ptx.index("griddepcontrol.launch_dependents") < first_global_access(ptx)
    assert "griddepcontrol.wait" not in ptx
    off = compile_offline(kernel, types, dict(cx, PDL=False), warps=warps)["ptx"]
    assert "griddepcontrol" not in off


# --- the NVFP4 encode, written once ------------------------------------------------------------------------------


def test_every_quantizer_takes_its_block_scales_from_nvfp4_jit():
    """The block-scale step (s_b, its E4M3 byte, the encode factor) is ``nvfp4_jit._block_scale``: no kernel module
    rounds a block scale itself (``scripts/quantizer_ptx.py`` showed the merge changed no PTX instruction)."""
    import inspect

    from minite_kernels.backends.triton import decode_kernels, nvfp4_jit, quantize_bf16, quantize_kernels

    for mod in (quantize_kernels, quantize_bf16, decode_kernels):
        src = inspect.getsource(mod)
        assert "_block_scale(" in src and "_e4m3_rne(" not in src, mod.__name__
    assert "_e4m3_rne(pre)" in inspect.getsource(nvfp4_jit._block_scale.fn)

"""Memory layout vs encode in the BF16 NVFP4 quantize kernels (issue #6): why the weight-sync pass sat at ~60%.

The BF16 kernels (``quantize_bf16.py``) give every thread whole 16-element blocks, loaded as two 16-byte
vectors per block ("lo/hi": words 0..3 and 4..7). Until this script, their tiles were row-major
``[rows, NB blocks, 4 words]``. Triton's coalescing pass orders the axes that are not contiguous by their
index, so the lanes of a warp ran down the rows: a warp's 16-byte load touched 16 cache lines instead of 8.
The tiles are now block-major ``[NB, rows, 4]``. This script times, in one process, with the optimizer-given
amax (the sync's quantize pass alone), over (a) the 196 linears of a Qwen3-1.7B-shaped model and (b) one
8192x8192 weight:

  library_nb*_w*    the library's grouped 16x16 kernel (``_grouped_quant_kernel``) at NB blocks x num_warps
                    (bytes compared with the default launch)
  roof_rowmajor     the old row-major lo/hi loads and stores with a trivial encode: what that memory pattern
                    allows at best
  roof_blockmajor   the same for the block-major tiles
  pair / roof_pair  a "pair-lane" tile [2, NB, 16, 4]: a block's two halves in adjacent lanes, so a warp's
                    16-byte loads are one contiguous 512-byte span and each lane stores one 4-byte code word
                    (real encode, bytes compared; and trivial encode)

and (``--only token``) the per-token kernel on 8192x8192 at several launch sizes against its roofline (the same
loads, the row reduction, a trivial encode). One JSON line per case: ms, fraction of the copy bandwidth on the
useful bytes, bytes equal to the library's default. CUDA-graph replay, so no host launch cost is included.

    python scripts/bench_quant_layout.py [--only sync,token]
    TRITON_INTERPRET=1 python scripts/bench_quant_layout.py --interpret-check   # bytes only, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from timing import gpu_ms  # scripts/ is on sys.path when run as a script

from minite_kernels.backends.triton.nvfp4_jit import _block_scale, _encode_scale, _rn_parts
from minite_kernels.backends.triton.quantize_bf16 import (
    PACK_K,
    _add,
    _max_nan,
    _pair_absmax,
    _tab_ptr,
)


@triton.jit
def _tile_addr(tab_ptr, qmap_ptr, pid, NB: tl.constexpr):
    g = tl.load(qmap_ptr + pid)
    row = tab_ptr + g * 16
    M = tl.load(row + 7).to(tl.int32)
    KW = (tl.load(row + 8).to(tl.int32) // 8) * 8
    stride_w = (tl.load(row + 9).to(tl.int32) // 4) * 4
    tiles_w = tl.load(row + 10).to(tl.int32)
    local = pid - tl.load(row + 11).to(tl.int32)
    return g, row, M, KW, stride_w, local // tiles_w, local % tiles_w


@triton.jit
def _pair_encode(w, enc4, AXIS: tl.constexpr):
    """[.., 4] words x enc -> one int32 of 4 code bytes per [..] (the library's magic-add encode)."""
    xe = (w << 16).to(tl.float32, bitcast=True)
    xo = (w & -65536).to(tl.float32, bitcast=True)
    ye = xe * enc4
    yo = xo * enc4
    te, _ce, _pe = _rn_parts(tl.minimum(tl.abs(ye), 6.0), ye, True)
    to, _co, _po = _rn_parts(tl.minimum(tl.abs(yo), 6.0), yo, True)
    byte = te.to(tl.int32, bitcast=True) + to.to(tl.int32, bitcast=True) * 16
    sh = tl.arange(0, 4) * 8
    return tl.reduce(byte << sh, AXIS, _add) - PACK_K


@triton.jit
def _roof_kernel(tab_ptr, qmap_ptr, NB: tl.constexpr, ROW_MAJOR: tl.constexpr):
    """Trivial encode, the library's lo/hi loads and 8-byte code stores, row-major (the old order) or
    block-major tiles."""
    _g, row, M, KW, stride_w, pm, pw = _tile_addr(tab_ptr, qmap_ptr, tl.program_id(0), NB)
    xw = _tab_ptr(row, 0, tl.int32)
    dp = _tab_ptr(row, 1, tl.int32)
    sp = _tab_ptr(row, 2, tl.uint8)
    NBK = KW // 8
    rows = pm * 16 + tl.arange(0, 16)
    blks = pw * NB + tl.arange(0, NB)
    j = tl.arange(0, 4)
    two = tl.arange(0, 2)
    if ROW_MAJOR:
        off = rows[:, None, None] * stride_w + blks[None, :, None] * 8 + j[None, None, :]
        m2 = (rows[:, None] < M) & (blks[None, :] < NBK)
        doff = rows[:, None, None] * (NBK * 2) + blks[None, :, None] * 2 + two[None, None, :]
        soff = rows[:, None] * NBK + blks[None, :]
    else:
        off = blks[:, None, None] * 8 + rows[None, :, None] * stride_w + j[None, None, :]
        m2 = (blks[:, None] < NBK) & (rows[None, :] < M)
        doff = blks[:, None, None] * 2 + rows[None, :, None] * (NBK * 2) + two[None, None, :]
        soff = blks[:, None] + rows[None, :] * NBK
    lo = tl.load(xw + off, mask=m2[:, :, None], other=0)
    hi = tl.load(xw + off + 4, mask=m2[:, :, None], other=0)
    plo = tl.reduce(lo, 2, _add)
    phi = tl.reduce(hi, 2, _add)
    tl.store(dp + doff, tl.join(plo, phi), mask=m2[:, :, None])
    tl.store(sp + soff, ((plo ^ phi) & 0x7F).to(tl.uint8), mask=m2)


@triton.jit
def _pair_t_tile(xw, dp, sp, abits, pid_m, pid_w, M, KW, stride_w, NB: tl.constexpr, TRIVIAL: tl.constexpr):
    """Pair-lane encode on a half-major tile [2, NB, 16, 4]: lanes run along (half, block) of one row, so a
    warp's 16-byte loads are one contiguous 512-byte span and each lane stores one 4-byte code word."""
    bad = abits >= 0x7F800000
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    s_enc, s_dec = _encode_scale(amax)
    NBK = KW // 8
    rows = pid_m * 16 + tl.arange(0, 16)
    blks = pid_w * NB + tl.arange(0, NB)
    h = tl.arange(0, 2)
    j = tl.arange(0, 4)
    off = (
        h[:, None, None, None] * 4
        + blks[None, :, None, None] * 8
        + rows[None, None, :, None] * stride_w
        + j[None, None, None, :]
    )
    m2 = (blks[:, None] < NBK) & (rows[None, :] < M)  # [NB, 16]
    w = tl.load(xw + off, mask=m2[None, :, :, None], other=0)
    if TRIVIAL:
        packed = tl.reduce(w, 3, _add)
        sbyte = (tl.reduce(packed, 0, _add) >> 23) & 0x7F
    else:
        hm = tl.reduce(_pair_absmax(w), 3, _max_nan)  # [2, NB, 16]
        vt = tl.where(bad, 0.0, tl.reduce(tl.reduce(hm, 0, _max_nan), 1, _max_nan))  # [NB]
        _s_b, sb1, enc = _block_scale(vt, s_enc, s_dec)
        packed = tl.where(bad, 0, _pair_encode(w, enc[None, :, None, None], 3))
        sbyte = tl.where(bad, 0x7F, tl.broadcast_to(sb1[:, None], [NB, 16]))
    tl.store(
        dp + h[:, None, None] + blks[None, :, None] * 2 + rows[None, None, :] * (NBK * 2),
        packed,
        mask=m2[None, :, :],
    )
    tl.store(sp + blks[:, None] + rows[None, :] * NBK, sbyte.to(tl.uint8), mask=m2)


@triton.jit
def _pair_kernel(tab_ptr, qmap_ptr, scratch_ptr, NB: tl.constexpr, TRIVIAL: tl.constexpr):
    g, row, M, KW, stride_w, pm, pw = _tile_addr(tab_ptr, qmap_ptr, tl.program_id(0), NB)
    xw = _tab_ptr(row, 0, tl.int32)
    dp = _tab_ptr(row, 1, tl.int32)
    sp = _tab_ptr(row, 2, tl.uint8)
    _pair_t_tile(xw, dp, sp, tl.load(scratch_ptr + g), pm, pw, M, KW, stride_w, NB, TRIVIAL)


@triton.jit
def _token_roof_kernel(xw, dp, sp, qp, KW, NB: tl.constexpr, QS: tl.constexpr):
    """Per-token roofline: the library's per-token loads (one row per program, lo/hi halves), the row
    reduction across the program (the barrier between the loads and the stores), a trivial encode."""
    NBK = KW // 8
    row = tl.program_id(0)
    blks = tl.arange(0, NB)
    j = tl.arange(0, 4)
    off = blks[:, None] * 8 + j[None, :]
    m = blks[:, None] < NBK
    lo = tl.load(xw + row * KW + off, mask=m, other=0)
    hi = tl.load(xw + row * KW + off + 4, mask=m, other=0)
    amax = tl.reduce(tl.reduce(_max_nan(_pair_absmax(lo), _pair_absmax(hi)), 1, _max_nan), 0, _max_nan)
    ab = amax.to(tl.int32, bitcast=True) & 1
    if QS:
        tl.store(qp + row * KW + off, lo ^ ab, mask=m)
        tl.store(qp + row * KW + off + 4, hi ^ ab, mask=m)
    else:
        plo = tl.reduce(lo, 1, _add) ^ ab
        phi = tl.reduce(hi, 1, _add)
        two = tl.arange(0, 2)
        tl.store(
            dp + row * (NBK * 2) + blks[:, None] * 2 + two[None, :],
            tl.join(plo, phi),
            mask=(blks < NBK)[:, None],
        )
        tl.store(sp + row * NBK + blks, ((plo ^ phi) & 0x7F).to(tl.uint8), mask=blks < NBK)


def run_token(copy_gbps: float) -> None:
    """Per-token 8192x8192 bf16: the library at several launch sizes and the roofline, CUDA-graph timed."""
    from minite_kernels.backends.triton import quantize as Q

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = x.numel()
    default = dict(Q.BF16_CONFIG)
    for case, kw, nbytes in (
        ("packed", {}, 2 * n + n // 2 + n // 16),
        ("qs_only", {"write_packed": False, "write_qs": True}, 4 * n),
    ):
        ref = Q.quantize_nvfp4_triton(x, per_token=True, **kw)
        out = Q.quantize_nvfp4_triton(x, per_token=True, **kw)
        for tpt, words in ((16, 1024), (8, 1024), (32, 1024), (64, 1024), (16, 8192), (32, 8192)):
            Q.BF16_CONFIG.update(token_words_per_thread=tpt, token_program_words=words)
            for t in out:
                if t is not None:
                    t.zero_()
            fn = lambda out=out, kw=kw: Q.quantize_nvfp4_triton(x, per_token=True, out=out, **kw)
            fn()
            same = all(
                (a is None and b is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                for a, b in zip(ref, out)
            )
            ms = gpu_ms(fn, graph=True, rep=100)
            emit(
                bench="token_8192sq",
                case=case,
                tpt=tpt,
                words=words,
                bytes_equal=same,
                us=ms * 1e3,
                frac_copy_bw=nbytes / ms / 1e6 / copy_gbps,
            )
            Q.BF16_CONFIG.clear()
            Q.BF16_CONFIG.update(default)
        xw = x.view(torch.int32)
        data = torch.empty(8192, 4096 // 2, dtype=torch.int32, device="cuda")
        sc = torch.empty(8192, 512, dtype=torch.uint8, device="cuda")
        qs = torch.empty(8192, 4096, dtype=torch.int32, device="cuda")
        for warps in (4, 8, 16):
            fn = lambda w=warps, c=case, bufs=(xw, data, sc, qs): _token_roof_kernel[(8192,)](
                *bufs, 4096, NB=512, QS=c == "qs_only", num_warps=w
            )
            fn()
            ms = gpu_ms(fn, graph=True, rep=100)
            emit(
                bench="token_8192sq",
                case=f"roof_{case}",
                warps=warps,
                us=ms * 1e3,
                frac_copy_bw=nbytes / ms / 1e6 / copy_gbps,
            )


def emit(**rec) -> None:
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)


def _outputs(sync):
    return [(o.data.clone(), o.scales.clone()) for o, _ in sync._bufs]


def _same(a, b) -> bool:
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def run(weights, label: str, copy_gbps: float | None, launches, interpret: bool) -> None:
    from minite_kernels.backends.triton import WeightRequantizer
    from minite_kernels.backends.triton.quantize_bf16 import _grouped_quant_kernel

    sync = WeightRequantizer(weights, cuda_graph=False)
    sync.sync()  # scratch now holds every weight's amax bits, as the optimizer would give them
    ((_t, _amap, _n_a, _qmap, _n_q, scratch),) = sync._groups
    ref = _outputs(sync)
    nparam = sum(w.numel() for w in weights)
    cases = {}
    for nb, warps in launches:
        tab, qm = _table(sync, nb)
        n = _tiles(weights, nb)
        cases[f"library_nb{nb}_w{warps}"] = (
            lambda t=tab, q=qm, n=n, nb=nb, wp=warps: _grouped_quant_kernel[(n,)](
                t,
                q,
                scratch,
                BLOCK_M=16,
                NB=nb,
                TILE16=True,
                WRITE_QS=False,
                WRITE_DEQ=False,
                RNE_INT=interpret,
                num_warps=wp,
            ),
            True,
        )
    tab, qm = _table(sync, 32)
    n = _tiles(weights, 32)
    for warps in (4, 8):
        for major in ("row", "block"):
            cases[f"roof_{major}major_w{warps}"] = (
                lambda wp=warps, rm=major == "row": _roof_kernel[(n,)](
                    tab, qm, NB=32, ROW_MAJOR=rm, num_warps=wp
                ),
                False,
            )
        for trivial in (True, False):
            cases[f"{'roof_' if trivial else ''}pair_w{warps}"] = (
                lambda wp=warps, tv=trivial: _pair_kernel[(n,)](
                    tab, qm, scratch, NB=32, TRIVIAL=tv, num_warps=wp
                ),
                not trivial,
            )
    for name, (fn, exact) in cases.items():
        for o, _ in sync._bufs:
            o.data.zero_()
            o.scales.zero_()
        fn()
        same = _same(_outputs(sync), ref) if exact else None
        rec = {"bench": "quant_layout", "weights": label, "case": name, "bytes_equal": same}
        if not interpret:
            ms = gpu_ms(fn, graph=True, rep=100)
            rec.update(
                ms=ms, ms_per_B=ms / (nparam / 1e9), frac_copy_bw=2.5625 * nparam / ms / 1e6 / copy_gbps
            )
        emit(**rec)


def _tiles(weights, nb):
    return sum(triton.cdiv(w.shape[0], 16) * triton.cdiv(w.shape[1] // 16, nb) for w in weights)


def _table(sync, nb):
    """The requantizer's table with the quantize tiling rebuilt for NB blocks per tile."""
    table, _amap, _n_a, _qmap, _n_q, _s = sync._groups[0]
    t = table.clone()
    counts = []
    start = 0
    for r, w in enumerate(sync.weights):
        tw = triton.cdiv(w.shape[1] // 16, nb)
        n = triton.cdiv(w.shape[0], 16) * tw
        t[r, 10] = tw
        t[r, 11] = start
        counts.append(n)
        start += n
    g = torch.arange(len(counts), dtype=torch.int32, device=t.device)
    return t, torch.repeat_interleave(g, torch.tensor(counts, device=t.device))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--interpret-check", action="store_true", help="tiny shapes under TRITON_INTERPRET=1")
    p.add_argument("--only", default="sync,token", help="comma list of: sync, token")
    args = p.parse_args(argv)
    if args.interpret_check:
        assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
        g = torch.Generator().manual_seed(0)
        ws = [
            torch.randn(m, k, generator=g).to(torch.bfloat16) * s
            for m, k, s in ((32, 1024, 1.0), (48, 512, 0.02), (16, 1536, 3.0))
        ]
        ws[1][3, 7] = 0.0
        run(ws, "tiny", None, ((32, 4), (16, 4)), interpret=True)
        return 0
    from kernel_bench.common import measured_copy_gbps, qwen3_1p7b_weights

    copy_gbps = measured_copy_gbps(argparse.Namespace())
    emit(bench="copy", GBps=copy_gbps)
    only = set(args.only.split(","))
    if "token" in only:
        run_token(copy_gbps)
    if "sync" in only:
        variants = ((32, 8), (32, 4), (32, 2), (64, 8), (64, 4), (16, 4))
        run(qwen3_1p7b_weights(), "qwen3_1p7b", copy_gbps, variants, interpret=False)
        run(
            [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)],
            "8192sq",
            copy_gbps,
            variants,
            False,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

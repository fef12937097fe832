"""Why the weight-sync quantize pass reaches only ~60% of copy bandwidth: memory layout vs encode (issue #6).

The library's BF16 kernels (``quantize_bf16.py``) give every thread whole 16-element blocks, loaded as two
16-byte vectors per block ("lo/hi": words 0..3 and 4..7). The two loads of a warp each touch every 32-byte
sector of its span but use half of it, so each sector is requested twice. This script times, in one
process on the same weights, with the optimizer-given amax (the sync's quantize pass alone):

  base         the library's grouped 16x16 quantize kernel (``_grouped_quant_kernel``). Its tile is
               [16 rows, NB blocks, 4 words]; Triton's coalescing pass orders equally contiguous axes by
               index, so the lanes of a warp run down the 16 rows (a warp's 16-byte load touches 16
               cache lines instead of 8)
  roof_base    the same loads and stores with a trivial encode (what the memory pattern alone allows)
  t_lohi       the same encode on a block-major tile [NB, 16, 4]: lanes run along the blocks of a row
  t_pair       "pair-lane" tile [2, NB, 16, 4]: a block's two halves sit in adjacent lanes, so a warp's
               16-byte loads are one contiguous 512-byte span and each lane stores one 4-byte code word
  roof_t_*     the t_ layouts with a trivial encode

for (a) the 196 linears of a Qwen3-1.7B-shaped model and (b) one 8192x8192 weight, and prints one JSON line
per case (ms, fraction of the copy bandwidth on the useful bytes 2.5625 B/param, bytes equal to ``base``).

    python scripts/bench_quant_layout.py [--interpret-check]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from minite_kernels.backends.triton.quantize import _encode_scale
from minite_kernels.backends.triton.quantize_bf16 import (
    PACK_K,
    _add,
    _block_scale,
    _max_nan,
    _pair_absmax,
    _rn_parts,
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
    te, ce, pe = _rn_parts(tl.minimum(tl.abs(ye), 6.0), ye, True)
    to, co, po = _rn_parts(tl.minimum(tl.abs(yo), 6.0), yo, True)
    byte = te.to(tl.int32, bitcast=True) + to.to(tl.int32, bitcast=True) * 16
    sh = tl.arange(0, 4) * 8
    return tl.reduce(byte << sh, AXIS, _add) - PACK_K


@triton.jit
def _lohi_roof_kernel(tab_ptr, qmap_ptr, scratch_ptr, NB: tl.constexpr):
    """Trivial encode with the library's lo/hi loads and 8-byte code stores."""
    g, row, M, KW, stride_w, pm, pw = _tile_addr(tab_ptr, qmap_ptr, tl.program_id(0), NB)
    xw = _tab_ptr(row, 0, tl.int32)
    dp = _tab_ptr(row, 1, tl.int32)
    sp = _tab_ptr(row, 2, tl.uint8)
    NBK = KW // 8
    rows = pm * 16 + tl.arange(0, 16)
    blks = pw * NB + tl.arange(0, NB)
    j = tl.arange(0, 4)
    off = rows[:, None, None] * stride_w + blks[None, :, None] * 8 + j[None, None, :]
    mask = (rows[:, None, None] < M) & (blks[None, :, None] < NBK)
    lo = tl.load(xw + off, mask=mask, other=0)
    hi = tl.load(xw + off + 4, mask=mask, other=0)
    plo = tl.reduce(lo, 2, _add)
    phi = tl.reduce(hi, 2, _add)
    two = tl.arange(0, 2)
    bm = (rows[:, None] < M) & (blks[None, :] < NBK)
    tl.store(
        dp + rows[:, None, None] * (NBK * 2) + blks[None, :, None] * 2 + two[None, None, :],
        tl.join(plo, phi),
        mask=bm[:, :, None],
    )
    tl.store(sp + rows[:, None] * NBK + blks[None, :], ((plo ^ phi) & 0x7F).to(tl.uint8), mask=bm)


@triton.jit
def _lohi_t_tile(xw, dp, sp, abits, pid_m, pid_w, M, KW, stride_w, NB: tl.constexpr, TRIVIAL: tl.constexpr):
    """The library's lo/hi encode on a block-major tile [NB, 16, 4]: Triton's coalescing orders equally
    contiguous axes by index, so lanes now run along the blocks of a row, not down the 16 rows."""
    bad = abits >= 0x7F800000
    amax = tl.where(bad, 0, abits).to(tl.float32, bitcast=True)
    s_enc, s_dec = _encode_scale(amax)
    NBK = KW // 8
    rows = pid_m * 16 + tl.arange(0, 16)
    blks = pid_w * NB + tl.arange(0, NB)
    j = tl.arange(0, 4)
    off = blks[:, None, None] * 8 + rows[None, :, None] * stride_w + j[None, None, :]
    m3 = (blks[:, None, None] < NBK) & (rows[None, :, None] < M)
    lo = tl.load(xw + off, mask=m3, other=0)
    hi = tl.load(xw + off + 4, mask=m3, other=0)
    if TRIVIAL:
        plo = tl.reduce(lo, 2, _add)
        phi = tl.reduce(hi, 2, _add)
        sbyte = (plo ^ phi) & 0x7F
    else:
        vmax = tl.reduce(_max_nan(_pair_absmax(lo), _pair_absmax(hi)), 2, _max_nan)  # [NB, 16]
        vt = tl.where(bad, 0.0, tl.reduce(vmax, 1, _max_nan))  # [NB]
        s_b, sb1, enc = _block_scale(vt, s_enc, s_dec)
        plo = tl.where(bad, 0, _pair_encode(lo, enc[:, None, None], 2))
        phi = tl.where(bad, 0, _pair_encode(hi, enc[:, None, None], 2))
        sbyte = tl.where(bad, 0x7F, tl.broadcast_to(sb1[:, None], [NB, 16]))
    m2 = (blks[:, None] < NBK) & (rows[None, :] < M)
    two = tl.arange(0, 2)
    tl.store(
        dp + blks[:, None, None] * 2 + rows[None, :, None] * (NBK * 2) + two[None, None, :],
        tl.join(plo, phi),
        mask=m2[:, :, None],
    )
    tl.store(sp + blks[:, None] + rows[None, :] * NBK, sbyte.to(tl.uint8), mask=m2)


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
        s_b, sb1, enc = _block_scale(vt, s_enc, s_dec)
        packed = tl.where(bad, 0, _pair_encode(w, enc[None, :, None, None], 3))
        sbyte = tl.where(bad, 0x7F, tl.broadcast_to(sb1[:, None], [NB, 16]))
    tl.store(
        dp + h[:, None, None] + blks[None, :, None] * 2 + rows[None, None, :] * (NBK * 2),
        packed,
        mask=m2[None, :, :],
    )
    tl.store(sp + blks[:, None] + rows[None, :] * NBK, sbyte.to(tl.uint8), mask=m2)


@triton.jit
def _t_kernel(tab_ptr, qmap_ptr, scratch_ptr, NB: tl.constexpr, PAIR: tl.constexpr, TRIVIAL: tl.constexpr):
    g, row, M, KW, stride_w, pm, pw = _tile_addr(tab_ptr, qmap_ptr, tl.program_id(0), NB)
    xw = _tab_ptr(row, 0, tl.int32)
    dp = _tab_ptr(row, 1, tl.int32)
    sp = _tab_ptr(row, 2, tl.uint8)
    abits = tl.load(scratch_ptr + g)
    if PAIR:
        _pair_t_tile(xw, dp, sp, abits, pm, pw, M, KW, stride_w, NB, TRIVIAL)
    else:
        _lohi_t_tile(xw, dp, sp, abits, pm, pw, M, KW, stride_w, NB, TRIVIAL)


def emit(**rec) -> None:
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)


def _outputs(sync):
    return [(o.data.clone(), o.scales.clone()) for o, _ in sync._bufs]


def _same(a, b) -> bool:
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def run(weights, label: str, copy_gbps: float | None, variants, interpret: bool) -> None:
    from minite_kernels.backends.triton import WeightRequantizer

    sync = WeightRequantizer(weights, cuda_graph=False)
    sync.sync()  # scratch now holds every weight's amax bits, as the optimizer would give them
    ((table, _amap, _n_a, qmap, n_q, scratch),) = sync._groups
    ref = _outputs(sync)
    nparam = sum(w.numel() for w in weights)

    def base():
        from minite_kernels.backends.triton.quantize_bf16 import _grouped_quant_kernel

        _grouped_quant_kernel[(n_q,)](
            table,
            qmap,
            scratch,
            BLOCK_M=16,
            NB=32,
            TILE16=True,
            WRITE_QS=False,
            WRITE_DEQ=False,
            RNE_INT=interpret,
            num_warps=8,
        )

    cases = {"base": (base, True)}
    tab32, qmap32 = _table(sync, 32)
    cases["roof_base"] = (
        lambda: _lohi_roof_kernel[(_tiles(weights, 32),)](tab32, qmap32, scratch, NB=32, num_warps=8),
        False,
    )
    for nb, warps in variants:
        n = _tiles(weights, nb)
        tab, qm = _table(sync, nb)
        for pair in (False, True):
            for trivial in (True, False):
                name = f"{'roof_' if trivial else ''}t_{'pair' if pair else 'lohi'}_nb{nb}_w{warps}"
                cases[name] = (
                    lambda t=tab, q=qm, n=n, nb=nb, wp=warps, pr=pair, tv=trivial: _t_kernel[(n,)](
                        t, q, scratch, NB=nb, PAIR=pr, TRIVIAL=tv, num_warps=wp
                    ),
                    not trivial,
                )
    for name, (fn, exact) in cases.items():
        for o, _ in sync._bufs:
            o.data.zero_()
            o.scales.zero_()
        fn()
        same = _same(_outputs(sync), ref) if exact else None
        rec = dict(bench="quant_layout", weights=label, case=name, bytes_equal=same)
        if not interpret:
            from triton.testing import do_bench_cudagraph

            ms = float(do_bench_cudagraph(fn, rep=100, return_mode="median"))
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
    args = p.parse_args(argv)
    if args.interpret_check:
        assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
        g = torch.Generator().manual_seed(0)
        ws = [
            torch.randn(m, k, generator=g).to(torch.bfloat16) * s
            for m, k, s in ((32, 1024, 1.0), (48, 512, 0.02), (16, 1536, 3.0))
        ]
        ws[1][3, 7] = 0.0
        run(ws, "tiny", None, ((32, 4),), interpret=True)
        return 0
    from bench_kernels import _copy_gbps, _qwen3_1p7b_weights

    copy_gbps = _copy_gbps(argparse.Namespace())
    emit(bench="copy", GBps=copy_gbps)
    variants = ((32, 8), (32, 4), (32, 2), (64, 8), (64, 4), (16, 4))
    run(_qwen3_1p7b_weights(), "qwen3_1p7b", copy_gbps, variants, interpret=False)
    run([torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)], "8192sq", copy_gbps, variants, False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

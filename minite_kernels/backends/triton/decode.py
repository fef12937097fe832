"""Packed-FP4 decode linear (W4A4 at small batch), the host side: what the backend and the sampler call.

- :func:`quantize_for_decode`: the activation's per-token NVFP4 quantization in one launch, with its codes as
  the pair words of :func:`decode_linear_pairs`;
- :func:`decode_linear_pairs` (what the backend runs for activations of up to ``DECODE_MAX_ROWS`` rows that
  :func:`quantize_for_decode` made): launch geometry, split-K workspace, programmatic dependent launch.

The first formulation (one fp32 product per nibble, plane-major activations) is the benchmarks' baseline in
``scripts/decode_planes.py``; it is not part of the library.

The kernels, their math (``y = Σ_k qs_x · qs_w · amax_x · amax_w / 2688²``, read from packed bytes) and worked
examples are in ``decode_kernels.py``.
"""

from __future__ import annotations

import torch
import triton

from ._common import _pdl_launch, interpret_mode
from .decode_kernels import _decode_pairs_kernel, _pairs_act_quant_kernel
from .quantize import QuantOut, _num_sms

_WORKSPACE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, split: int, bb: int, n: int, nblocks: int):
    key = (device, split, bb, n, nblocks)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = (
            torch.empty((split, bb, n), dtype=torch.float32, device=device),
            torch.zeros(nblocks, dtype=torch.int32, device=device),
        )
        _WORKSPACE[key] = ws
    return ws


def _split_k(device: torch.device, split: int | None, programs: int, kt: int, bk: int) -> tuple[int, int]:
    """(splits, K tiles per split): by default, split K in powers of two while the programs would not fill
    two waves of SMs and every split keeps at least two K tiles of ``bk``."""
    if split is None:
        target = 2 * _num_sms(device)
        split = 1
        while programs * split < target and split < 16 and kt // (split * 2) >= 2 * bk:
            split *= 2
    per_split = triton.cdiv(triton.cdiv(kt, split), bk) * bk
    return triton.cdiv(kt, per_split), per_split


def decode_quant_outputs(x: torch.Tensor, fn: str) -> QuantOut:
    """The per-token quantizer outputs a one-launch decode quantizer writes for ``x`` [B, K] (packed codes,
    E4M3 scale bytes, amax, nonfinite flags), after checking that ``x`` suits it (K % 16 == 0, unit stride
    along K); ``fn`` names the caller in the error."""
    b, k = x.shape
    if k % 16 or x.stride(1) != 1:
        raise ValueError(f"{fn} needs K % 16 == 0 and unit stride along K; got {tuple(x.shape)}")
    dev = x.device
    return QuantOut(
        torch.empty((b, k // 2), dtype=torch.uint8, device=dev),
        torch.empty((b, k // 16), dtype=torch.uint8, device=dev),
        torch.empty((b,), dtype=torch.float32, device=dev),
        torch.empty((b,), dtype=torch.bool, device=dev),
        None,
        None,
    )


def quantize_for_decode(x: torch.Tensor, *, pdl: bool | None = None) -> tuple[QuantOut, torch.Tensor]:
    """Per-token NVFP4 quantization of a few activation rows (``x`` [B, K], K % 16 == 0, unit stride along
    K) for :func:`decode_linear_pairs`, in one launch: the usual outputs (``data``, ``scales``, ``amax``,
    ``nonfinite``; bytes identical to ``quantize_nvfp4_triton(x, per_token=True)``) and the E2M1 codes as the
    pair kernel's int32 words [B, 8, K/16] (:func:`pairs_for_decode`). Each row is spread over several
    programs (each reads the whole row for its amax, then encodes its chunk).

    ``pdl`` (default: :func:`pdl_enabled`) launches the kernel with programmatic dependent launch, so the
    decode kernel after it can start (and prefetch its weights) while it runs."""
    out = decode_quant_outputs(x, "quantize_for_decode")
    b, k = x.shape
    xp = torch.empty((b, 8, k // 16), dtype=torch.int32, device=x.device)
    if b:
        ch = 32
        nb = triton.next_power_of_2(k // 16)
        _pairs_act_quant_kernel[(b, triton.cdiv(k // 16, ch))](
            x,
            xp,
            out.data,
            out.scales,
            out.amax,
            out.nonfinite,
            k,
            x.stride(0),
            NB=nb,
            CH=ch,
            num_warps=4 if nb <= 256 else 8,
            **_pdl_launch(x, pdl),
        )
    return out._replace(scales=out.scales.view(torch.float8_e4m3fn)), xp


def pairs_for_decode(codes: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` fp16 E2M1 values -> the int32 words ``[B, 8, K/16]`` :func:`decode_linear_pairs` reads:
    ``out[b, 4h + j, m]`` holds values ``16m + 8h + j`` (low half) and ``16m + 8h + j + 4`` (high half), the
    pair that nibbles ``j`` and ``j + 4`` of block ``m``'s weight word ``h`` meet."""
    b, k = codes.shape
    pairs = codes.view(b, k // 16, 2, 2, 4).transpose(3, 4).contiguous().view(torch.int32)  # [B, KB, 2, 4]
    return pairs.view(b, k // 16, 8).transpose(1, 2).contiguous()


def decode_linear_pairs(
    x_pairs: torch.Tensor,
    x_scales: torch.Tensor,
    x_amax: torch.Tensor,
    w_data: torch.Tensor,
    w_scales: torch.Tensor,
    w_amax: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    split: int | None = None,
    block_n: int | None = None,
    block_kb: int | None = None,
    block_b: int | None = None,
    num_warps: int = 4,
    stages: int | None = None,
    prefetch: bool | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """``y [B, N]`` from per-token NVFP4 activations given as E2M1 codes in fp16 pair words (``x_pairs``
    int32 [B, 8, K/16], :func:`pairs_for_decode`), their E4M3 block scales (``x_scales`` [B, K/16]) and amax
    (``x_amax`` fp32 [B]), against a packed per-tensor NVFP4 weight (``w_data`` u8 [N, K/2], ``w_scales``
    [N, K/16], ``w_amax`` [1]).

    ``pdl`` (default: :func:`pdl_enabled`, i.e. ``MINITE_TRITON_PDL=on`` on sm_90+): programmatic dependent
    launch; the kernel lets the next one launch, prefetches its weight slice into L2, and only then waits
    for the kernel that wrote the activations. The result does not depend on it (the same arithmetic;
    every dependent read comes after the wait).

    ``prefetch``: double-buffer the K loop in registers (the loads of tile ``i + 1`` are issued before tile
    ``i`` is computed, with no shared-memory round trip); ``stages`` > 1 pipelines it through shared memory
    with Triton's asynchronous copies instead. The two exclude each other; neither changes the result.
    Default (None, like the tile sizes): the launch defaults below, which double-buffer at one row only."""
    if x_pairs.dim() != 3 or x_pairs.shape[1] != 8 or x_pairs.dtype != torch.int32:
        raise ValueError(
            "decode_linear_pairs takes x as int32 pair words [B, 8, K/16] (quantize_for_decode(x)); "
            f"got {x_pairs.dtype} {tuple(x_pairs.shape)}"
        )
    b, k = x_pairs.shape[0], 16 * x_pairs.shape[2]
    n = w_data.shape[0]
    if not (w_data.is_contiguous() and x_pairs.is_contiguous() and x_scales.is_contiguous()):
        raise ValueError("decode_linear_pairs needs contiguous x_pairs, x_scales and w_data")
    if w_data.dim() != 2 or w_data.shape[1] * 2 != k:
        raise ValueError(
            f"decode_linear_pairs: x has K={k} but the packed weight has shape {tuple(w_data.shape)} "
            f"(expected [N, {k // 2}])"
        )
    for name, t, want in (("x_scales", x_scales, (b, k // 16)), ("w_scales", w_scales, (n, k // 16))):
        if tuple(t.shape) != want:
            raise ValueError(f"decode_linear_pairs: {name} has shape {tuple(t.shape)}, expected {want}")
    if x_amax.numel() != b:
        raise ValueError(f"decode_linear_pairs: x_amax has {x_amax.numel()} values for {b} rows")
    out = torch.empty((b, n), dtype=out_dtype, device=x_pairs.device)
    if b == 0 or n == 0:
        return out
    bb = block_b or min(4, triton.next_power_of_2(b))
    groups = triton.cdiv(b, bb)
    # defaults from the H200 sweeps on weights streamed from HBM (scripts/bench_decode.py --cold-sweep and
    # the block chains, benchmarks/RESULTS.md, issue #6): (BLOCK_N, BLOCK_KB, stages, register double
    # buffer). Wide weights (6144+ rows: qkv, gate, gate_up) have programs enough to hide the latency in
    # 16 x 32-block tiles; the rest are latency-bound: 4 x 128 blocks for long K (o, down; 8 x 64 at 3-4
    # rows and K < 8192) and for narrow weights (k/v), 16 x 64 otherwise (q). The double buffer pays at one
    # activation row only. Above 4 rows (several row groups) one rule serves every shape.
    if b > 4:
        cfg = (8, 64, 3, False) if n * k < (1 << 24) and n <= 2048 else (16, 32, 1, False)
    elif n >= 6144:
        cfg = (16, 32, 1, b == 1)
    elif k >= 4096:
        cfg = (4, 128, 1, b == 1) if b <= 2 or k >= 8192 else (8, 64, 1, False)
    else:
        cfg = (4, 128, 1, b == 1) if n <= 2048 else (16, 64, 1, b == 1)
    bn = block_n or cfg[0]
    kbt = k // 16
    bkb = min(block_kb or cfg[1], triton.next_power_of_2(kbt))
    if prefetch is None:
        prefetch = cfg[3] and (stages is None or stages <= 1)
    if stages is None:
        stages = 1 if prefetch else cfg[2]
    if prefetch and stages > 1:
        raise ValueError(
            f"decode_linear_pairs: prefetch=True (register double buffer) excludes stages={stages} "
            "(shared-memory pipeline); pass one of them"
        )
    nblocks = triton.cdiv(n, bn)
    split, kb_per_split = _split_k(x_pairs.device, split, nblocks * groups, kbt, bkb)
    part, cnt = (
        _workspace(x_pairs.device, split, groups * bb, n, groups * nblocks) if split > 1 else (out, out)
    )
    _decode_pairs_kernel[(nblocks, split, groups)](
        x_pairs,
        x_scales.view(torch.uint8),
        x_amax,
        w_data.view(torch.int32),
        w_scales.view(torch.uint8),
        w_amax,
        out,
        part,
        cnt,
        b,
        n,
        k,
        kb_per_split,
        BLOCK_N=bn,
        BLOCK_KB=bkb,
        BLOCK_B=bb,
        SPLIT=split,
        INTERP=interpret_mode(),
        STAGES=stages,
        PREFETCH=bool(prefetch),
        num_warps=num_warps,
        **_pdl_launch(x_pairs, pdl),
    )
    return out


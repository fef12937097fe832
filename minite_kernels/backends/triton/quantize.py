"""NVFP4 quantize and dequantize on the GPU, the host side; the bytes equal
``minite_kernels.formats.quantize_nvfp4``'s.

- :func:`quantize_nvfp4_triton`: per-tensor (two launches: the amax, then the quantize pass) or per-token (one
  launch) NVFP4 with 1x16 or 16x16 scaling tiles, round to nearest or stochastic rounding, with optional ``qs``
  (``e2m1 * s_b``, the exact GEMM's operand) and ``deq`` (the dequantized BF16 value) outputs. BF16 inputs
  with unit stride along K take the word-wise kernels of ``quantize_bf16.py`` (launch geometry
  ``BF16_CONFIG``), everything else the generic kernels of ``quantize_kernels.py``.
- :func:`quantize_token_deq_bf16`: the learner's fast lane, per token with the BF16 ``deq`` in one launch.
- :func:`dequantize_nvfp4_triton`: packed bytes back to values; :func:`launch_amax`: the amax reduction.

The arithmetic step by step, with a worked example, is in ``quantize_kernels.py`` and the shared device
functions in ``nvfp4_jit.py``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from ._common import interpret_mode
from .launcher import CachedLauncher
from .quantize_bf16 import _amax_kernel_bf16, _quant_tensor_kernel_bf16, _quant_token_kernel_bf16
from .quantize_kernels import (
    _amax_kernel,
    _dequantize_kernel,
    _quantize_per_tensor_kernel,
    _quantize_per_token_kernel,
)

_NUM_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def launch_amax(x: torch.Tensor, scratch: torch.Tensor) -> None:
    """scratch (int32 [2], zeroed) <- (bits of max|x| over finite values, any non-finite)."""
    m, k = x.shape
    bm, bk = 16, 256
    tiles_k = triton.cdiv(k, bk)
    n_tiles = triton.cdiv(m, bm) * tiles_k
    nprog = max(1, min(n_tiles, _num_sms(x.device) * 8))
    _amax_kernel[(nprog,)](
        x,
        scratch,
        m,
        k,
        x.stride(0),
        x.stride(1),
        nprog,
        triton.cdiv(n_tiles, nprog),
        tiles_k,
        BLOCK_M=bm,
        BLOCK_K=bk,
        num_warps=4,
    )


class QuantOut(NamedTuple):
    """Outputs of :func:`quantize_nvfp4_triton` (None where not requested)."""

    data: torch.Tensor | None  # uint8 [M, K/2]
    scales: torch.Tensor | None  # float8_e4m3fn [M, K/16]
    amax: torch.Tensor  # fp32 [1] | [M]
    nonfinite: torch.Tensor  # bool, like amax
    qs: torch.Tensor | None  # bf16 [M, K]: e2m1 * s_b (exact)
    deq: torch.Tensor | None  # bf16 [M, K]: the dequantized value (= NVFP4Tensor.dequantize(bf16))


def _bf16_words_ok(x: torch.Tensor, rbits: torch.Tensor | None) -> bool:
    return (
        x.dtype == torch.bfloat16
        and x.stride(1) == 1
        and x.stride(0) % 2 == 0
        and x.storage_offset() % 2 == 0
        and x.shape[1] % 16 == 0
        and (rbits is None or rbits.is_contiguous())
    )


#: launch geometry of the BF16 fast-path kernels (a benchmark may edit it in-process to sweep; the defaults
#: are used by the library). ``token_words_per_thread``: words held per thread in the per-token kernel;
#: ``token_program_words``: words per program for short rows (several rows per program).
BF16_CONFIG: dict[str, int] = {
    "token_words_per_thread": 16,
    # H200 sweeps: rows of K <= 2048 one (K = 2048) or a few per program: [4096, 2048] 11.2 instead of 14.6 us
    # at 2048 words; longer rows are unaffected (8192^2 0.063 ms). Every swept size is GPU byte-tested.
    "token_program_words": 1024,
    "tensor_block_m": 8,  # per-tensor 1x16: rows x blocks per program
    "tensor_nb": 32,
    "tensor_warps": 4,
    "tile16_nb": 32,  # per-tensor 16x16: 16 rows x tile16_nb blocks per program
    "tile16_warps": 4,  # H200 (block-major tiles): Qwen3-1.7B sync pass 1.08 ms; 8 warps 1.26, 2 warps 1.28
    "amax_rows": 32,  # amax pass: amax_rows x amax_block_w words per program, amax_block_m rows at a time
    "amax_block_m": 8,
    "amax_block_w": 512,
    "amax_warps": 8,
}


def _contig_aligned(t: torch.Tensor | None, align: int) -> bool:
    return t is not None and t.is_contiguous() and t.data_ptr() % align == 0


def _bf16_outputs_ok(out: QuantOut, write_packed: bool) -> bool:
    """The BF16 kernels store 8-byte code words and 16-byte qs/deq vectors: caller-provided buffers must be
    contiguous and aligned."""
    data, scales, _a, _nf, qs, deq = out
    if write_packed and not (_contig_aligned(data, 8) and _contig_aligned(scales, 1)):
        return False
    return all(t is None or _contig_aligned(t, 16) for t in (qs, deq))


@functools.lru_cache(maxsize=256)
def _token_geometry(
    kw: int, program_words: int, words_per_thread: int, split: bool = True
) -> tuple[int, int, int, int]:
    """(rows per program, blocks in the row's first segment, in its second (0: one segment), warps) of the BF16
    per-token kernel. Segments are powers of two; with ``split`` a row whose K/16 blocks are not one is held as
    two when that pads less (K = 2560: 128 + 32 blocks instead of 256; 9728: 512 + 128 instead of 1024).

    ``_launch_token`` splits only packed-only, round-to-nearest outputs. On the H200, [4096, K] packed:
    16.0 -> 14.2 us at K = 2560, 30.9 -> 26.6 at 6144, 63.3 -> 57.5 at 9728; but packed + deq (the learner's
    forward) went 82.6 -> 100.2 us at K = 9728 (128 registers per thread instead of 59) and did not change at
    2560 (benchmarks/RESULTS.md), so it keeps one tile."""
    nbk = kw // 8
    nb, nb2 = triton.next_power_of_2(nbk), 0
    if split and nb != nbk and nb > 1:
        second = triton.next_power_of_2(nbk - nb // 2)
        if nb // 2 + second < nb:
            nb, nb2 = nb // 2, second
    rows = max(1, program_words // ((nb + nb2) * 8))
    bm = min(16, 1 << (rows.bit_length() - 1))
    return bm, nb, nb2, max(1, min(16, bm * nb * 8 // (words_per_thread * 32)))


@functools.cache
def _launchers() -> tuple[CachedLauncher, CachedLauncher, CachedLauncher]:
    """(per-token, amax, per-tensor) launchers of the BF16 kernels (``launcher.py``)."""
    return (
        CachedLauncher(_quant_token_kernel_bf16),
        CachedLauncher(_amax_kernel_bf16),
        CachedLauncher(_quant_tensor_kernel_bf16),
    )


def _launch_token(ptrs: tuple, m: int, kw: int, stride_w: int, align4: bool, sr: bool, flags: tuple) -> None:
    """The BF16 per-token kernel (``BF16_CONFIG`` launch geometry). ``ptrs``: input, codes, scales, qs, deq,
    amax, nonfinite, random bits (the kernel addresses them as words / bytes whatever their element type);
    ``flags``: (write_packed, write_qs, write_deq)."""
    cfg = BF16_CONFIG
    bm, nb, nb2, warps = _token_geometry(
        kw,
        cfg["token_program_words"],
        cfg["token_words_per_thread"],
        split=not sr and flags == (True, False, False),
    )
    _launchers()[0](
        (triton.cdiv(m, bm),),
        *ptrs,
        m,
        kw,
        stride_w,
        BLOCK_M=bm,
        NB=nb,
        NB2=nb2,
        ALIGN4=align4,
        SR=sr,
        WRITE_PACKED=flags[0],
        WRITE_QS=flags[1],
        WRITE_DEQ=flags[2],
        RNE_INT=interpret_mode(),
        num_warps=warps,
    )


def quantize_token_deq_bf16(x: torch.Tensor) -> QuantOut:
    """``quantize_nvfp4_triton(x, per_token=True, write_deq=True)`` for the learner's fast lane
    (``modules/fast_lane.py``), whose plan guarantees the preconditions: ``x`` BF16 [M, K], contiguous, at an
    even element offset, M >= 1, K % 16 == 0 and K <= 16384. Same kernel, same outputs; only the checks and
    the generic dispatch are left out (``tests/minite_kernels/test_fast_lane.py`` compares the two)."""
    m, k = x.shape
    dev = x.device
    kw = k // 2
    data = torch.empty((m, kw), dtype=torch.uint8, device=dev)
    scales = torch.empty((m, k // 16), dtype=torch.float8_e4m3fn, device=dev)
    amax = torch.empty((m,), dtype=torch.float32, device=dev)
    nonfinite = torch.empty((m,), dtype=torch.bool, device=dev)
    deq = torch.empty((m, k), dtype=torch.bfloat16, device=dev)
    align4 = kw % 4 == 0 and x.data_ptr() % 16 == 0
    _launch_token(  # no qs, no random bits (amax stands in); no host views: the kernel casts the pointers
        (x, data, scales, amax, deq, amax, nonfinite, amax),
        m,
        kw,
        stride_w=kw,
        align4=align4,
        sr=False,
        flags=(True, False, True),
    )
    return QuantOut(data, scales, amax, nonfinite, None, deq)


def _launch_bf16(
    x: torch.Tensor,
    out: QuantOut,
    scales: torch.Tensor | None,
    per_token: bool,
    tile16: bool,
    rbits: torch.Tensor | None,
    write_packed: bool,
    write_qs: bool,
    write_deq: bool,
    scratch: torch.Tensor | None,
) -> None:
    data, _s, amax, nonfinite, qs, deq = out
    m, k = x.shape
    kw = k // 2
    sr = rbits is not None
    xw = x.view(torch.int32)
    stride_w = xw.stride(0)
    align4 = stride_w % 4 == 0 and xw.data_ptr() % 16 == 0
    dummy = amax
    rb = rbits.view(torch.int16) if sr else dummy
    dptr = data.view(torch.int32) if write_packed else dummy
    sptr = scales if write_packed else dummy
    qsw = qs.view(torch.int32) if write_qs else dummy
    deqw = deq.view(torch.int32) if write_deq else dummy
    rne_int = interpret_mode()
    cfg = BF16_CONFIG
    if per_token:  # the learner's hot path (one launch per linear input): keep its host work small
        ptrs = (xw, dptr, sptr, qsw, deqw, amax, nonfinite, rb)
        _launch_token(ptrs, m, kw, stride_w, align4, sr, (write_packed, write_qs, write_deq))
        return
    _, amax_launch, tensor_launch = _launchers()
    nbk = kw // 8
    if scratch is None:
        scratch = torch.zeros(2, dtype=torch.int32, device=x.device)
    else:
        scratch.zero_()
    arows, abm = cfg["amax_rows"], cfg["amax_block_m"]
    abw = min(cfg["amax_block_w"], max(8, triton.next_power_of_2(kw)))
    amax_launch(
        (triton.cdiv(m, arows), triton.cdiv(kw, abw)),
        xw,
        scratch,
        m,
        kw,
        stride_w,
        ALIGN4=align4,
        A_ROWS=arows,
        BLOCK_M=abm,
        BLOCK_W=abw,
        num_warps=cfg["amax_warps"],
    )
    if tile16:
        bm, nb, warps = 16, cfg["tile16_nb"], cfg["tile16_warps"]
    else:
        bm, nb, warps = cfg["tensor_block_m"], cfg["tensor_nb"], cfg["tensor_warps"]
    nb = min(nb, max(1, triton.next_power_of_2(nbk)))
    tensor_launch(
        (triton.cdiv(m, bm), triton.cdiv(nbk, nb)),
        xw,
        dptr,
        sptr,
        qsw,
        deqw,
        amax,
        nonfinite,
        scratch,
        rb,
        m,
        kw,
        stride_w,
        BLOCK_M=bm,
        NB=nb,
        ALIGN4=align4,
        TILE16=tile16,
        SR=sr,
        WRITE_PACKED=write_packed,
        WRITE_QS=write_qs,
        WRITE_DEQ=write_deq,
        RNE_INT=rne_int,
        num_warps=warps,
    )


def quantize_nvfp4_triton(
    x: torch.Tensor,
    *,
    per_token: bool,
    tile16: bool = False,
    rbits: torch.Tensor | None = None,
    write_packed: bool = True,
    write_qs: bool = False,
    write_deq: bool = False,
    out: QuantOut | None = None,
    scratch: torch.Tensor | None = None,
) -> QuantOut:
    """Quantize a 2-D float tensor along its last dim (see the module docstring).

    Preconditions (checked by callers): K % 16 == 0, M % 16 == 0 when ``tile16``, bf16/fp16/fp32 input,
    ``rbits`` uint8 [M, K] contiguous for stochastic rounding. ``out``/``scratch`` let a caller reuse buffers
    (CUDA-graph capture of weight sync). BF16 inputs with unit stride along K take the word-wise fast path
    (``quantize_bf16.py``); other dtypes and layouts the generic kernels.
    """
    m, k = x.shape
    dev = x.device
    nrow = m if per_token else 1
    fresh = out is None  # separate new allocations: contiguous and aligned
    if fresh:
        out = QuantOut(
            torch.empty((m, k // 2), dtype=torch.uint8, device=dev) if write_packed else None,
            torch.empty((m, k // 16), dtype=torch.uint8, device=dev) if write_packed else None,
            torch.empty((nrow,), dtype=torch.float32, device=dev),
            torch.empty((nrow,), dtype=torch.bool, device=dev),
            torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_qs else None,
            torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_deq else None,
        )
    data, scales, amax, nonfinite, qs, deq = out
    if scales is not None and scales.dtype != torch.uint8:
        scales = scales.view(torch.uint8)
    sr = rbits is not None
    dummy = amax
    if m == 0:
        if not per_token:
            amax.zero_()
            nonfinite.zero_()
        return _finish(out)
    if (
        _bf16_words_ok(x, rbits)
        and (not per_token or k // 2 <= 8192)
        and (fresh or _bf16_outputs_ok(out, write_packed))
    ):
        _launch_bf16(x, out, scales, per_token, tile16, rbits, write_packed, write_qs, write_deq, scratch)
        return _finish(out)
    # generic kernels (fp32 / fp16 / strided / CPU interpreter)
    if per_token:
        bm = 4 if m >= 4096 else (2 if m >= 512 else 1)
        bk = 256 if k >= 256 else max(16, triton.next_power_of_2(k))
        _quantize_per_token_kernel[(triton.cdiv(m, bm),)](
            x,
            data if write_packed else dummy,
            scales if write_packed else dummy,
            qs if write_qs else dummy,
            amax,
            rbits if sr else dummy,
            m,
            k,
            x.stride(0),
            x.stride(1),
            BLOCK_M=bm,
            BLOCK_K=bk,
            SR=sr,
            WRITE_PACKED=write_packed,
            WRITE_QS=write_qs,
            num_warps=4,
        )
    else:
        if scratch is None:
            scratch = torch.zeros(2, dtype=torch.int32, device=dev)
        else:
            scratch.zero_()
        launch_amax(x, scratch)
        bm = 16 if tile16 else 8
        bk = 256 if k >= 256 else max(16, triton.next_power_of_2(k))
        grid = (triton.cdiv(m, bm), triton.cdiv(k, bk))
        _quantize_per_tensor_kernel[grid](
            x,
            data if write_packed else dummy,
            scales if write_packed else dummy,
            qs if write_qs else dummy,
            amax,
            scratch,
            rbits if sr else dummy,
            m,
            k,
            x.stride(0),
            x.stride(1),
            BLOCK_M=bm,
            BLOCK_K=bk,
            TILE16=tile16,
            SR=sr,
            WRITE_PACKED=write_packed,
            WRITE_QS=write_qs,
            num_warps=4,
        )
    nonfinite.copy_(torch.isnan(amax))
    if write_deq:
        if write_packed:
            deq.copy_(dequantize_nvfp4_triton(data, scales, amax, per_token=per_token, dtype=torch.bfloat16))
        else:
            raise ValueError("write_deq on the generic path needs write_packed=True")
    return _finish(out)


def _finish(out: QuantOut) -> QuantOut:
    if out.scales is not None and out.scales.dtype != torch.float8_e4m3fn:
        out = out._replace(scales=out.scales.view(torch.float8_e4m3fn))
    return out


def dequantize_nvfp4_triton(
    data: torch.Tensor,
    scales: torch.Tensor,
    amax: torch.Tensor | None,
    *,
    per_token: bool,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantize packed NVFP4 ([M, K/2] u8, [M, K/16] e4m3, amax) to ``dtype`` [M, K]; with ``amax=None``
    return the exact ``qs = e2m1 * s_b`` operand (no outer scale)."""
    m, kh = data.shape
    k = kh * 2
    if interpret_mode() and dtype != torch.float32 and amax is not None:
        # the CPU interpreter truncates fp32 -> bf16/fp16 stores; round in torch instead (GPU stores round)
        return dequantize_nvfp4_triton(data, scales, amax, per_token=per_token).to(dtype)
    out = torch.empty((m, k), dtype=dtype, device=data.device)
    if m == 0:
        return out
    bm, bk = 8, 256 if k >= 256 else max(16, triton.next_power_of_2(k))
    grid = (triton.cdiv(m, bm), triton.cdiv(k, bk))
    _dequantize_kernel[grid](
        data,
        scales.view(torch.uint8),
        amax if amax is not None else out,
        out,
        m,
        k,
        PER_TOKEN=per_token,
        APPLY_AMAX=amax is not None,
        BLOCK_M=bm,
        BLOCK_K=bk,
        num_warps=4,
    )
    return out

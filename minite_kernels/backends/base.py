"""The compute-backend interface: quantize an operand, run a quantized ``A @ Bᵀ`` (report §4.2).

Every backend computes the same mathematical object::

    qgemm_nt(a, b) = dequant(Q_a(a)) @ dequant(Q_b(b))ᵀ      a [M, K], b [N, K] → [M, N]

with FP32 accumulation, where ``Q`` quantizes along K (the last dim) per an
:class:`~minite_kernels.recipes.OperandSpec` and the quantized operands are the canonical
``minite_kernels.formats`` objects (``NVFP4Tensor`` / ``MXFP8Tensor``; a plain tensor for
``format="bf16"``). Those objects are bit-exact by definition (formats is the reference), so a
quantized weight made by one backend can be consumed by another. The emulated backend is the
reference; fast backends are tested against it with a GEMM-accumulation tolerance (TE uses 8e-3).

Example (emulated, per-tensor NVFP4, 1x16 blocks): for ``a = b = ones(1, 16)``, amax = 1,
``S_enc = 2688``, every block scale is 448, every code decodes to exactly 1.0, so
``qgemm_nt(a, b) = [[16.0]]``.

Contract for subclasses (the Triton backend, TE, FlashInfer):
  - ``availability(device=None)`` (classmethod): ``(ok, reason)``; ``reason`` says why not, e.g.
    ``"NVFP4 GEMMs need compute capability 10.0; this GPU is sm_90"``.
  - ``supports_quantize(spec)`` / ``supports_gemm(a_spec, b_spec)``: ``(ok, reason)`` per operation;
    the ``auto`` backend routes an unsupported GEMM to the next backend (finally emulated).
  - implement ``_quantize(x2d, spec, generator)`` (x2d already aligned, spec quantized) and
    ``_gemm(qa, qb, a_spec, b_spec, out_dtype)`` (operands already quantized and aligned; either may be
    a plain tensor when its spec is bf16). The public ``quantize`` / ``qgemm_nt`` below do validation,
    alignment padding and the BF16 fast path; a subclass may override ``qgemm_nt`` to fuse quantization
    into the GEMM as long as the result has the same meaning.
  - optionally ``grouped_sync_refusal(w)`` / ``weight_requantizer(weights, ...)``: re-quantize many weights in
    a few launches after the optimizer step (``modules/weight_sync.py``); the default refuses every weight.

Alignment: ``qgemm_nt`` zero-pads the contraction dim to the operands' block size (16 NVFP4, 32 MXFP8).
Zero padding changes no scale (amax ignores zeros; with RHT both wgrad operands are padded identically
and the orthogonal transform still cancels). This matters for wgrad, whose contraction dim is the token
count. Rows need no alignment (a partial 16x16 tile is treated as zero-padded, as in TE).
"""

from __future__ import annotations

import abc
import functools
from typing import TYPE_CHECKING, ClassVar, Union

import torch
import torch.nn.functional as F

from minite_kernels.recipes import OperandSpec

if TYPE_CHECKING:  # pragma: no cover
    from minite_kernels.formats import MXFP8Tensor, NVFP4Tensor

QuantizedOperand = Union["NVFP4Tensor", "MXFP8Tensor", torch.Tensor]

#: compute capability needed for native NVFP4 / MXFP8 block-scaled tensor-core GEMMs (Blackwell)
NATIVE_FP4_CAPABILITY = (10, 0)


class BackendUnavailable(RuntimeError):
    """Raised when an explicitly requested backend cannot run here; the message says why."""


def operand_rows_k(q: QuantizedOperand) -> tuple[int, int]:
    """(rows, K) of a quantized operand (NVFP4 data is packed two per byte)."""
    if isinstance(q, torch.Tensor):
        return int(q.shape[0]), int(q.shape[1])
    data = q.data
    k = int(data.shape[1]) * (2 if data.dtype == torch.uint8 else 1)
    return int(data.shape[0]), k


def dequantize_operand(q: QuantizedOperand, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values a quantized operand stands for (a bf16-spec operand is just cast)."""
    if isinstance(q, torch.Tensor):
        return q.to(dtype)
    return q.dequantize(dtype=dtype)


def _orig_dtype(q: QuantizedOperand) -> torch.dtype:
    return q.dtype if isinstance(q, torch.Tensor) else getattr(q, "orig_dtype", torch.float32)


def cuda_capability(device: torch.device | str | int | None = None) -> tuple[int, int] | None:
    """Compute capability of a CUDA device (the current one by default); None without CUDA."""
    if device is not None:
        device = torch.device(device)
        if device.type != "cuda":
            return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def capability_str(cap: tuple[int, int] | None) -> str:
    return "no CUDA device" if cap is None else f"sm_{cap[0]}{cap[1]}"


def native_fp4_gate(device=None, what: str = "NVFP4 GEMMs") -> tuple[bool, str]:
    """(ok, reason) for Blackwell-only paths: CUDA present and capability >= 10.0."""
    cap = cuda_capability(device)
    if cap is None:
        return (
            False,
            f"{what} need a CUDA GPU with compute capability 10.0 (Blackwell); no CUDA device is visible",
        )
    if cap < NATIVE_FP4_CAPABILITY:
        return False, f"{what} need compute capability 10.0; this GPU is {capability_str(cap)}"
    return True, f"{capability_str(cap)} has native FP4/FP8 block-scaled tensor cores"


def _check_2d(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"{what} must be 2-D [rows, K] (flatten leading dims first), got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor (bf16/fp16/fp32), got {x.dtype}")


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = x.shape
    if r == rows and c == cols:
        return x
    return F.pad(x, (0, cols - c, 0, rows - r))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


# the default (ok, reason) answers depend only on the backend name and the frozen specs; they run before every
# quantize / GEMM, so the reason strings are built once
@functools.lru_cache(maxsize=1024)
def _default_quantize_support(name: str, spec: OperandSpec) -> tuple[bool, str]:
    return True, f"{name}: quantizes {spec.summary()}"


@functools.lru_cache(maxsize=1024)
def _default_gemm_support(name: str, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
    return True, f"{name}: {a_spec.summary()} x {b_spec.summary()}"


class Backend(abc.ABC):
    """Quantization + quantized GEMM on one device; see the module docstring for the contract."""

    name: ClassVar[str] = "base"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"

    # --- capability ------------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def availability(cls, device: torch.device | str | None = None) -> tuple[bool, str]:
        """(ok, reason): can this backend run at all on ``device``?"""

    def supports_quantize(self, spec: OperandSpec) -> tuple[bool, str]:
        return _default_quantize_support(self.name, spec)

    def supports_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
        return _default_gemm_support(self.name, a_spec, b_spec)

    # --- public operations -----------------------------------------------------------------------
    def quantize(
        self, x2d: torch.Tensor, spec: OperandSpec, *, generator: torch.Generator | None = None
    ) -> QuantizedOperand:
        """Quantize a 2-D operand along its last dim. BF16 spec → ``x2d`` unchanged.

        Requires ``K % spec.block_k == 0`` (``qgemm_nt`` zero-pads K for you). Any row count is valid (a
        partial 16x16 tile is treated as zero-padded, like TE).
        """
        _check_2d(x2d, "quantize input")
        if not spec.quantized:
            return x2d
        k = x2d.shape[1]
        if k % spec.block_k:
            raise ValueError(
                f"{spec.summary()} needs K % {spec.block_k} == 0 along the last dim; got shape {tuple(x2d.shape)} "
                "(qgemm_nt zero-pads K; call it, or pad first)"
            )
        ok, why = self.supports_quantize(spec)
        if not ok:
            raise BackendUnavailable(f"backend {self.name!r} cannot quantize {spec.summary()}: {why}")
        return self._quantize(x2d, spec, generator=generator)

    def qgemm_nt(
        self,
        a2d: torch.Tensor,
        b2d: torch.Tensor | None,
        a_spec: OperandSpec,
        b_spec: OperandSpec,
        *,
        out_dtype: torch.dtype | None = None,
        b_quantized: QuantizedOperand | None = None,
        generator: torch.Generator | None = None,
        a_quantized: QuantizedOperand | None = None,
    ) -> torch.Tensor:
        """``dequant(Q(a)) @ dequant(Q(b))ᵀ`` → ``[M, N]`` in ``out_dtype`` (default: a's dtype).

        ``b_quantized`` / ``a_quantized``: an operand already quantized with its spec (e.g. a cached weight,
        or an activation the module keeps for backward); it must come from an aligned tensor (no padding
        needed), and then ``b2d`` / ``a2d`` may be None.
        """
        if a_quantized is not None:
            if b_quantized is None:
                raise ValueError(
                    "qgemm_nt: a_quantized needs b_quantized too (quantize b with its spec first)"
                )
            m, k = operand_rows_k(a_quantized)
            n, kb = operand_rows_k(b_quantized)
            if k != kb:
                raise ValueError(f"qgemm_nt: contraction dims differ: a [{m}, {k}] vs b [{n}, {kb}]")
            out_dtype = out_dtype or (a2d.dtype if a2d is not None else _orig_dtype(a_quantized))
            if not a_spec.quantized and not b_spec.quantized:
                return torch.matmul(a_quantized, b_quantized.to(a_quantized.dtype).t()).to(out_dtype)
            ok, why = self.supports_gemm(a_spec, b_spec)
            if not ok:
                raise BackendUnavailable(
                    f"backend {self.name!r} cannot run {a_spec.summary()} x {b_spec.summary()}: {why}"
                )
            out = self._gemm(a_quantized, b_quantized, a_spec, b_spec, out_dtype=out_dtype)
            if out.shape[0] != m or out.shape[1] != n:
                out = out[:m, :n]
            return out
        _check_2d(a2d, "qgemm_nt operand a")
        if b_quantized is None:
            if b2d is None:
                raise ValueError("qgemm_nt needs b2d or b_quantized")
            _check_2d(b2d, "qgemm_nt operand b")
            n, kb = b2d.shape
        else:
            n, kb = operand_rows_k(b_quantized)
        m, k = a2d.shape
        if b_quantized is None and kb != k:
            raise ValueError(f"qgemm_nt: contraction dims differ: a {tuple(a2d.shape)} vs b [{n}, {kb}]")
        out_dtype = out_dtype or a2d.dtype

        if not a_spec.quantized and not b_spec.quantized:
            b = b2d if b_quantized is None else b_quantized
            return torch.matmul(a2d, b.to(a2d.dtype).t()).to(out_dtype)

        ok, why = self.supports_gemm(a_spec, b_spec)
        if not ok:
            raise BackendUnavailable(
                f"backend {self.name!r} cannot run {a_spec.summary()} x {b_spec.summary()}: {why}"
            )

        kp = _round_up(k, max(a_spec.block_k, b_spec.block_k))
        qa = self.quantize(_pad_to(a2d, m, kp), a_spec, generator=generator)
        if b_quantized is None:
            qb = self.quantize(_pad_to(b2d, n, kp), b_spec, generator=generator)
        else:
            if kb != kp:
                raise ValueError(
                    f"qgemm_nt: b_quantized has K={kb} but a needs K={k} (padded to {kp}); quantize b from an "
                    "aligned tensor or pass b2d instead"
                )
            qb = b_quantized
        out = self._gemm(qa, qb, a_spec, b_spec, out_dtype=out_dtype)
        if out.shape[0] != m or out.shape[1] != n:
            out = out[:m, :n]
        return out

    # --- kernel choice --------------------------------------------------------------------------------
    def with_kernels(self, kernels) -> Backend:
        """This backend bound to one resolved :class:`~minite_kernels.recipes.KernelChoice` (a linear's plan
        calls it once): a backend whose kernels are all fixed, as this base one, returns itself; the Triton
        backend returns a view that shares its state and reads the choice from ``kernels`` instead of the
        options on every call."""
        return self

    # --- grouped weight sync (optional; ``minite_kernels.modules.weight_sync``) ---------------------------
    def grouped_sync_refusal(self, w: torch.Tensor) -> str | None:
        """None if :meth:`weight_requantizer` can re-quantize ``w``, an NVFP4 per-tensor fprop weight, in grouped
        launches; otherwise why not. A backend without a grouped re-quantizer refuses every weight."""
        return f"the {self.name} backend has no grouped weight re-quantizer (the triton backend has one)"

    def weight_requantizer(self, weights: list[torch.Tensor], *, tile16: bool, cuda_graph: bool, amax_from=None):
        """An object that re-quantizes ``weights`` (each accepted by :meth:`grouped_sync_refusal`) into fixed
        buffers: ``.weights``, ``.sync() -> [quantized operand per weight]`` and ``.amax_given`` (whether the last
        sync took the amaxes that ``amax_from``, an optimizer recording them, holds)."""
        raise BackendUnavailable(self.grouped_sync_refusal(weights[0]) if weights else "no weights to re-quantize")

    # --- subclass hooks --------------------------------------------------------------------------
    @abc.abstractmethod
    def _quantize(
        self, x2d: torch.Tensor, spec: OperandSpec, *, generator: torch.Generator | None
    ) -> QuantizedOperand:
        """Quantize an aligned 2-D tensor with a quantized spec."""

    @abc.abstractmethod
    def _gemm(
        self,
        qa: QuantizedOperand,
        qb: QuantizedOperand,
        a_spec: OperandSpec,
        b_spec: OperandSpec,
        *,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``dequant(qa) @ dequant(qb)ᵀ`` with FP32 accumulation; may return padded rows/cols."""

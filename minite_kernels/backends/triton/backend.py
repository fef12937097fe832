"""The Triton backend: exact NVFP4 emulation on Hopper/Ampere tensor cores (report §4.2, §5.1; notes §1.4).

- ``quantize``: the fused Triton quantizer (``quantize.py``), byte-identical to ``minite_kernels.formats``
  (data, scales, amax, nonfinite), including stochastic rounding (the same random bytes, drawn from the same
  generator as the reference) and RHT (the reference's bf16 transform, then the kernel). It returns a
  :class:`~minite_kernels.backends.triton.tensor.TritonNVFP4Tensor` (``tensor.py``): a ``formats.NVFP4Tensor`` that also carries, from the same kernel launch, the
  dequantized values in BF16 (bit-equal to ``dequantize(torch.bfloat16)``) and optionally the exact
  ``qs = e2m1 * s_b`` GEMM operand.
- ``qgemm_nt``: one of two GEMM formulations, chosen by the recipe's ``kernels.gemm`` (:class:`KernelChoice`;
  ``MINITE_TRITON_GEMM`` overrides it for debugging):

  ``dequant`` (default for BF16 outputs)::

      Y = bf16(x̂) @ bf16(ŵ)ᵀ     (cuBLAS, FP32 accumulate)

  the operands are the dequantized NVFP4 values rounded once to BF16 (relative error <= 2^-9 per element,
  the same values a BF16 backward on dequantized operands uses, so forward and backward see one function);

  ``exact`` (always used for FP32/FP16 outputs)::

      Y = (qs_a @ qs_bᵀ) * amax_a * amax_b / 2688²       (qs exact in BF16, FP32 accumulate, FP32 epilogue)

  TE's row-scaled GEMM semantics (``gemm.py``): cuBLAS then a scaling pass for BF16 outputs; one Triton
  kernel (FP32 end to end) for FP32 outputs and with ``exact_fused``.
  Both are checked against the FP32 reference GEMM (tests state the tolerances).
- With ``kernels.decode=auto`` (the default), decode-sized GEMMs (at most ``DECODE_MAX_ROWS`` = 4
  per-token NVFP4 activation rows against a per-tensor NVFP4 weight: token-by-token generation of one to
  four sequences) run the packed-FP4 pair kernel (``decode.py``, ``decode_linear_pairs``): the activation
  is quantized by one launch that also writes its E2M1 codes as fp16 pair words, and the weight is read
  packed (0.5625 bytes/parameter instead of BF16's 2), with the ``exact`` semantics above. ``off`` sends
  them to the GEMM of ``kernels.gemm``, and so does a ROCm build of torch (``PAIR_KERNEL_OK``: the
  kernel's packed products are inline NVIDIA PTX). ``MINITE_TRITON_PDL=on`` launches both kernels with
  programmatic dependent launch on sm_90+ (``_common.pdl_mode``; off by default).
- MXFP8, CPU tensors and non-BF16 unquantized operands go to the emulated backend (one-time warning).

Activations shared by several linears (q/k/v projections read the same hidden states, gate/up the same MLP
input) are quantized once: the last round-to-nearest input is kept (a detached reference, so its memory
cannot be reused; the version counter is shared with the original) with its storage pointer, version
counter, shape, strides, spec, GEMM formulation and decode routing; any in-place change (the version counter moves) or any other tensor
misses. ``clear_cache()`` drops it.

Kernel choice: a linear's plan binds the backend to its recipe's resolved choice once
(:meth:`TritonBackend.with_kernels`: a view sharing this state, the shared-input cache included); the backend
used directly (no plan) resolves the process-wide choice (:func:`~minite_kernels.options.resolve_kernels`) per
call, as the options say.
"""

from __future__ import annotations

import functools

import torch

from minite_kernels.backends.base import Backend, QuantizedOperand, capability_str, cuda_capability
from minite_kernels.formats import NVFP4Tensor
from minite_kernels.options import resolve_kernels
from minite_kernels.recipes import KERNEL_CHOICES, KernelChoice, OperandSpec

from ._common import kernel_device_ok, triton_import_status, warn_once
from .decode import decode_linear_pairs, quantize_for_decode
from .gemm import scaled_mm_nt
from .quantize import dequantize_nvfp4_triton, quantize_nvfp4_triton, quantize_token_deq_bf16
from .tensor import _KERNEL_DTYPES, TritonNVFP4Tensor

GEMM_MODES = KERNEL_CHOICES["gemm"]
DECODE_MODES = KERNEL_CHOICES["decode"]
#: up to this many rows the pair kernel beats cuBLAS BF16 on the H200 (a Qwen3-4B block with its activation
#: quantization, weights from HBM; the timings are in benchmarks/RESULTS.md, issue #6)
DECODE_MAX_ROWS = 4
#: the pair kernel's products are inline NVIDIA PTX (``fma.rn.f16x2``): on a ROCm build of torch the
#: decode-sized GEMMs stay on the GEMM path
PAIR_KERNEL_OK = torch.version.hip is None


def gemm_mode() -> str:
    """The NVFP4 GEMM formulation where no recipe chooses (the backend used without a plan): the default
    :class:`KernelChoice`'s unless the options override it."""
    return resolve_kernels().gemm


def decode_mode() -> str:
    """The decode routing where no recipe chooses: ``auto`` runs GEMMs of at most DECODE_MAX_ROWS activation rows
    on the packed pair kernel (faster than cuBLAS BF16 there, and than the dequantized-weight GEMM it replaces,
    which reads the 16-bit weight copy); ``off`` keeps them on that GEMM."""
    return resolve_kernels().decode


class _Shared:
    """What a backend and its :meth:`TritonBackend.with_kernels` views share: the last round-to-nearest input
    ``(input, key, quantized)``, the RHT matrices, and the views themselves (one per choice)."""

    __slots__ = ("last", "rht", "views")

    def __init__(self) -> None:
        self.last: tuple | None = None
        self.rht: dict[torch.device, torch.Tensor] = {}
        self.views: dict[KernelChoice, TritonBackend] = {}


_UNIT_AMAX: dict[torch.device, torch.Tensor] = {}


def _unit_amax(device: torch.device) -> torch.Tensor:
    """fp32 [2688.0] on ``device``, made once (read-only: the GEMM epilogue only reads it)."""
    t = _UNIT_AMAX.get(device)
    if t is None:
        t = _UNIT_AMAX[device] = torch.full((1,), 2688.0, dtype=torch.float32, device=device)
    return t


def _exact_operand(q: QuantizedOperand) -> tuple[torch.Tensor, torch.Tensor]:
    """(BF16 operand, fp32 outer amax [1] or [rows]) for the exact GEMM."""
    if isinstance(q, torch.Tensor):  # a bf16-spec operand: amax 2688 makes the epilogue factor 1/2688
        return q, _unit_amax(q.device)
    if isinstance(q, TritonNVFP4Tensor):
        return q.exact_operand(), q.amax
    if isinstance(q, NVFP4Tensor):  # made by another backend (e.g. a cached weight): decode once, memoise
        qs = getattr(q, "_minite_qs", None)
        if qs is None or qs.device != q.data.device:
            qs = dequantize_nvfp4_triton(q.data, q.scales, None, per_token=False, dtype=torch.bfloat16)
            object.__setattr__(q, "_minite_qs", qs)
        return qs, q.amax
    raise TypeError(f"triton backend: unsupported GEMM operand {type(q).__name__}")


def _dequant_operand(q: QuantizedOperand) -> torch.Tensor:
    """The BF16 dequantized operand for the ``dequant`` GEMM."""
    if isinstance(q, torch.Tensor):
        return q
    if isinstance(q, TritonNVFP4Tensor):
        if q.deq is None:
            q.deq = q.dequantize(torch.bfloat16).reshape(q.rows, q.cols)
        deq = q.deq
        if (
            deq.dim() == 2 and deq.shape[0] == q.data.shape[0]
        ):  # [rows, cols] already (always, from _quantize)
            return deq
        return deq.reshape(q.rows, q.cols)
    if isinstance(q, NVFP4Tensor):
        deq = getattr(q, "_minite_deq", None)
        if deq is None or deq.device != q.data.device:
            deq = dequantize_nvfp4_triton(
                q.data, q.scales, q.amax, per_token=q.scaling == "per_token", dtype=torch.bfloat16
            )
            object.__setattr__(q, "_minite_deq", deq)
        return deq
    raise TypeError(f"triton backend: unsupported GEMM operand {type(q).__name__}")


class TritonBackend(Backend):
    name = "triton"

    def __init__(self, device=None) -> None:
        super().__init__(device)
        from minite_kernels.backends.emulated import EmulatedBackend

        self._fallback = EmulatedBackend(device)
        self._shared = _Shared()
        #: the bound choice (a view made by :meth:`with_kernels`); None: resolved from the options per call
        self.kernels: KernelChoice | None = None

    def with_kernels(self, kernels: KernelChoice) -> TritonBackend:
        """A view of this backend bound to ``kernels`` (one per choice, memoised): same device, fallback and
        shared state (the shared-input cache, so ``clear_cache`` on either clears both)."""
        views = self._shared.views
        view = views.get(kernels)
        if view is None:
            view = object.__new__(type(self))
            view.__dict__.update(self.__dict__)
            view.kernels = kernels
            views[kernels] = view
        return view

    def _kc(self) -> KernelChoice:
        k = self.kernels
        return resolve_kernels() if k is None else k

    # --- capability ------------------------------------------------------------------------------
    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        ok, why = triton_import_status()
        if not ok:
            return False, f"triton: {why}"
        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type != "cuda":
            return False, (
                f"triton: kernels need a CUDA GPU (sm_80+); device is {dev} "
                "(TRITON_INTERPRET=1 runs them on CPU for tests only)"
            )
        cap = cuda_capability(dev)
        if cap is None:
            return False, "triton: kernels need a CUDA GPU (sm_80+); no CUDA device is visible"
        if cap < (8, 0):
            return (
                False,
                f"triton: kernels need BF16 tensor cores (sm_80+); this GPU is {capability_str(cap)}",
            )
        return True, (
            f"triton: exact NVFP4 emulation on {capability_str(cap)} BF16 tensor cores "
            f"(fused quantize, BF16 tensor-core GEMM with FP32 accumulation; {why})"
        )

    def supports_quantize(self, spec: OperandSpec) -> tuple[bool, str]:
        return _supports_quantize(spec)

    def supports_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
        return _supports_gemm(a_spec, b_spec, self._kc().gemm)

    @staticmethod
    def _supports_quantize_uncached(spec: OperandSpec) -> tuple[bool, str]:
        if spec.format != "nvfp4":
            return False, f"triton: only NVFP4 quantization has kernels ({spec.format} -> emulated)"
        return True, f"triton: fused NVFP4 quantize ({spec.summary()})"

    @staticmethod
    def _supports_gemm_uncached(a_spec: OperandSpec, b_spec: OperandSpec, mode: str) -> tuple[bool, str]:
        fmts = {a_spec.format, b_spec.format}
        if not fmts <= {"nvfp4", "bf16"} or "nvfp4" not in fmts:
            return False, f"triton: NVFP4 GEMMs only ({a_spec.summary()} x {b_spec.summary()})"
        return True, (
            f"triton: {a_spec.summary()} x {b_spec.summary()} on BF16 tensor cores (FP32 accumulate; "
            f"gemm={mode})"
        )

    # --- hooks -----------------------------------------------------------------------------------
    def _kernel_ok(self, x: torch.Tensor) -> bool:
        return kernel_device_ok(x) and (x.dtype in _KERNEL_DTYPES or x.dtype == torch.float64)

    def _rht_apply(self, x: torch.Tensor) -> torch.Tensor:
        """The reference RHT (``formats.rht``): bf16 input, exact products, FP32 sums, one bf16 rounding;
        here a BF16 GEMM with FP32 accumulation against the cached 16x16 matrix."""
        from minite_kernels.formats import rht_matrix

        r = self._shared.rht.get(x.device)
        if r is None:
            r = self._shared.rht[x.device] = rht_matrix(torch.bfloat16, x.device)
        if not x.is_cuda:
            from minite_kernels.formats import apply_rht

            return apply_rht(x)
        return (x.to(torch.bfloat16).reshape(-1, 16) @ r).reshape(x.shape)

    def _quantize(self, x2d: torch.Tensor, spec: OperandSpec, *, generator=None) -> QuantizedOperand:
        if not self._kernel_ok(x2d):
            warn_once(
                f"q-{x2d.device.type}-{x2d.dtype}",
                f"triton backend: cannot run kernels on a {x2d.device.type} {x2d.dtype} tensor; "
                "using the emulated (pure PyTorch) quantizer for such inputs",
            )
            return self._fallback._quantize(x2d, spec, generator=generator)
        kc = self._kc()
        cacheable = not spec.stochastic_rounding
        key = self._key(x2d, spec, kc) if cacheable else None
        shared = self._shared
        last = shared.last
        if cacheable and last is not None and last[1] == key:
            return last[2]
        q = self._quantize_now(x2d, spec, generator, kc)
        shared.last = (x2d.detach(), key, q) if cacheable else None  # detach: keep no autograd graph alive
        return q

    # --- the learner's fast lane (modules/fast_lane.py): what it needs of a backend, by public name -------------
    def lane_accepts(self, x2d: torch.Tensor) -> bool:
        """Whether a dense call on ``x2d`` (BF16, contiguous, checked by the lane) may take the fast lane here:
        the kernels run on its device and it is not a decode-sized call that the packed pair kernel takes (at most
        ``DECODE_MAX_ROWS`` rows with decode routing on). The ``dequant`` GEMM formulation, the lane's other
        condition, is the plan's to check, once (``fast_lane.lane_ok``)."""
        return kernel_device_ok(x2d) and (x2d.shape[0] > DECODE_MAX_ROWS or self._kc().decode == "off")

    def dequantized(self, q: QuantizedOperand) -> torch.Tensor:
        """The BF16 dequantized operand the ``dequant`` GEMM reads, memoized on a Triton operand (the values
        :func:`dequantize_operand` gives: the Triton dequantizer is bit-equal to the reference)."""
        return _dequant_operand(q)

    def quantize_token_deq(self, x2d: torch.Tensor, spec: OperandSpec) -> TritonNVFP4Tensor:
        """``quantize(x2d, spec)`` on the learner's fast lane (``modules/fast_lane.py``), whose plan guarantees
        what the generic path checks per call: a per-token round-to-nearest NVFP4 ``spec`` without RHT, a
        contiguous BF16 input on a kernel device at an even offset, more than ``DECODE_MAX_ROWS`` rows (or
        decode routing off), K % 16 == 0, K <= 16384 and the ``dequant`` GEMM formulation. Same kernel, same
        operand (packed bytes, scales, amax, nonfinite and the BF16 ``deq``) and the same shared-input cache
        entry as :meth:`quantize`."""
        key = self._key(x2d, spec, self._kc())
        shared = self._shared
        last = shared.last
        if last is not None and last[1] == key:
            return last[2]
        out = quantize_token_deq_bf16(x2d)
        q = TritonNVFP4Tensor(
            data=out.data,
            scales=out.scales,
            amax=out.amax,
            shape=x2d.shape,
            scaling="per_token",
            tile=(1, 16),
            rounding="nearest",
            rht=False,
            orig_dtype=torch.bfloat16,
            nonfinite=out.nonfinite,
            deq=out.deq,
            qs_transient=True,
        )
        shared.last = (x2d.detach(), key, q)
        return q

    # --- grouped weight sync ---------------------------------------------------------------------
    def grouped_sync_refusal(self, w: torch.Tensor) -> str | None:
        if w.dtype != torch.bfloat16 or not kernel_device_ok(w):
            return f"weight is {w.dtype} on {w.device}; the grouped kernels take BF16 on a CUDA device"
        return None

    def weight_requantizer(self, weights: list[torch.Tensor], *, tile16: bool, cuda_graph: bool, amax_from=None):
        """A :class:`~minite_kernels.backends.triton.weight_sync.WeightRequantizer` that also refreshes each
        weight's dequantized BF16 GEMM operand, which the fast lane and the sampler's packed groups read."""
        from .weight_sync import WeightRequantizer

        return WeightRequantizer(weights, tile16=tile16, write_deq=True, cuda_graph=cuda_graph, amax_from=amax_from)

    def clear_cache(self) -> None:
        """Forget the remembered last input (and its quantized copy), for this backend and its views."""
        self._shared.last = None

    @staticmethod
    def _key(x: torch.Tensor, spec: OperandSpec, kc: KernelChoice) -> tuple:
        """The shared-input cache's key: the input's identity and layout, the spec, and the two choices that change
        the operand a quantization makes (``gemm``: ``deq`` or ``qs``; ``decode``: the pair words of a short input),
        so linears whose recipes choose alike share it and others do not."""
        return (
            x.data_ptr(),
            x._version,
            x.shape,
            x.stride(),
            x.dtype,
            x.device,
            spec,
            kc.gemm,
            kc.decode,
        )

    def _quantize_now(
        self, x2d: torch.Tensor, spec: OperandSpec, generator, kc: KernelChoice
    ) -> TritonNVFP4Tensor:
        from minite_kernels import formats

        orig_shape, orig_dtype = x2d.shape, x2d.dtype
        x = x2d
        if spec.rht:
            x = self._rht_apply(x)  # bf16 [M, K], as the reference (notes §1.6)
        elif x.dtype == torch.float64:
            x = x.to(torch.float32)
        m, k = x.shape
        rbits = None
        if spec.stochastic_rounding:
            rbits = formats.random_bytes((m, k), generator=generator, device=x.device)
        per_token = spec.scaling == "per_token"
        mode = kc.gemm
        qs_decode = None
        if (
            per_token
            and m <= DECODE_MAX_ROWS
            and rbits is None
            and not spec.rht
            and x.stride(1) == 1
            and kc.decode == "auto"
            and PAIR_KERNEL_OK
        ):  # decode-sized activations: one launch also writes the codes as the pair kernel's words
            out, qs_decode = quantize_for_decode(x)
        else:
            want_deq = mode == "dequant" and orig_dtype == torch.bfloat16
            out = quantize_nvfp4_triton(
                x,
                per_token=per_token,
                tile16=spec.tile == (16, 16),
                rbits=rbits,
                write_packed=True,
                write_qs=not want_deq,
                write_deq=want_deq,
            )
        return TritonNVFP4Tensor(
            data=out.data,
            scales=out.scales,
            amax=out.amax,
            shape=orig_shape,
            scaling=spec.scaling,
            tile=tuple(spec.tile),
            rounding="stochastic" if spec.stochastic_rounding else "nearest",
            rht=bool(spec.rht),
            orig_dtype=orig_dtype,
            nonfinite=out.nonfinite,
            qs=out.qs,
            deq=out.deq,
            qs_transient=per_token or spec.stochastic_rounding or spec.rht,
            qs_decode=qs_decode,
        )

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype: torch.dtype) -> torch.Tensor:
        qa_plain, qb_plain = isinstance(qa, torch.Tensor), isinstance(qb, torch.Tensor)
        ref = qa if qa_plain else qa.data
        plain_ok = (not qa_plain or qa.dtype == torch.bfloat16) and (
            not qb_plain or qb.dtype == torch.bfloat16
        )
        if not kernel_device_ok(ref) or not plain_ok:
            warn_once(
                f"g-{ref.device.type}",
                f"triton backend: GEMM on {ref.device.type} tensors (or a non-BF16 unquantized operand) runs "
                "on the emulated backend",
            )
            return self._fallback._gemm(qa, qb, a_spec, b_spec, out_dtype=out_dtype)
        kc = self._kc()
        if _decode_ok(qa, qb, kc):
            return decode_linear_pairs(
                qa.qs_decode, qa.scales, qa.amax, qb.data, qb.scales, qb.amax, out_dtype=out_dtype
            )
        mode = kc.gemm
        if mode == "dequant" and out_dtype == torch.bfloat16:
            return torch.mm(_dequant_operand(qa), _dequant_operand(qb).t())
        a, sa = _exact_operand(qa)
        b, sb = _exact_operand(qb)
        # FP32 outputs always take the fused kernel: the cuBLAS path would round the product to BF16 first
        fused = mode == "exact_fused" or out_dtype == torch.float32
        return scaled_mm_nt(a, b, sa, sb, out_dtype=out_dtype, impl="triton" if fused else "cublas")


def _decode_ok(qa, qb, kc: KernelChoice) -> bool:
    """An activation quantized for the pair decode kernel (``qs_decode``: per token, at most
    ``DECODE_MAX_ROWS`` rows, round to nearest, no RHT; see ``quantize``) against a per-tensor NVFP4 weight.
    Decode-sized activations quantized otherwise (stochastic rounding, or by another backend) take the GEMM
    path."""
    return (
        isinstance(qa, TritonNVFP4Tensor)
        and qa.qs_decode is not None
        and isinstance(qb, NVFP4Tensor)
        and qb.scaling == "per_tensor"
        and not qb.rht
        and qb.data.is_contiguous()
        and kernel_device_ok(qb.data)
        and kc.decode == "auto"
        and PAIR_KERNEL_OK
    )


# (ok, reason) depends only on the frozen specs: computed once, not per call (this runs for every GEMM)
_supports_quantize = functools.lru_cache(maxsize=None)(TritonBackend._supports_quantize_uncached)
_supports_gemm = functools.lru_cache(maxsize=None)(TritonBackend._supports_gemm_uncached)

__all__ = ["DECODE_MAX_ROWS", "GEMM_MODES", "TritonBackend", "decode_mode", "gemm_mode"]

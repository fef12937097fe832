"""TransformerEngine backend: TE's NVFP4 / MXFP8 quantizers and cuBLAS block-scaled GEMM (Blackwell only).

Report §4.2/§5: TE integration behind the same backend interface. Written against TE 2.20.2's Python API
(notes §1.7–§1.8, §2): ``transformer_engine.pytorch.tensor.nvfp4_tensor.NVFP4Quantizer``,
``...mxfp8_tensor.MXFP8Quantizer``, the storage classes ``NVFP4TensorStorage`` / ``MXFP8TensorStorage``,
and ``transformer_engine.pytorch.cpp_extensions.general_gemm``. TE's NVFP4/MXFP8 kernels exist only for
sm_100+ (``te.autocast`` asserts "Device compute capability 10.0 or higher required"), so
:meth:`TEBackend.availability` refuses below capability 10.0 and says so.

Mapping of our operands (both quantized along K, ``qgemm_nt(a, b) = a @ bᵀ``) onto TE:
  - a non-RHT operand is quantized row-wise (``rowwise=True, columnwise=False``); per-token →
    ``row_scaled_nvfp4=True`` (amax ``[M]``), 16x16 → ``with_2d_quantization=True``, SR →
    ``stochastic_rounding=True`` (TE draws from the CUDA default generator; ``generator`` is not used);
  - an RHT operand (wgrad's dYᵀ, Xᵀ) is TE's *column-wise* copy of the untransposed tensor
    (``columnwise=True, with_rht=True, with_post_rht_amax=True`` applied to ``x2d.T``), whose storage is
    ``x2d`` quantized along K after the RHT: exactly our operand;
  - the GEMM is ``general_gemm(B_te, A_te, layout="TN")`` (TE's fprop convention: out = A_te-rows @ B_te-rowsᵀ).
Quantized operands cross the interface as canonical ``minite_kernels.formats`` objects; the layout
conversions below (pure torch, tested on CPU) pad TE's ``[roundup(M,128), roundup(Kb,4)]`` uint8 scale
buffers and unswizzle them when TE produced GEMM-swizzled scales.

Not verified on hardware here (no Blackwell GPU is available to this project); the conversions and gates are
tested on CPU, and the GEMM semantics are checked against the emulated backend by the GPU test
``tests/minite_kernels/test_backends.py::test_te_matches_emulated`` (skipped without sm_100).
"""

from __future__ import annotations

import torch

from minite_kernels.backends.base import Backend, QuantizedOperand, native_fp4_gate
from minite_kernels.recipes import OperandSpec


def _roundup(n: int, m: int) -> int:
    return -(-n // m) * m


def pad_scales_for_te(scales: torch.Tensor) -> torch.Tensor:
    """Canonical row-major scales ``[M, Kb]`` (E4M3 or E8M0 bytes) → TE's compact (unswizzled) buffer:
    uint8 ``[roundup(M,128), roundup(Kb,4)]``, zero-padded."""
    m, kb = scales.shape
    out = torch.zeros((_roundup(m, 128), _roundup(kb, 4)), dtype=torch.uint8, device=scales.device)
    out[:m, :kb] = scales.contiguous().view(torch.uint8)
    return out


def scales_from_te(
    scale_inv: torch.Tensor, m: int, kb: int, *, swizzled: bool, dtype: torch.dtype
) -> torch.Tensor:
    """TE scale buffer (compact or GEMM-swizzled, padded) → canonical ``[M, Kb]`` in ``dtype``'s bytes."""
    from minite_kernels.formats import unswizzle_scales_128x4

    raw = scale_inv.view(torch.uint8)
    if swizzled:
        out = unswizzle_scales_128x4(raw, m, kb)
    else:
        out = raw.reshape(-1, raw.shape[-1])[:m, :kb].contiguous()
    return out.view(dtype)


def te_quantizer_kwargs(spec: OperandSpec) -> dict:
    """Keyword arguments of TE's quantizer for one of our operands (report §7.3: doctor shows them).

    NVFP4 → ``NVFP4Quantizer(**kwargs)``; MXFP8 → ``MXFP8Quantizer(tex.DType.kFloat8E4M3, **kwargs)``.
    An RHT operand is TE's column-wise copy of the transposed tensor (see the module docstring).
    """
    if spec.format == "mxfp8":
        return {"rowwise": True, "columnwise": False}
    if spec.format != "nvfp4":
        raise ValueError(f"TE quantizes nvfp4/mxfp8 operands, not {spec.format!r}")
    return {
        "rowwise": not spec.rht,
        "columnwise": spec.rht,
        "with_rht": spec.rht,
        "with_post_rht_amax": spec.rht,
        "with_2d_quantization": spec.tile == (16, 16),
        "stochastic_rounding": spec.stochastic_rounding,
        "row_scaled_nvfp4": spec.scaling == "per_token",
    }


class TEBackend(Backend):
    name = "te"

    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        ok, why = native_fp4_gate(device, "TransformerEngine NVFP4/MXFP8 GEMMs")
        if not ok:
            return False, f"te: {why}"
        try:
            import transformer_engine.pytorch  # noqa: F401
            import transformer_engine_torch  # noqa: F401
        except Exception as e:  # noqa: BLE001 - ImportError, or a CUDA/ABI mismatch inside TE
            return False, (
                f"te: transformer_engine.pytorch is not importable ({type(e).__name__}: {e}); "
                "install with pip install 'minite-rl[blackwell]'"
            )
        return True, f"te: TransformerEngine block-scaled cuBLAS GEMM ({why})"

    def supports_quantize(self, spec: OperandSpec) -> tuple[bool, str]:
        if spec.format == "nvfp4" and spec.rht and spec.scaling == "per_token":
            return False, "TE applies RHT only to per-tensor column copies"
        return True, f"te: TE {spec.format.upper()} quantizer"

    def supports_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
        if not (a_spec.quantized and b_spec.quantized):
            return False, "TE has no weight-only (W4A16) GEMM"
        for s in (a_spec, b_spec):
            ok, why = self.supports_quantize(s)
            if not ok:
                return False, why
        return True, f"te: TE {a_spec.format.upper()} cuBLAS block-scaled GEMM (sm_100+)"

    # --- quantization ----------------------------------------------------------------------------
    def _quantize(self, x2d: torch.Tensor, spec: OperandSpec, *, generator=None) -> QuantizedOperand:
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
        from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

        from minite_kernels.formats import MXFP8Tensor, NVFP4Tensor

        m, k = x2d.shape
        if spec.format == "mxfp8":
            q = MXFP8Quantizer(tex.DType.kFloat8E4M3, **te_quantizer_kwargs(spec))
            q.internal = True
            t = q(x2d)
            scales = scales_from_te(
                t._rowwise_scale_inv,
                m,
                k // 32,
                swizzled=bool(t._with_gemm_swizzled_scales),
                dtype=torch.uint8,
            )
            return MXFP8Tensor(
                data=t._rowwise_data.view(torch.float8_e4m3fn),
                scales=scales,
                shape=x2d.shape,
                orig_dtype=x2d.dtype,
            )
        q = NVFP4Quantizer(**te_quantizer_kwargs(spec))
        q.internal = True
        if spec.rht:  # TE's column copy of x2d.T is x2d quantized along K after the RHT (bf16 transform)
            t = q(x2d.t().contiguous().to(torch.bfloat16))
            data, scale_inv, amax = t._columnwise_data, t._columnwise_scale_inv, t._amax_columnwise
        else:
            t = q(x2d)
            data, scale_inv, amax = t._rowwise_data, t._rowwise_scale_inv, t._amax_rowwise
        scales = scales_from_te(
            scale_inv, m, k // 16, swizzled=bool(t._with_gemm_swizzled_scales), dtype=torch.float8_e4m3fn
        )
        return NVFP4Tensor(
            data=data.reshape(m, k // 2),
            scales=scales,
            amax=amax.reshape(-1).float(),
            shape=x2d.shape,
            scaling=spec.scaling,
            tile=spec.tile,
            rounding="stochastic" if spec.stochastic_rounding else "nearest",
            rht=spec.rht,
            orig_dtype=x2d.dtype,
        )

    # --- GEMM ------------------------------------------------------------------------------------
    @staticmethod
    def _to_te(q: QuantizedOperand):
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage
        from transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage import NVFP4TensorStorage

        from minite_kernels.formats import MXFP8Tensor

        if isinstance(q, MXFP8Tensor):
            return MXFP8TensorStorage(
                rowwise_data=q.data.view(torch.uint8),
                rowwise_scale_inv=pad_scales_for_te(q.scales),
                columnwise_data=None,
                columnwise_scale_inv=None,
                fp8_dtype=tex.DType.kFloat8E4M3,
                quantizer=None,
                with_gemm_swizzled_scales=False,
            )
        return NVFP4TensorStorage(
            rowwise_data=q.data,
            rowwise_scale_inv=pad_scales_for_te(q.scales),
            columnwise_data=None,
            columnwise_scale_inv=None,
            amax_rowwise=q.amax.reshape(-1).float(),
            amax_columnwise=None,
            fp4_dtype=tex.DType.kFloat4E2M1,
            quantizer=None,
            with_gemm_swizzled_scales=False,
            row_scaled_nvfp4=q.scaling == "per_token",
        )

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype: torch.dtype) -> torch.Tensor:
        from transformer_engine.pytorch.cpp_extensions import general_gemm

        gemm_dtype = out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.float32
        out = general_gemm(self._to_te(qb), self._to_te(qa), out_dtype=gemm_dtype, layout="TN")[0]
        return out.to(out_dtype)

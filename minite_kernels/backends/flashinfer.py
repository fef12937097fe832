"""FlashInfer backend: ``nvfp4_quantize`` + ``mm_fp4`` (CUTLASS/cuDNN FP4 GEMM), Blackwell only.

Written against flashinfer-python 0.7.x (notes §3):
``nvfp4_quantize(a, a_global_sf, sfLayout=SfLayout.layout_128x4, do_shuffle=False)`` → ``(fp4 [M,K/2] u8,
swizzled E4M3 scales)`` with ``a_global_sf = S_enc = 2688/amax``; ``mm_fp4(a, b, a_descale, b_descale, alpha,
out_dtype, backend=...)`` with ``b`` column-major ``(k, n)`` (pass ``b_fp4.T`` and ``b_sf.T``).

GEMM math: with per-tensor amaxes the block-scaled product is multiplied by
``alpha = amax_a * amax_b * fl(1/(36*448²))`` (cuBLAS/TE's epilogue, notes §1.4; FlashInfer writes it
``1/(gs_a*gs_b)``). Per-token (row-scaled) operands cannot be consumed by dense ``mm_fp4`` (FlashInfer issue
#4300), so like TE's row-scaled path we run the GEMM with unit amax for that side into FP32 and multiply the
output rows (a) / columns (b) by their amax afterwards. :func:`mm_fp4_arguments` builds all of that in pure
torch and :func:`emulate_mm_fp4` replays FlashInfer's contract on CPU, so the layout/alpha preparation is
tested against the emulated backend without the hardware.

Numerics: FlashInfer's default quantizer uses fast-math reciprocals and is not bit-exact with TE; setting
``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1`` (done here before FlashInfer is imported, and checked by
``availability``) selects IEEE division, meant to match TE. Only per-tensor, 1x16, round-to-nearest,
no-RHT bf16/fp16 operands are quantized by FlashInfer; the rest (16x16 weights, SR, RHT, per-token) are quantized by
the exact ``formats`` reference: the GEMM only sees E2M1 codes and E4M3 scales, whatever chose them.

Gate: capability >= 10.0. ``fp4_quantize`` has no capability check and **silently returns zeros on
sm_90** (its sm90 build compiles the conversion out), so this backend must refuse there.
"""

from __future__ import annotations

import os

import torch

from minite_kernels.backends.base import Backend, QuantizedOperand, native_fp4_gate
from minite_kernels.recipes import OperandSpec

FAST_MATH_ENV = "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH"
#: fl(1/(36*448²)) = fl(1/2688²): the per-tensor GEMM epilogue factor
INV_2688_SQ = 1.0 / (2688.0 * 2688.0)


def gemm_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor) -> torch.Tensor:
    """``alpha = amax_a * amax_b * fl(1/(36*448²))`` as fp32 ``[1]`` (per-tensor amaxes, shape [1])."""
    a = amax_a.reshape(-1).float()
    b = amax_b.reshape(-1).float()
    if a.numel() != 1 or b.numel() != 1:
        raise ValueError("gemm_alpha expects per-tensor amaxes of shape [1]")
    return (a * b) * torch.tensor(INV_2688_SQ, dtype=torch.float32, device=a.device)


def mm_fp4_arguments(qa, qb) -> dict:
    """Arguments for ``flashinfer.mm_fp4`` from two canonical ``NVFP4Tensor`` operands (a [M,K], b [N,K]).

    Returns ``a, b, a_descale, b_descale, alpha`` (b and b_descale as transposed views, i.e. column-major
    ``(k, n)``) plus ``row_scale`` [M,1] / ``col_scale`` [1,N] (or None) to apply to the FP32 output for
    per-token operands (their amax is taken out of ``alpha``).
    """
    from minite_kernels.formats import swizzle_scales_128x4

    one = torch.ones(1, dtype=torch.float32, device=qa.data.device)
    a_tok, b_tok = qa.scaling == "per_token", qb.scaling == "per_token"
    alpha = gemm_alpha(one if a_tok else qa.amax, one if b_tok else qb.amax)
    return {
        "a": qa.data,
        "b": qb.data.t(),
        "a_descale": swizzle_scales_128x4(qa.scales).view(torch.uint8),
        "b_descale": swizzle_scales_128x4(qb.scales).view(torch.uint8).t(),
        "alpha": alpha,
        "row_scale": qa.amax.float().reshape(-1, 1) if a_tok else None,
        "col_scale": qb.amax.float().reshape(1, -1) if b_tok else None,
        "m": qa.rows,
        "n": qb.rows,
    }


def apply_output_scales(out: torch.Tensor, args: dict) -> torch.Tensor:
    if args["row_scale"] is not None:
        out = out * args["row_scale"]
    if args["col_scale"] is not None:
        out = out * args["col_scale"]
    return out


def emulate_mm_fp4(args: dict) -> torch.Tensor:
    """Pure-torch replay of ``mm_fp4``'s contract on the prepared arguments (FP32 output), for CPU tests:
    decode E2M1 codes and *swizzled* E4M3 scales, block-scaled product, times alpha, then output scales."""
    from minite_kernels.formats import e2m1_decode, unpack_nibbles, unswizzle_scales_128x4

    m, n = args["m"], args["n"]
    k = args["a"].shape[1] * 2
    sa = unswizzle_scales_128x4(args["a_descale"], m, k // 16).view(torch.float8_e4m3fn).float()
    sb = unswizzle_scales_128x4(args["b_descale"].t(), n, k // 16).view(torch.float8_e4m3fn).float()
    va = e2m1_decode(unpack_nibbles(args["a"])).view(m, k // 16, 16) * sa.unsqueeze(-1)
    vb = e2m1_decode(unpack_nibbles(args["b"].t())).view(n, k // 16, 16) * sb.unsqueeze(-1)
    out = (va.reshape(m, k) @ vb.reshape(n, k).t()) * args["alpha"]
    return apply_output_scales(out, args)


class FlashInferBackend(Backend):
    name = "flashinfer"

    @classmethod
    def availability(cls, device=None) -> tuple[bool, str]:
        ok, why = native_fp4_gate(device, "FlashInfer FP4 GEMMs (mm_fp4)")
        if not ok:
            return False, f"flashinfer: {why} (fp4_quantize would silently return zeros below sm_100)"
        os.environ.setdefault(FAST_MATH_ENV, "1")
        if os.environ.get(FAST_MATH_ENV) != "1":
            return False, (
                f"flashinfer: {FAST_MATH_ENV}={os.environ.get(FAST_MATH_ENV)!r}; FlashInfer's fast-math FP4 "
                "quantizer is not bit-exact with TE, set it to 1"
            )
        try:
            import flashinfer  # noqa: F401
        except Exception as e:  # noqa: BLE001 - ImportError, or a JIT/CUDA failure inside flashinfer
            return False, (
                f"flashinfer: flashinfer is not importable ({type(e).__name__}: {e}); "
                "install with pip install 'minite-rl[blackwell]'"
            )
        return True, f"flashinfer: mm_fp4 ({why})"

    @staticmethod
    def _native_quantize(spec: OperandSpec) -> bool:
        return (
            spec.format == "nvfp4"
            and spec.scaling == "per_tensor"
            and spec.tile == (1, 16)
            and not spec.rht
            and not spec.stochastic_rounding
        )

    def supports_quantize(self, spec: OperandSpec) -> tuple[bool, str]:
        if spec.format != "nvfp4":
            return False, "FlashInfer backend handles NVFP4 only"
        how = "flashinfer.nvfp4_quantize" if self._native_quantize(spec) else "formats reference (exact)"
        return True, f"flashinfer: {how}"

    def supports_gemm(self, a_spec: OperandSpec, b_spec: OperandSpec) -> tuple[bool, str]:
        if a_spec.format != "nvfp4" or b_spec.format != "nvfp4":
            return False, "mm_fp4 needs NVFP4 on both operands"
        return True, "flashinfer: mm_fp4 block-scaled FP4 GEMM (sm_100+)"

    def _quantize(self, x2d: torch.Tensor, spec: OperandSpec, *, generator=None) -> QuantizedOperand:
        from minite_kernels import formats

        if not self._native_quantize(spec) or x2d.dtype not in (torch.bfloat16, torch.float16):
            return formats.quantize_nvfp4(
                x2d,
                scaling=spec.scaling,
                tile=spec.tile,
                rounding="stochastic" if spec.stochastic_rounding else "nearest",
                rht=spec.rht,
                generator=generator,
            )
        import flashinfer

        m, k = x2d.shape
        amax = x2d.detach().abs().amax().float().reshape(1)
        gs = formats.global_encode_scale(amax)
        data, sf = flashinfer.nvfp4_quantize(
            x2d, gs, sfLayout=flashinfer.SfLayout.layout_128x4, do_shuffle=False
        )
        scales = formats.unswizzle_scales_128x4(sf.view(torch.uint8), m, k // 16).view(torch.float8_e4m3fn)
        return formats.NVFP4Tensor(
            data=data.view(torch.uint8), scales=scales, amax=amax, shape=x2d.shape, orig_dtype=x2d.dtype
        )

    def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype: torch.dtype) -> torch.Tensor:
        import flashinfer

        args = mm_fp4_arguments(qa, qb)
        # mm_fp4 writes bf16 (its documented output dtype); per-token amaxes are applied after, in fp32
        out = flashinfer.mm_fp4(
            args["a"],
            args["b"],
            args["a_descale"],
            args["b_descale"],
            args["alpha"],
            torch.bfloat16,
            block_size=16,
            use_8x4_sf_layout=False,
            backend="cutlass",
            use_nvfp4=True,
        )
        return apply_output_scales(out.float(), args).to(out_dtype)

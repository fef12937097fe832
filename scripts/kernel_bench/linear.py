"""Section ``linear``: the W4A4 linear at Qwen3-4B shapes, forward and forward + backward, against BF16, the
emulated reference and torchao."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from kernel_bench.common import (
    QWEN3_4B,
    SHARES_INPUT,
    bench,
    emit,
    free,
    layer_shapes,
    section,
)

from minite_kernels.options import set_options


def _torchao_available() -> bool:
    try:
        import torchao  # noqa: F401
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor  # noqa: F401

        return True
    except Exception as e:
        print(f"# torchao not available: {e}", flush=True)
        return False


@section("linear")
def bench_linear(args):
    from minite_kernels.backends.emulated import EmulatedBackend
    from minite_kernels.backends.triton import TritonBackend
    from minite_kernels.modules import Linear
    from minite_kernels.recipes import get_qlinear_params

    tokens = args.tokens
    tb, eb = TritonBackend("cuda"), EmulatedBackend("cuda")
    spec = get_qlinear_params("nvfp4_per_token").fprop
    have_ao = _torchao_available()
    totals: dict[str, float] = {}

    def add(key, v):
        totals[key] = totals.get(key, 0.0) + v

    for name, n, k in layer_shapes(QWEN3_4B):
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        qw = tb.quantize(w, spec.b)
        rec = {"bench": "linear_fwd", "case": f"{name}_{n}x{k}", "M": tokens, "N": n, "K": k}
        rec["bf16_ms"] = t_bf16 = bench(lambda: F.linear(x, w))
        add("bf16", t_bf16)
        from minite_kernels.backends.triton import scaled_mm_nt

        def fwd():
            tb.clear_cache()  # no reuse across repetitions (the q/k/v input cache would hit)
            return tb.qgemm_nt(
                None,
                None,
                spec.a,
                spec.b,
                a_quantized=tb.quantize(x, spec.a),
                b_quantized=qw,
                out_dtype=torch.bfloat16,
            )

        for mode in ("dequant", "exact", "exact_fused"):
            set_options(gemm=mode)
            tb.clear_cache()
            qw = tb.quantize(w, spec.b)
            t = bench(fwd)
            rec[f"ours_{mode}_ms"] = t
            rec[f"ratio_{mode}"] = t / t_bf16
            add(mode, t)
            tb.clear_cache()
            rec[f"quantize_x_{mode}_ms"] = bench(lambda: (tb.clear_cache(), tb.quantize(x, spec.a)))
            qx = tb.quantize(x, spec.a)
            if mode == "dequant":
                rec["gemm_only_dequant_ms"] = t_g = bench(lambda: torch.mm(qx.deq, qw.deq.t()))
                # in a model q/k/v read one input and gate/up another: the module quantizes each input once
                add(
                    "dequant_shared_input",
                    t_g + (0.0 if name in SHARES_INPUT else rec["quantize_x_dequant_ms"]),
                )
                # GPU time alone (CUDA-graph replay): the times above include the host's launch cost
                # whenever the host is slower than the kernels (small GEMMs on a slow host)
                g_b = bench(lambda: F.linear(x, w), graph=True)
                g_o = bench(fwd, graph=True)
                g_q = bench(lambda: (tb.clear_cache(), tb.quantize(x, spec.a)), graph=True)
                g_g = bench(lambda: torch.mm(qx.deq, qw.deq.t()), graph=True)
                rec.update(
                    gpu_bf16_ms=g_b,
                    gpu_dequant_ms=g_o,
                    gpu_ratio_dequant=g_o / g_b,
                    gpu_quantize_x_ms=g_q,
                    gpu_gemm_only_dequant_ms=g_g,
                )
                add("gpu_bf16", g_b)
                add("gpu_dequant", g_o)
                add("gpu_dequant_shared_input", g_g + (0.0 if name in SHARES_INPUT else g_q))
            else:
                qx.qs_transient = False
                qa, qb = qx.exact_operand(), qw.exact_operand()
                impl = "triton" if mode == "exact_fused" else "cublas"
                rec[f"gemm_only_{mode}_ms"] = bench(lambda: scaled_mm_nt(qa, qb, qx.amax, qw.amax, impl=impl))
        set_options(gemm="dequant")
        tb.clear_cache()
        qw = tb.quantize(w, spec.b)
        qw_e = eb.quantize(w, spec.b)
        rec["emulated_ms"] = t_e = bench(
            lambda: eb.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw_e, out_dtype=torch.bfloat16),
            rep=30,
            warmup=3,
        )
        rec["ratio_emulated"] = t_e / t_bf16
        add("emulated", t_e)
        if have_ao:
            try:
                from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
                from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
                from torchao.quantization import quantize_

                lin_ao = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
                with torch.no_grad():
                    lin_ao.weight.copy_(w)
                quantize_(lin_ao, NVFP4WeightOnlyConfig())
                with torch.no_grad():
                    rec["torchao_weight_only_ms"] = t = bench(lambda: lin_ao(x))
                rec["ratio_torchao_weight_only"] = t / t_bf16
                add("torchao_weight_only", t)

                def ao_fake():
                    xa = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(x.abs().max()))
                    wa = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()))
                    return F.linear(xa.dequantize(torch.bfloat16), wa.dequantize(torch.bfloat16))

                rec["torchao_fakequant_w4a4_ms"] = t = bench(ao_fake, rep=30, warmup=3)
                rec["ratio_torchao_fakequant_w4a4"] = t / t_bf16
                add("torchao_fakequant_w4a4", t)
            except Exception as e:
                rec["torchao_error"] = f"{type(e).__name__}: {e}"[:300]
            if name == "q_proj":
                try:  # torchao's NVFP4 QAT linear (forward through FP4 _scaled_mm: Blackwell only)
                    from torchao.prototype.qat.nvfp4 import NVFP4FakeQuantizeConfig, NVFP4FakeQuantizedLinear

                    qat = NVFP4FakeQuantizedLinear(
                        k,
                        n,
                        bias=False,
                        activation_config=NVFP4FakeQuantizeConfig(),
                        weight_config=NVFP4FakeQuantizeConfig(),
                        device="cuda",
                        dtype=torch.bfloat16,
                    )
                    with torch.no_grad():
                        rec["torchao_qat_linear_ms"] = bench(lambda: qat(x), rep=50, warmup=5)
                except Exception as e:
                    rec["torchao_qat_linear_error"] = f"{type(e).__name__}: {e}"[:300]
        # accuracy against the emulated reference (FP32 GEMM) on this shape, both output precisions
        y_ref = eb.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw_e, out_dtype=torch.float32)
        for od in (torch.bfloat16, torch.float32):
            tb.clear_cache()
            y = tb.qgemm_nt(x, None, spec.a, spec.b, b_quantized=qw, out_dtype=od).float()
            rec[f"rel_l2_vs_emulated_{str(od)[6:]}"] = ((y - y_ref).norm() / y_ref.norm()).item()
        emit(rec)

        # fwd + bwd through the module (nvfp4_per_token_bf16_bwd) against nn.Linear in bf16
        rec = {"bench": "linear_fwd_bwd", "case": f"{name}_{n}x{k}", "M": tokens, "N": n, "K": k}
        ref_lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        xg = x.clone().requires_grad_()

        def step(mod):
            tb_mod = getattr(mod, "backend_for", None)
            if tb_mod is not None:
                b = mod.backend_for(xg.device)
                if hasattr(b, "clear_cache"):
                    b.clear_cache()  # no reuse of the quantized input across repetitions
            y = mod(xg)
            y.backward(dy)

        rec["bf16_ms"] = t_b = bench(lambda: step(ref_lin))
        add("fb_bf16", t_b)
        for recipe in ("nvfp4_per_token_bf16_bwd", "nvfp4_per_token"):
            lin = Linear(
                k, n, bias=False, qlinear_params=recipe, backend="triton", device="cuda", dtype=torch.bfloat16
            )
            lin.load_state_dict(ref_lin.state_dict())
            t = bench(lambda: step(lin), rep=100)
            rec[f"{recipe}_ms"] = t
            rec[f"ratio_{recipe}"] = t / t_b
            add(f"fb_{recipe}", t)
            if recipe == "nvfp4_per_token_bf16_bwd":
                lin_e = Linear(
                    k,
                    n,
                    bias=False,
                    qlinear_params=recipe,
                    backend="emulated",
                    device="cuda",
                    dtype=torch.bfloat16,
                )
                lin_e.load_state_dict(ref_lin.state_dict())
                t = bench(lambda: step(lin_e), rep=30, warmup=3)
                rec[f"{recipe}_emulated_ms"] = t
                rec[f"ratio_{recipe}_emulated"] = t / t_b
            lin = None
        emit(rec)
        x = w = qw = qw_e = xg = dy = None
        free()
    out = {"bench": "linear_layer_total", "case": "qwen3_4b_block_7_linears", "M": tokens}
    for key, v in totals.items():
        out[f"{key}_ms"] = v
    for key in (
        "dequant",
        "dequant_shared_input",
        "exact",
        "exact_fused",
        "emulated",
        "torchao_weight_only",
        "torchao_fakequant_w4a4",
    ):
        if key in totals:
            out[f"fwd_ratio_{key}"] = totals[key] / totals["bf16"]
    for key in ("gpu_dequant", "gpu_dequant_shared_input"):
        if key in totals:
            out[f"fwd_ratio_{key}"] = totals[key] / totals["gpu_bf16"]
    for key in ("nvfp4_per_token_bf16_bwd", "nvfp4_per_token"):
        if f"fb_{key}" in totals:
            out[f"fwd_bwd_ratio_{key}"] = totals[f"fb_{key}"] / totals["fb_bf16"]
    out["targets"] = {"fwd": 1.15, "fwd_bwd_nvfp4_per_token_bf16_bwd": 1.10}
    emit(out)

"""Benchmark the Triton NVFP4 kernels against BF16 torch, the emulated torch reference and torchao (issue #6).

Every case prints one JSON line (``{"bench": ..., "case": ..., ...ratios}``) and appends it to ``--out``.
Timings: ``triton.testing.do_bench`` (CUDA events, L2 flushed between repetitions, median), CUDA-graph
replay (``do_bench_cudagraph``) for the decode cases, whose kernels are a few microseconds long.

    python scripts/bench_kernels.py --only copy,quantize,linear,decode,logprobs,weight_sync,model

Sections:
  copy         device copy bandwidth (8192x8192 bf16 and 1 GiB), the ceiling for the memory-bound kernels
  quantize     NVFP4 quantize of 8192x8192 bf16: fraction of copy bandwidth (bytes read + written)
  linear       W4A4 linear at Qwen3-4B shapes (4096 tokens): fwd and fwd+bwd vs BF16, emulated, torchao
  decode       packed-FP4 decode linear at batch 1/4/16 vs BF16 F.linear (scripts/bench_decode.py: the pair
               kernel against the first formulation, with its launch sweep)
  logprobs     log-probs + entropy, vocab 151,936, 8 x 4096 tokens: peak memory and time vs naive
  weight_sync  re-quantize all linears of a Qwen3-1.7B-shaped model: ms per billion params, bandwidth
  model        fwd+bwd of a random Qwen3-1.7B-shaped model, seq 4096: bf16 vs NVFP4 recipes
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from minite_kernels.options import options, set_env_option, set_options

RESULTS: list[dict] = []
OUT_PATH: str | None = None

QWEN3_4B = dict(hidden=2560, inter=9728, q=4096, kv=1024)
QWEN3_1P7B = dict(hidden=2048, inter=6144, q=2048, kv=1024, layers=28, heads=16, kv_heads=8, vocab=151936)


def layer_shapes(cfg: dict) -> list[tuple[str, int, int]]:
    """(name, N=out_features, K=in_features) of one transformer block's linears."""
    h, i, q, kv = cfg["hidden"], cfg["inter"], cfg["q"], cfg["kv"]
    return [
        ("q_proj", q, h),
        ("k_proj", kv, h),
        ("v_proj", kv, h),
        ("o_proj", h, q),
        ("gate_proj", i, h),
        ("up_proj", i, h),
        ("down_proj", h, i),
    ]


#: linears whose input another linear of the block already quantized (q/k/v, gate/up)
SHARES_INPUT = ("k_proj", "v_proj", "up_proj")


def emit(rec: dict) -> None:
    rec = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.items()}
    RESULTS.append(rec)
    line = json.dumps(rec)
    print(line, flush=True)
    if OUT_PATH:
        with open(OUT_PATH, "a") as fh:
            fh.write(line + "\n")


def bench(fn, *, rep: int = 200, warmup: int = 25, graph: bool = False) -> float:
    """Median milliseconds of ``fn``."""
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def section(name):
    def deco(fn):
        def run(args):
            t0 = time.time()
            try:
                fn(args)
            except Exception as e:  # a failing section must not hide the others
                emit({"bench": name, "case": "error", "error": f"{type(e).__name__}: {e}"[:800]})
                traceback.print_exc()
            finally:
                free()
                print(f"# section {name} took {time.time() - t0:.1f}s", flush=True)

        run.__name__ = name
        return run

    return deco


# ----------------------------------------------------------------------------------------------------
@section("copy")
def bench_copy(args):
    for m, k in ((8192, 8192), (32768, 16384)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ms = bench(lambda: y.copy_(x))
        nbytes = 2 * x.numel() * 2
        emit({"bench": "copy", "case": f"{m}x{k}_bf16", "ms": ms, "GBps": nbytes / ms / 1e6})
    args.copy_gbps = RESULTS[-2]["GBps"]  # the 8192x8192 one: same size as the quantize benchmark


def _copy_gbps(args) -> float:
    if getattr(args, "copy_gbps", None) is None:
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        args.copy_gbps = 4 * x.numel() / bench(lambda: y.copy_(x)) / 1e6
    return args.copy_gbps


@section("quantize")
def bench_quantize(args):
    from minite_kernels.backends.triton import quantize_nvfp4_triton
    from minite_kernels.formats import quantize_nvfp4

    copy_gbps = _copy_gbps(args)
    m = k = 8192
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * torch.exp(
        torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    )
    n = m * k
    packed_bytes = n // 2 + n // 16
    cases = [
        ("per_token_1x16", dict(per_token=True), 2 * n + packed_bytes + 4 * m, 2 * n + packed_bytes + 4 * m),
        (
            "per_token_1x16+qs",
            dict(per_token=True, write_qs=True),
            2 * n + packed_bytes + 2 * n,
            2 * n + packed_bytes + 2 * n,
        ),
        ("per_token_qs_only", dict(per_token=True, write_packed=False, write_qs=True), 4 * n, 4 * n),
        (
            "per_token_1x16+deq",  # what the training forward writes (packed + dequantized bf16 operand)
            dict(per_token=True, write_deq=True),
            2 * n + packed_bytes + 2 * n,
            2 * n + packed_bytes + 2 * n,
        ),
        (
            "per_tensor_16x16+deq",  # weight sync with the GEMM operand refreshed
            dict(per_token=False, tile16=True, write_deq=True),
            4 * n + packed_bytes,
            6 * n + packed_bytes,
        ),
        ("per_tensor_1x16", dict(per_token=False), 2 * n + packed_bytes, 4 * n + packed_bytes),
        ("per_tensor_16x16", dict(per_token=False, tile16=True), 2 * n + packed_bytes, 4 * n + packed_bytes),
    ]
    ref_ms = None
    for name, kw, useful, traffic in cases:
        ms = bench(lambda: quantize_nvfp4_triton(x, **kw))
        rec = {
            "bench": "quantize",
            "case": name,
            "shape": [m, k],
            "ms": ms,
            "useful_GBps": useful / ms / 1e6,
            "frac_copy_bw_useful": useful / ms / 1e6 / copy_gbps,
            "traffic_GBps": traffic / ms / 1e6,
            "frac_copy_bw_traffic": traffic / ms / 1e6 / copy_gbps,
            "copy_GBps": copy_gbps,
            "target_frac": 0.8,
        }
        if name in ("per_token_1x16", "per_tensor_1x16", "per_tensor_16x16"):
            scaling = "per_token" if "token" in name else "per_tensor"
            tile = (16, 16) if "16x16" in name else (1, 16)
            ref_ms = bench(lambda: quantize_nvfp4(x, scaling=scaling, tile=tile), rep=50, warmup=5)
            rec.update(emulated_torch_ms=ref_ms, speedup_vs_emulated=ref_ms / ms)
        emit(rec)
    # byte-exactness spot check on this very tensor (the tests do it exhaustively)
    d, s, a, *_ = quantize_nvfp4_triton(x, per_token=True)
    r = quantize_nvfp4(x, scaling="per_token")
    emit(
        {
            "bench": "quantize",
            "case": "exact_check_8192",
            "data_equal": bool(torch.equal(d, r.data)),
            "scales_equal": bool(torch.equal(s.view(torch.uint8), r.scales.view(torch.uint8))),
            "amax_equal": bool(torch.equal(a, r.amax)),
        }
    )


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
            tb._last = None  # no reuse across repetitions (the q/k/v input cache would hit)
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
            tb._last = None
            qw = tb.quantize(w, spec.b)
            t = bench(fwd)
            rec[f"ours_{mode}_ms"] = t
            rec[f"ratio_{mode}"] = t / t_bf16
            add(mode, t)
            tb._last = None
            rec[f"quantize_x_{mode}_ms"] = bench(lambda: (setattr(tb, "_last", None), tb.quantize(x, spec.a)))
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
                g_q = bench(lambda: (setattr(tb, "_last", None), tb.quantize(x, spec.a)), graph=True)
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
        tb._last = None
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
            tb._last = None
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
                if hasattr(b, "_last"):
                    b._last = None  # no reuse of the quantized input across repetitions
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


@section("decode")
def bench_decode(args):
    from decode_planes import decode_linear, quantize_planes  # the first formulation, the baseline

    from minite_kernels.backends.triton import decode_linear_pairs, quantize_for_decode, quantize_nvfp4_triton

    totals: dict[tuple, float] = {}
    for name, n, k in layer_shapes(QWEN3_4B):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wd, ws, wa, *_ = quantize_nvfp4_triton(w, per_token=False, tile16=True)
        for b in args.decode_batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)

            def ours():  # what the backend runs (MINITE_TRITON_DECODE=auto): one quantize launch + the pair kernel
                o, xp_ = quantize_for_decode(x)
                return decode_linear_pairs(xp_, o.scales, o.amax, wd, ws, wa)

            _d, _s, xa, _nf, xqs, _dq = quantize_nvfp4_triton(
                x, per_token=True, write_packed=False, write_qs=True
            )
            xp = quantize_planes(x)[1]  # fp16, plane-major
            ours()  # compile + allocate the split-K workspace outside graph capture
            decode_linear(xp, xa, wd, ws, wa, x_perm=True)
            decode_linear(xp, xa, wd, ws, wa, x_perm=True, one_dot=True)
            torch.cuda.synchronize()
            t_b = bench(lambda: F.linear(x, w), graph=True)
            t_o = bench(ours, graph=True)
            t_g = bench(lambda: decode_linear(xqs, xa, wd, ws, wa), graph=True)
            t_xp = bench(lambda: decode_linear(xp, xa, wd, ws, wa, x_perm=True), graph=True)
            t_od = bench(lambda: decode_linear(xp, xa, wd, ws, wa, x_perm=True, one_dot=True), graph=True)
            t_q = bench(lambda: quantize_planes(x), graph=True)
            sweep = {}
            if args.decode_sweep:
                if b <= 4:
                    cfgs = ((8, 64, 4), (16, 64, 4), (16, 32, 4), (32, 32, 4), (16, 128, 8), (32, 64, 8))
                else:
                    cfgs = ((64, 16, 4), (64, 32, 4), (128, 32, 4), (128, 16, 8))
                for bn_, bkw_, nw_ in cfgs:
                    for perm in (0, 1, 2) if b > 4 else (0, 1):
                        key = f"{bn_}x{bkw_}w{nw_}" + ("", "p", "o")[perm]
                        xin, xa_ = (xp, xa) if perm else (xqs, xa)
                        kw_ = dict(
                            block_n=bn_, block_kw=bkw_, num_warps=nw_, x_perm=perm > 0, one_dot=perm == 2
                        )
                        try:
                            decode_linear(xin, xa_, wd, ws, wa, **kw_)
                            sweep[key] = 1e3 * bench(
                                lambda: decode_linear(xin, xa_, wd, ws, wa, **kw_), graph=True, rep=40
                            )
                        except Exception as e:  # a config that does not compile is reported, not fatal
                            sweep[key] = f"{type(e).__name__}"
            wbytes_bf16 = 2 * n * k
            wbytes_fp4 = n * k // 2 + n * k // 16
            emit(
                {
                    "bench": "decode",
                    "case": f"{name}_{n}x{k}_b{b}",
                    "batch": b,
                    "N": n,
                    "K": k,
                    "bf16_us": 1e3 * t_b,
                    "ours_us": 1e3 * t_o,
                    "act_quant_us": 1e3 * t_q,
                    "gemv_us": 1e3 * t_g,
                    "gemv_xperm_us": 1e3 * t_xp,
                    "gemv_xperm_onedot_us": 1e3 * t_od,
                    "speedup": t_b / t_o,
                    "speedup_gemv_only": t_b / t_xp,
                    "bf16_weight_GBps": wbytes_bf16 / t_b / 1e6,
                    "ours_weight_GBps": wbytes_fp4 / t_xp / 1e6,
                    "gemv_sweep_us": sweep,
                    "target_speedup": 2.0,
                }
            )
            for key, t in (
                ("bf16", t_b),
                ("ours", t_o),
                ("gemv", t_g),
                ("xperm", t_xp),
                ("onedot", t_od),
            ):
                totals[(b, key)] = totals.get((b, key), 0.0) + t
        w = wd = ws = None
    for b in args.decode_batches:
        emit(
            {
                "bench": "decode_layer_total",
                "case": f"qwen3_4b_block_b{b}",
                "batch": b,
                "bf16_us": 1e3 * totals[(b, "bf16")],
                "ours_us": 1e3 * totals[(b, "ours")],
                "gemv_us": 1e3 * totals[(b, "gemv")],
                "gemv_xperm_us": 1e3 * totals[(b, "xperm")],
                "gemv_xperm_onedot_us": 1e3 * totals[(b, "onedot")],
                "speedup": totals[(b, "bf16")] / totals[(b, "ours")],
                "speedup_gemv_only": totals[(b, "bf16")] / totals[(b, "xperm")],
                "target_speedup": 2.0,
            }
        )


@section("logprobs")
def bench_logprobs(args):
    from minite_kernels.backends.triton import logprobs_and_entropy, logprobs_and_entropy_torch

    t_tok, h, v = args.lp_tokens, 2560, 151936
    g = torch.Generator(device="cuda").manual_seed(0)
    hid = torch.randn(t_tok, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    ids = torch.randint(0, v, (t_tok,), device="cuda", generator=g)

    def naive(hh, ww):
        logits = (hh @ ww.t()).float()
        logp_all = torch.log_softmax(logits, dim=-1)
        lp = logp_all.gather(-1, ids[:, None]).squeeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        return lp, ent

    def measure(fn, rep=5):
        free()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        free()
        ms = bench(fn, rep=rep * 100, warmup=100)
        return peak, ms

    fns = {
        "naive": lambda: naive(hid, w),
        "chunked_torch": lambda: logprobs_and_entropy_torch(hid, w, ids, chunk=4096),
        "fused_triton": lambda: logprobs_and_entropy(hid, w, ids, chunk=4096),
    }
    with torch.no_grad():
        res = {k: measure(f) for k, f in fns.items()}
        lp_n, ent_n = naive(hid, w)
        lp_f, ent_f = logprobs_and_entropy(hid, w, ids, chunk=4096)
        err = {
            "max_abs_logp_diff": (lp_n - lp_f).abs().max().item(),
            "max_abs_entropy_diff": (ent_n - ent_f).abs().max().item(),
        }
        del lp_n, ent_n, lp_f, ent_f
    for k, (peak, ms) in res.items():
        emit(
            {
                "bench": "logprobs_fwd",
                "case": k,
                "tokens": t_tok,
                "vocab": v,
                "hidden": h,
                "peak_extra_GB": peak / 1e9,
                "ms": ms,
                "mem_ratio_vs_naive": peak / res["naive"][0],
                "time_ratio_vs_naive": ms / res["naive"][1],
                "target_mem_ratio": 0.25,
                **(err if k == "fused_triton" else {}),
            }
        )
    # forward + backward (grad w.r.t. hidden and lm_head)
    hid_g = hid.clone().requires_grad_()
    w_g = w.clone().requires_grad_()
    glp = torch.randn(t_tok, device="cuda")

    def fb(fn):
        def run():
            lp, ent = fn()
            ((lp * glp).sum() + 0.01 * ent.sum()).backward()
            hid_g.grad = None
            w_g.grad = None

        return run

    fb_fns = {
        "naive": fb(lambda: naive(hid_g, w_g)),
        "fused_triton": fb(lambda: logprobs_and_entropy(hid_g, w_g, ids, chunk=4096)),
    }
    res = {}
    for k, f in fb_fns.items():
        try:
            res[k] = measure(f, rep=3)
        except torch.OutOfMemoryError as e:
            emit({"bench": "logprobs_fwd_bwd", "case": k, "error": f"OOM: {str(e)[:200]}"})
    for k, (peak, ms) in res.items():
        rec = {
            "bench": "logprobs_fwd_bwd",
            "case": k,
            "tokens": t_tok,
            "vocab": v,
            "peak_extra_GB": peak / 1e9,
            "ms": ms,
        }
        if "naive" in res:
            rec.update(mem_ratio_vs_naive=peak / res["naive"][0], time_ratio_vs_naive=ms / res["naive"][1])
        emit(rec)


def _qwen3_1p7b_weights(device="cuda"):
    ws = []
    for _ in range(QWEN3_1P7B["layers"]):
        for _name, n, k in layer_shapes(QWEN3_1P7B):
            ws.append(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
    return ws


@section("weight_sync")
def bench_weight_sync(args):
    from minite_kernels.backends.triton import WeightRequantizer
    from minite_kernels.formats import quantize_nvfp4

    copy_gbps = _copy_gbps(args)
    ws = _qwen3_1p7b_weights()
    nparam = sum(w.numel() for w in ws)
    for graph in (True, False):
        for write_qs in (False, True):
            sync = WeightRequantizer(ws, cuda_graph=graph, write_qs=write_qs)
            sync.sync()
            ms = bench(sync.sync, rep=200)
            useful = nparam * (2 + 0.5625 + (2 if write_qs else 0))
            traffic = nparam * (4 + 0.5625 + (2 if write_qs else 0))
            emit(
                {
                    "bench": "weight_sync",
                    "case": f"qwen3_1.7b_linears_graph{int(graph)}_qs{int(write_qs)}",
                    "params_B": nparam / 1e9,
                    "num_weights": len(ws),
                    "ms": ms,
                    "ms_per_B_params": ms / (nparam / 1e9),
                    "frac_copy_bw_useful": useful / ms / 1e6 / copy_gbps,
                    "frac_copy_bw_traffic": traffic / ms / 1e6 / copy_gbps,
                    "copy_GBps": copy_gbps,
                    "target_frac": 0.8,
                }
            )
            del sync
            free()
    # the emulated torch reference, one pass over all weights
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for w in ws:
        quantize_nvfp4(w, tile=(16, 16))
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0)
    emit(
        {
            "bench": "weight_sync",
            "case": "emulated_torch_reference",
            "params_B": nparam / 1e9,
            "ms": ms,
            "ms_per_B_params": ms / (nparam / 1e9),
        }
    )


@section("optim")
def bench_optim(args):
    """AdamW on the 196 Qwen3-1.7B linears (bf16 params, grads, states), and weight sync fed by its amaxes.

    Optimizer: torch's fused AdamW, the same plus a separate amax read per weight (what a two-pass sync costs
    on top), and minite_kernels.optim.AdamW (amax recorded in the update pass). Weight sync: the requantizer
    with its own amax pass vs ``amax_from=`` the optimizer (one read per weight)."""
    from minite_kernels.backends.triton import WeightRequantizer
    from minite_kernels.optim import AdamW

    copy_gbps = _copy_gbps(args)
    params = [torch.nn.Parameter(w) for w in _qwen3_1p7b_weights()]
    nparam = sum(p.numel() for p in params)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    hp = dict(lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ours = AdamW(params, **hp)
    ours.step()
    torch_fused = torch.optim.AdamW(params, **hp, fused=True)
    torch_fused.step()

    def torch_then_amax():
        torch_fused.step()
        return [p.detach().abs().amax() for p in params]

    times = {
        "torch_fused": bench(torch_fused.step, rep=100),
        "torch_fused_then_amax": bench(torch_then_amax, rep=100),
        "ours_with_amax": bench(ours.step, rep=100),
    }
    _profile_step(torch_fused.step, "optim_torch_fused")
    _profile_step(ours.step, "optim_ours_with_amax")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        ours.step()  # host time: returns once the launch is queued
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 10
    host = []
    for _ in range(10):
        t0 = time.perf_counter()
        ours.step()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    emit(
        {"bench": "optim_adamw", "case": "ours_host", "host_ms": 1e3 * sorted(host)[5], "wall_ms": 1e3 * wall}
    )
    if getattr(args, "optim_sweep", False):
        from minite_kernels.backends.triton import adamw as K

        default = (K.BLOCK, K.WARPS, K.ITERS)
        for block, warps in ((512, 4), (1024, 8), (2048, 16), (512, 8), (1024, 16), (4096, 8)):
            for iters in (1, 4, 16):
                K.BLOCK, K.WARPS, K.ITERS = block, warps, iters
                ours._pmaps.clear()
                ms = bench(ours.step, rep=60)
                emit(
                    {
                        "bench": "optim_sweep",
                        "block": block,
                        "warps": warps,
                        "iters": iters,
                        "ms": ms,
                        "frac_copy_bw": nparam * 14 / ms / 1e6 / copy_gbps,
                    }
                )
        K.BLOCK, K.WARPS, K.ITERS = default
        ours._pmaps.clear()
        from minite_kernels.backends.triton import quantize as Q

        saved = dict(Q.BF16_CONFIG)
        for nb, warps in ((2, 1), (4, 1), (8, 1), (4, 2), (8, 2), (16, 2), (16, 4), (32, 4), (32, 8)):
            Q.BF16_CONFIG.update(tile16_nb=nb, tile16_warps=warps)
            rq = WeightRequantizer(params, amax_from=ours)
            rq.sync()
            ms = bench(rq.sync, rep=100)
            emit(
                {
                    "bench": "sync_quant_sweep",
                    "tile16_nb": nb,
                    "warps": warps,
                    "amax_given": rq.amax_given,
                    "ms": ms,
                    "frac_copy_bw": nparam * 2.5625 / ms / 1e6 / copy_gbps,
                }
            )
            del rq
        Q.BF16_CONFIG.clear()
        Q.BF16_CONFIG.update(saved)
    step_bytes = nparam * 2 * 7  # read p, g, m, v; write p, m, v (bf16)
    for case, ms in times.items():
        emit(
            {
                "bench": "optim_adamw",
                "case": case,
                "params_B": nparam / 1e9,
                "ms": ms,
                "ratio_vs_torch_fused": ms / times["torch_fused"],
                "frac_copy_bw": step_bytes / ms / 1e6 / copy_gbps,
            }
        )
    ours.step()  # the weights now hold what ours wrote, with current amaxes
    own = WeightRequantizer(params)
    fed = WeightRequantizer(params, amax_from=ours)
    a, b = own.sync(), fed.sync()
    same = all(torch.equal(x.data, y.data) and torch.equal(x.amax, y.amax) for x, y in zip(a, b))
    for name, rq, traffic in (("own_amax_pass", own, 4.5625), ("amax_from_optimizer", fed, 2.5625)):
        ms = bench(rq.sync, rep=200)
        emit(
            {
                "bench": "weight_sync",
                "case": f"qwen3_1.7b_linears_{name}",
                "amax_given": rq.amax_given,
                "bytes_equal_to_own_amax_pass": same,
                "params_B": nparam / 1e9,
                "ms": ms,
                "ms_per_B_params": ms / (nparam / 1e9),
                "frac_copy_bw_useful": nparam * 2.5625 / ms / 1e6 / copy_gbps,
                "frac_copy_bw_traffic": nparam * traffic / ms / 1e6 / copy_gbps,
                "copy_GBps": copy_gbps,
                "target_frac": 0.8,
            }
        )


@section("model")
def bench_model(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from minite_kernels import quantize_model

    c = QWEN3_1P7B
    cfg = Qwen3Config(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        intermediate_size=c["inter"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        head_dim=128,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    base.train()
    ids = torch.randint(0, c["vocab"], (1, args.seq), device="cuda")

    def step(model):
        def run():
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            for p in model.parameters():
                p.grad = None

        return run

    if args.host_profile:
        _host_profile(base, step)
        return
    if args.model_rounds > 1:
        _model_interleaved(base, step, args)
        if args.profile:  # GPU kernel time vs wall time of one step each (host- or GPU-bound?)
            _profile_step(step(base), "model_bf16")
            m = copy.deepcopy(base)
            quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="triton")
            _profile_step(step(m), "model_nvfp4_per_token_bf16_bwd")
        return
    res = {}
    res["bf16"] = bench(step(base), rep=2000, warmup=500)
    if args.profile:
        _profile_step(step(base), "model_bf16")
    emit({"bench": "model", "case": "bf16", "seq": args.seq, "ms": res["bf16"]})
    for recipe in ("nvfp4_per_token_bf16_bwd", "nvfp4_per_token"):
        m = copy.deepcopy(base)
        rep = quantize_model(m, recipe, backend="triton")
        ms = bench(step(m), rep=2000, warmup=500)
        res[recipe] = ms
        if args.profile and recipe == "nvfp4_per_token_bf16_bwd":
            _profile_step(step(m), f"model_{recipe}")
        emit(
            {
                "bench": "model",
                "case": recipe,
                "seq": args.seq,
                "ms": ms,
                "ratio_vs_bf16": ms / res["bf16"],
                "quantized_linears": getattr(rep, "num_quantized", None),
                "target_ratio": 1.10 if recipe == "nvfp4_per_token_bf16_bwd" else None,
            }
        )
        del m
        free()
    if args.model_emulated:
        m = copy.deepcopy(base)
        quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="emulated")
        ms = bench(step(m), rep=3000, warmup=1000)
        emit(
            {
                "bench": "model",
                "case": "nvfp4_per_token_bf16_bwd_emulated",
                "seq": args.seq,
                "ms": ms,
                "ratio_vs_bf16": ms / res["bf16"],
            }
        )


def _model_interleaved(base, step, args) -> None:
    """bf16 and ``nvfp4_per_token_bf16_bwd`` under each value of one environment switch (``--model-variants``,
    default ``MINITE_SAVE_ACTIVATIONS=dequantized,packed``), timed in alternation for ``--model-rounds`` rounds
    in one process (bf16 first, the NVFP4 variants in an order rotated every round): a host-bound step varies
    between runs (and lent machines), so only same-process, interleaved medians are compared. Also one step's
    peak memory per case. With a tiny ``--seq`` the GPU work is negligible and the times are host time."""
    import statistics

    from minite_kernels import quantize_model

    m = copy.deepcopy(base)
    quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="triton")
    var, _, vals = args.model_variants.partition("=")
    variants = [v for v in vals.split(",") if v]
    default = options()

    def label(v: str) -> str:
        if var == "MINITE_SAVE_ACTIVATIONS":  # the names earlier results used
            return f"nvfp4_per_token_bf16_bwd_save_{v}"
        return f"nvfp4_per_token_bf16_bwd[{var}={v}]"

    times: dict[str, list[float]] = {"bf16": []}
    for r in range(args.model_rounds):
        times["bf16"].append(bench(step(base), rep=600, warmup=100))
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            set_env_option(var, v)
            times.setdefault(label(v), []).append(bench(step(m), rep=600, warmup=100))
    peak_gb = {}
    for case, model, v in [("bf16", base, variants[0])] + [(label(v), m, v) for v in variants]:
        set_env_option(var, v)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(model)()
        torch.cuda.synchronize()
        peak_gb[case] = torch.cuda.max_memory_allocated() / 1e9
    set_options(**default.to_dict())
    ref = statistics.median(times["bf16"])
    for case, ts in times.items():
        med = statistics.median(ts)
        emit(
            {
                "bench": "model_interleaved",
                "case": case,
                "seq": args.seq,
                "rounds": args.model_rounds,
                "ms_median": med,
                "ms_rounds": [round(t, 2) for t in ts],
                "ratio_vs_bf16": med / ref,
                "peak_GB": peak_gb[case],
                "target_ratio": None if case == "bf16" else 1.10,
            }
        )
    del m
    free()


def _host_profile(base, step) -> None:
    """Where the host time of a step goes (run with a tiny ``--seq`` so the GPU never waits on it): per case,
    Python calls per step and the cProfile top functions, then the torch profiler's per-op host time, on
    stderr; one JSON line per case with the host ms per step and the Python call count."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from minite_kernels import quantize_model

    m = copy.deepcopy(base)
    quantize_model(m, "nvfp4_per_token_bf16_bwd", backend="triton")
    for name, model in (("bf16", base), ("nvfp4_per_token_bf16_bwd", m)):
        run = step(model)
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            run()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 10 * 1e3
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            run()
        prof.disable()
        torch.cuda.synchronize()
        st = pstats.Stats(prof, stream=sys.stderr)
        print(f"--- {name}: cProfile of 5 steps", file=sys.stderr)
        st.sort_stats("tottime").print_stats(30)
        with profile(activities=[ProfilerActivity.CPU]) as tp:
            run()
            torch.cuda.synchronize()
        print(f"--- {name}: torch profiler, one step", file=sys.stderr)
        print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), file=sys.stderr)
        emit(
            {
                "bench": "host_profile",
                "case": name,
                "ms_per_step": ms,
                "python_calls_per_step": st.total_calls / 5,
            }
        )


def _profile_step(fn, name: str) -> None:
    """One profiled step: wall time vs summed GPU kernel time (host-bound when wall >> GPU), top kernels.
    (Before 2026-11-29T14:30 the sum also counted the CPU ops' device-time columns: busy fractions above 1.)"""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    # kernels only (device-side events): the CPU ops' device-time columns would count each kernel again
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.self_device_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:12]
    emit(
        {
            "bench": "profile",
            "case": name,
            "wall_ms": 1e3 * wall,
            "gpu_kernel_ms": gpu_us / 1e3,
            "gpu_busy_frac": gpu_us / 1e3 / (1e3 * wall),
            "top_gpu": [
                [e.key[:60], round(getattr(e, "self_device_time_total", 0) / 1e3, 3), e.count] for e in top
            ],
        }
    )


SECTIONS = {
    f.__name__: f
    for f in (
        bench_copy,
        bench_quantize,
        bench_linear,
        bench_decode,
        bench_logprobs,
        bench_weight_sync,
        bench_optim,
        bench_model,
    )
}


def main(argv=None) -> int:
    global OUT_PATH
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of: {', '.join(SECTIONS)}")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--lp-tokens", type=int, default=8 * 4096)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--model-emulated", action="store_true")
    p.add_argument(
        "--model-rounds",
        type=int,
        default=1,
        help="> 1: time bf16 / nvfp4 (each --model-variants value) in alternation this many rounds; medians",
    )
    p.add_argument(
        "--model-variants",
        default="MINITE_SAVE_ACTIVATIONS=dequantized,packed",
        help="VAR=V1,V2,...: the environment switch whose values the interleaved model bench compares",
    )
    p.add_argument("--decode-sweep", action="store_true", help="time several decode block configs")
    p.add_argument(
        "--decode-batches",
        type=lambda v: [int(b) for b in v.split(",")],
        default=[1, 4, 16],
        help="comma list of decode batch sizes (default 1,4,16: the issue's)",
    )
    p.add_argument("--optim-sweep", action="store_true", help="optim: sweep the AdamW kernel's launch sizes")
    p.add_argument("--profile", action="store_true", help="profile one model step (CPU- vs GPU-bound)")
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="model: where the host time of a step goes (use a tiny --seq); cProfile and op tables on stderr",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "kernels", "error": "needs a CUDA GPU"}))
        return 2
    OUT_PATH = args.out
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}")
    import triton

    emit(
        {
            "bench": "env",
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    args.copy_gbps = None
    for name in names:
        SECTIONS[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host (Python) overhead of one quantized linear, forward + backward, isolated from GPU kernel time (issue #6).

On the H200 the Qwen3-1.7B model step with ``nvfp4_per_token_bf16_bwd`` was CPU-bound: kernels took +5% over
BF16 but the step 1.8x, the difference being the Python plumbing around each of the 196 linears (autograd
function, recipe dispatch, backend validation, weight-cache lookups, quantized-operand bookkeeping). This
script times exactly that plumbing on tiny tensors, where every kernel costs next to nothing:

  torch_linear        ``nn.Linear`` fwd+bwd: the floor (autograd engine + three tiny matmuls)
  autograd_function_floor
                      the same three matmuls in a minimal Python ``torch.autograd.Function``: the floor
                      for any Python-level quantized linear
  fake/<recipe>       ``minite_kernels.modules.Linear`` on a counting backend whose ``_quantize``/``_gemm``
                      do trivial work: the module + autograd + base-backend plumbing only
  triton/<recipe>     the real ``TritonBackend`` with its kernel launchers replaced by stubs that allocate the
                      outputs (runs on CPU without a GPU): the Triton backend's own Python on top
  emulated/<recipe>   the real emulated backend (pure PyTorch reference) on the same tiny shapes
  tritonstub/<recipe> the real ``TritonBackend`` with stubbed launchers on any device (on CUDA: triton minus
                      tritonstub is what the Triton launches themselves cost the host)

It prints, per case, microseconds per linear fwd+bwd (best of ``--repeats`` timings of ``--iters`` steps) on
stderr, and one JSON line on stdout::

  {"bench": "host_overhead", "device": "cpu", "shape": [16, 64, 64], "us_per_linear": {...},
   "overhead_us_vs_torch_linear": {...}, "ratio_vs_torch_linear": {...},
   "aten_ops_per_linear": {case: {"all", "top_level"}}, "python_calls_per_linear": {...},
   "calls_per_linear": {fake case: {"quantize", "gemm"}}}

ATen-op and Python-call counts do not depend on the machine's load, unlike the times (a shared CPU adds tens of
percent of noise). To compare with an older version of the package, run the same script with
``PYTHONPATH=<checkout of that version>`` (the script imports whichever ``minite_kernels`` comes first and
names it in the JSON).

``--device cuda`` runs the same cases on a GPU (the triton case then uses the real kernels) and additionally
counts host-device synchronizations per linear with ``torch.cuda.set_sync_debug_mode``; ``--profile CASE``
prints the cProfile top functions of one case.

    python scripts/bench_host_overhead.py                     # CPU, all cases
    python scripts/bench_host_overhead.py --profile triton/nvfp4_per_token_bf16_bwd
    python scripts/bench_host_overhead.py --model            # whole steps of a 28-layer tiny Qwen3, lane on/off
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import sys
import time
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from minite_kernels.options import set_env_option

RECIPES = ("nvfp4_per_token_bf16_bwd", "nvfp4_per_token")


@dataclass
class FakeQuantized:
    """Stands in for a quantized operand: the input itself, plus the tensors a real one carries."""

    data: torch.Tensor
    scales: torch.Tensor
    amax: torch.Tensor
    shape: torch.Size
    nonfinite: torch.Tensor | None = None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.data.to(dtype)


def make_fake_backend(device: torch.device):
    from minite_kernels.backends.base import Backend

    class CountingBackend(Backend):
        """Real ``Backend`` plumbing; ``_quantize``/``_gemm`` do trivial work and count their calls."""

        name = "counting"

        def __init__(self, device=None) -> None:
            super().__init__(device)
            self.quantize_calls = 0
            self.gemm_calls = 0
            self._s = torch.zeros(1, device=device)

        @classmethod
        def availability(cls, device=None):
            return True, "counting fake backend (benchmark only)"

        def _quantize(self, x2d, spec, *, generator=None):
            self.quantize_calls += 1
            return FakeQuantized(x2d, self._s, self._s, x2d.shape, self._s)

        def _gemm(self, qa, qb, a_spec, b_spec, *, out_dtype):
            self.gemm_calls += 1
            a = qa if isinstance(qa, torch.Tensor) else qa.data
            b = qb if isinstance(qb, torch.Tensor) else qb.data
            return torch.mm(a, b.to(a.dtype).t()).to(out_dtype)

    return CountingBackend(device)


@contextlib.contextmanager
def stub_triton_kernels():
    """Replace the Triton launchers used by ``TritonBackend`` with output allocations (CPU-safe)."""
    import minite_kernels.backends.triton.backend as tb
    from minite_kernels.backends.triton.quantize import QuantOut

    def quantize_stub(
        x,
        *,
        per_token,
        tile16=False,
        rbits=None,
        write_packed=True,
        write_qs=False,
        write_deq=False,
        out=None,
        scratch=None,
    ):
        m, k = x.shape
        dev = x.device
        nrow = m if per_token else 1
        return QuantOut(
            torch.empty((m, k // 2), dtype=torch.uint8, device=dev),
            torch.empty((m, k // 16), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn),
            torch.ones((nrow,), dtype=torch.float32, device=dev),
            torch.zeros((nrow,), dtype=torch.bool, device=dev),
            torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_qs else None,
            torch.empty((m, k), dtype=torch.bfloat16, device=dev) if write_deq else None,
        )

    def dequantize_stub(data, scales, amax, *, per_token, dtype=torch.float32):
        return torch.empty((data.shape[0], data.shape[1] * 2), dtype=dtype, device=data.device)

    def mm_stub(a, b, sa, sb, *, out_dtype, impl=None):
        return torch.mm(a, b.t()).to(out_dtype)

    names = (
        "quantize_nvfp4_triton",
        "quantize_token_deq_bf16",
        "dequantize_nvfp4_triton",
        "scaled_mm_nt",
        "kernel_device_ok",
    )
    saved = {n: getattr(tb, n) for n in names}
    tb.quantize_nvfp4_triton = quantize_stub
    tb.quantize_token_deq_bf16 = lambda x: quantize_stub(x, per_token=True, write_deq=True)
    tb.dequantize_nvfp4_triton = dequantize_stub
    tb.scaled_mm_nt = mm_stub
    tb.kernel_device_ok = lambda x: True  # the backend's lane check reads it from here too
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(tb, n, f)


class _MinimalLinearFunction(torch.autograd.Function):
    """The least a Python autograd function can do for a linear: one GEMM forward, two backward."""

    @staticmethod
    def forward(ctx, x2d, weight):
        ctx.save_for_backward(x2d, weight)
        return torch.mm(x2d, weight.t())

    @staticmethod
    def backward(ctx, dy):
        x2d, weight = ctx.saved_tensors
        return torch.mm(dy, weight), torch.mm(dy.t(), x2d)


class MinimalFunctionLinear(nn.Linear):
    def forward(self, x):
        return _MinimalLinearFunction.apply(x.reshape(-1, x.shape[-1]), self.weight).reshape(
            *x.shape[:-1], self.out_features
        )


def build_case(case: str, device: torch.device, k: int, n: int, dtype: torch.dtype):
    """(module, backend-or-None, context manager) for one case."""
    from minite_kernels.modules import Linear

    torch.manual_seed(0)
    if case == "torch_linear":
        return nn.Linear(k, n, bias=False, device=device, dtype=dtype), None, contextlib.nullcontext()
    if case == "autograd_function_floor":
        return (
            MinimalFunctionLinear(k, n, bias=False, device=device, dtype=dtype),
            None,
            contextlib.nullcontext(),
        )
    kind, recipe = case.split("/")
    ctx = contextlib.nullcontext()
    if kind == "fake":
        backend = make_fake_backend(device)
    elif kind in ("triton", "tritonstub"):
        from minite_kernels.backends.triton import TritonBackend

        backend = TritonBackend(device)
        if device.type != "cuda" or kind == "tritonstub":
            ctx = stub_triton_kernels()
    elif kind == "emulated":
        from minite_kernels.backends.emulated import EmulatedBackend

        backend = EmulatedBackend(device)
    else:
        raise ValueError(
            f"unknown case {case!r}; kinds: torch_linear, autograd_function_floor, fake/, triton/, tritonstub/, "
            "emulated/"
        )
    layer = Linear(k, n, bias=False, device=device, dtype=dtype, qlinear_params=recipe, backend=backend)
    return layer, backend, ctx


def step_fn(layer: nn.Module, xs: list[torch.Tensor]):
    """One fwd+bwd; alternates between input tensors so that no backend can reuse the previous input's
    quantization (in a model every linear sees a new activation, except projections sharing one)."""
    i = [0]

    def step():
        x = xs[i[0] % len(xs)]
        i[0] += 1
        y = layer(x)
        y.backward(torch.ones_like(y))
        layer.weight.grad = None
        x.grad = None

    return step


def phase_fns(layer: nn.Module, xs: list[torch.Tensor]) -> dict:
    """The forward alone, without and with autograd recording (the rest of a step is the backward)."""
    i = [0]

    def nxt() -> torch.Tensor:
        i[0] += 1
        return xs[i[0] % len(xs)]

    def fwd_nograd():
        with torch.no_grad():
            layer(nxt())

    def fwd_grad():
        layer(nxt())

    return {"fwd_nograd": fwd_nograd, "fwd_grad": fwd_grad}


def time_case(step, iters: int, repeats: int, sync) -> float:
    for _ in range(max(10, iters // 4)):
        step()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return min(samples)  # the least-disturbed run: this measures CPU work, and shared machines add noise


def count_aten_ops(step) -> tuple[int, int]:
    """(all, top-level) ATen operator calls in one step, from the autograd profiler (CPU-side dispatches)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    return len(events), len(top)


def count_python_calls(step, iters: int = 20) -> float:
    """Python function calls per step (cProfile): a machine-independent measure of interpreter work."""
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        step()
    prof.disable()
    return pstats.Stats(prof).total_calls / iters


def count_syncs(step, device: torch.device) -> int | None:
    """Host-device synchronizations in one step (CUDA only: the sync-debug warnings are counted)."""
    if device.type != "cuda":
        return None
    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in rec)


def op_table(step, device: torch.device, iters: int = 50) -> dict:
    """Per-op host time of ``iters`` steps (torch profiler, printed on stderr) and, on CUDA, the GPU's busy
    time per step: a step whose GPU time is below its host time is host-bound."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        wall = (time.perf_counter() - t0) / iters * 1e6
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
    rec = {"profiled_wall_us_per_step": round(wall, 1)}
    if device.type == "cuda":
        gpu = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA)
        rec["gpu_busy_us_per_step"] = round(gpu / iters, 1)
    return rec


def bench_model(device: torch.device, rounds: int, env_variants: str, sync) -> None:
    """Host time of whole training steps: a Qwen3 with the 1.7B model's 28 layers and 7 linears per layer but
    tiny widths (hidden 64), seq 32, so the kernels cost next to nothing and the step time is the host's.
    bf16 and ``nvfp4_per_token_bf16_bwd`` (Triton backend; its launchers stubbed off CUDA) under each value of
    ``env_variants`` (default ``MINITE_LINEAR_LANE=auto,off``), interleaved for ``rounds`` rounds; medians and
    Python calls per step (machine-independent)."""
    import copy
    import statistics

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from minite_kernels import quantize_model
    from minite_kernels.backends.triton import TritonBackend

    cfg = Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=28,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    base = Qwen3ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)
    base.train()
    ids = torch.randint(0, 256, (1, 32), device=device)
    m = copy.deepcopy(base)
    quantize_model(m, "nvfp4_per_token_bf16_bwd", backend=TritonBackend(device))
    var, _, vals = (env_variants or "MINITE_LINEAR_LANE=auto,off").partition("=")
    values = [v for v in vals.split(",") if v]

    def step(model):
        model(input_ids=ids, labels=ids).loss.backward()
        for q in model.parameters():
            q.grad = None

    def timed(model, n=8) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            step(model)
        sync()
        return (time.perf_counter() - t0) / n * 1e3

    def calls(model) -> float:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            step(model)
        prof.disable()
        return pstats.Stats(prof).total_calls / 3

    ctx = stub_triton_kernels() if device.type != "cuda" else contextlib.nullcontext()
    ms: dict[str, list[float]] = {"bf16": []}
    pycalls = {}
    with ctx:
        for model in (base, m):
            for _ in range(3):
                step(model)
        for r in range(rounds):
            ms["bf16"].append(timed(base))
            for v in values[r % len(values) :] + values[: r % len(values)]:
                set_env_option(var, v)
                ms.setdefault(f"nvfp4_per_token_bf16_bwd[{var}={v}]", []).append(timed(m))
        pycalls["bf16"] = calls(base)
        for v in values:
            set_env_option(var, v)
            pycalls[f"nvfp4_per_token_bf16_bwd[{var}={v}]"] = calls(m)
    set_env_option(var, None)
    med = {k: statistics.median(v) for k, v in ms.items()}
    rec = {
        "bench": "host_overhead_model",
        "device": str(device),
        "model": "qwen3, 28 layers x 7 linears, hidden 64, seq 32",
        "ms_per_step_median": {k: round(v, 1) for k, v in med.items()},
        "ms_rounds": {k: [round(x, 1) for x in v] for k, v in ms.items()},
        "overhead_ms_vs_bf16": {k: round(v - med["bf16"], 1) for k, v in med.items() if k != "bf16"},
        "python_calls_per_step": pycalls,
    }
    print(json.dumps(rec), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="", help="comma-separated subset (default: all)")
    p.add_argument("--profile", default="", help="print the cProfile top functions of this case")
    p.add_argument(
        "--op-table",
        default="",
        help="comma-separated cases: print the torch profiler's per-op host time and GPU busy time per step",
    )
    p.add_argument(
        "--env-variants",
        default="",
        help="NAME=V1,V2: run each triton case once per value of environment variable NAME "
        "(named 'case[NAME=V]'), all in this process",
    )
    p.add_argument(
        "--model",
        action="store_true",
        help="time whole training steps of a 28-layer tiny-width Qwen3 instead (see bench_model)",
    )
    p.add_argument("--rounds", type=int, default=6, help="--model: interleaved rounds")
    p.add_argument(
        "--phases", action="store_true", help="also time the forward alone, without and with autograd"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: tiny ops, no thread wake-ups)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    dtype = torch.bfloat16
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if args.model:
        bench_model(device, args.rounds, args.env_variants, sync)
        return 0
    cases = ["torch_linear", "autograd_function_floor"]
    for kind in ("fake", "triton", "emulated"):
        cases += [f"{kind}/{r}" for r in RECIPES]
    if args.cases:
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    tables = [c.strip() for c in args.op_table.split(",") if c.strip()]
    for c in [args.profile, *tables]:
        if c and c not in cases:
            cases.append(c)

    env_name, env_values = None, []
    if args.env_variants:
        env_name, _, vals = args.env_variants.partition("=")
        env_values = [v for v in vals.split(",") if v]
        expand = lambda c: c.startswith("triton/") and "[" not in c
        cases = [
            f"{c}[{env_name}={v}]" if expand(c) else c
            for c in cases
            for v in (env_values if expand(c) else [None])
        ]
        cases = list(dict.fromkeys(cases))
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="minite_kernels")
    us, calls, syncs, ops, pycalls, optab, phases = {}, {}, {}, {}, {}, {}, {}
    for case in cases:
        base_case, _, variant = case.partition("[")
        if variant:
            set_env_option(env_name, variant.rstrip("]").partition("=")[2])
        layer, backend, ctx = build_case(base_case, device, args.k, args.n, dtype)
        xs = [
            torch.randn(1, args.tokens, args.k, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2)
        ]
        step = step_fn(layer, xs)
        with ctx:
            us[case] = time_case(step, args.iters, args.repeats, sync)
            if args.phases:
                phases[case] = {
                    name: round(time_case(fn, args.iters, args.repeats, sync), 1)
                    for name, fn in phase_fns(layer, xs).items()
                }
            if hasattr(backend, "quantize_calls"):
                q0, g0 = backend.quantize_calls, backend.gemm_calls
                step()
                calls[case] = {"quantize": backend.quantize_calls - q0, "gemm": backend.gemm_calls - g0}
            ops[case] = dict(zip(("all", "top_level"), count_aten_ops(step)))
            pycalls[case] = count_python_calls(step)
            s = count_syncs(step, device)
            if s is not None:
                syncs[case] = s
            if case == args.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.iters):
                    step()
                prof.disable()
                pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
            if case in tables:
                print(f"--- torch profiler, {case}", file=sys.stderr)
                optab[case] = op_table(step, device)
        print(
            f"{case:42s} {us[case]:9.1f} us / linear fwd+bwd, {ops[case]['top_level']:3d} top-level ATen ops "
            f"({ops[case]['all']} in all), {pycalls[case]:.0f} Python calls",
            file=sys.stderr,
        )

    base = us.get("torch_linear")
    import minite_kernels

    rec = {
        "bench": "host_overhead",
        "minite_kernels": minite_kernels.__file__,
        "device": str(device),
        "torch": torch.__version__,
        "shape": [args.tokens, args.k, args.n],
        "us_per_linear": {c: round(v, 1) for c, v in us.items()},
    }
    if base:
        rec["overhead_us_vs_torch_linear"] = {
            c: round(v - base, 1) for c, v in us.items() if c != "torch_linear"
        }
        rec["ratio_vs_torch_linear"] = {c: round(v / base, 2) for c, v in us.items() if c != "torch_linear"}
    rec["aten_ops_per_linear"] = ops
    rec["python_calls_per_linear"] = pycalls
    if calls:
        rec["calls_per_linear"] = calls
    if syncs:
        rec["host_syncs_per_linear"] = syncs
    if optab:
        rec["op_table"] = optab
    if phases:
        rec["us_per_phase"] = phases
    print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

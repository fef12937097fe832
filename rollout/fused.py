"""The decode step's elementwise work as a few fused functions (compiled by ``torch.compile`` on CUDA).

At decode batch sizes the step's GEMMs are short, and a per-op forward spends most of its GPU time in small
elementwise kernels: HF's RMSNorm alone is seven launches (cast, square, mean, add, rsqrt, multiply, cast,
weight multiply), the rotary embedding ten. These functions restate the same formulas so that inductor can
fuse each into one or two kernels:

    rms_norm(x, w)        = w * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)            (x32 = x in fp32)
    add_rms_norm(h, y, w) = (h + y, rms_norm(h + y, w))                                 (residual, then norm)
    qk_norm_rope(q, k)    = rope(rms_norm(q, wq)), rope(rms_norm(k, wk))                (per head; Qwen3)
    qk_norm_rope_store    = qk_norm_rope, with k and v written into their KV-cache slot       (returns q)
    rope(x)               = x * cos + rotate_half(x) * sin,  rotate_half([a, b]) = [-b, a]
    silu_mul(g, u)        = silu(g) * u
    draw                  = ``rollout.sampling.draw``: processed logits, row uniforms, token and its log-prob

Eagerly they are op for op HF's LlamaRMSNorm / Qwen3RMSNorm, ``apply_rotary_pos_emb`` and the SiLU MLP (and
the draw is the reference loop's), so on CPU (where they are not compiled) the engine's numbers are HF's bit
for bit. Compiled, inductor keeps the intermediates of a fused kernel in fp32 instead of rounding each to the
model dtype, so bf16 results may differ from HF's by a bf16 rounding step; fp32 results by reduction order only
(the draw's log-probs by a few fp32 ulps, and its token only where a uniform falls within such an ulp of a
cumulative-probability boundary).

Worked example: rms_norm([3, 4], w = [1, 1], eps = 0) = [3, 4] / sqrt((9 + 16) / 2) = [0.8485, 1.1314].
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from rollout.sampling import draw


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dt = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dt)


def add_rms_norm(h: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    h = h + y
    return h, rms_norm(h, w, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, 1, D], ``cos`` / ``sin`` [B, 1, D] (HF's ``apply_rotary_pos_emb`` with unsqueeze_dim 1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (_rotate_half(x) * sin)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor | None, wk: torch.Tensor | None, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` [B, 1, Hq, D], ``k`` [B, 1, Hkv, D] -> rotated [B, Hq, 1, D], [B, Hkv, 1, D] (norms when given)."""
    if wq is not None:
        q, k = rms_norm(q, wq, eps), rms_norm(k, wk, eps)
    return rope(q.transpose(1, 2), cos, sin), rope(k.transpose(1, 2), cos, sin)


def qk_norm_rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor | None,
                       wk: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                       keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """:func:`qk_norm_rope`, then this step's k and v (``v`` [B, 1, Hkv, D]) written into slot ``slot`` (int64
    [1]) of the cache views ``keys`` / ``values`` [B, Hkv, S, D]; returns the rotated q. Compiled, the two cache
    writes become stores of the kernel that makes k instead of two launches of their own."""
    q, k = qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    keys.index_copy_(2, slot, k)
    values.index_copy_(2, slot, v.transpose(1, 2))
    return q


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


FUNCTIONS = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "qk_norm_rope_store": qk_norm_rope_store,
             "silu_mul": silu_mul, "draw": draw}


#: compiled variants each function may hold. Each is compiled for static shapes: one per batch bucket, model dtype,
#: head layout (with or without q/k norms), cache length and sampling setting a process meets (a trainer with
#: eval: a few dozen; the GPU test suite: more), and with ``fullgraph=True`` Dynamo's default of 8 is a hard
#: error, not a fallback. The engine calls the functions only in eager steps, so checking many entries'
#: guards costs nothing per replayed token.
RECOMPILE_LIMIT = 512


@functools.lru_cache(maxsize=None)
def compiled(name: str):
    """``torch.compile`` of one of :data:`FUNCTIONS` (static shapes, one graph, no CUDA graphs of its own: the
    engine captures the whole step itself), called under :data:`RECOMPILE_LIMIT`. The engine calls it only in
    eager steps (a graph's capture and warm-up), so the config patch per call costs nothing per replayed token.

    Why static shapes: with ``dynamic=True`` Dynamo keeps entries whose guards overlap (one compiled for batch 8
    with the duck-sized guard ``cache rows == batch``, a later general one for any batch >= 2) and runs the most
    recent one that admits the input. Two entries may round a bf16 result differently, so the bits a call
    computes would depend on the batch sizes the process met before, and an engine's first run could draw other
    tokens than the same run repeated (``scripts/check_rerun_determinism.py --dynamic`` shows it on a GPU).
    Static entries have disjoint guards (exact sizes and strides), so an input always meets the same kernel.

    Inductor's deterministic mode (where this torch has it) keeps the kernels' reduction block sizes off the
    timing-based autotuner: those knobs change the summation order, so a new process (a resumed run) could
    otherwise pick other kernels than the process it resumes and draw other tokens."""
    import torch._inductor.config as inductor_config

    options = {"deterministic": True} if hasattr(inductor_config, "deterministic") else None
    fn = torch.compile(FUNCTIONS[name], dynamic=False, fullgraph=True, options=options)
    # Dynamo caps a function's entries twice: per set of guarded objects, and in all (default 256)
    limits = {k: RECOMPILE_LIMIT for k in ("recompile_limit", "accumulated_recompile_limit")
              if hasattr(torch._dynamo.config, k)}

    @functools.wraps(FUNCTIONS[name])
    def call(*args):
        with torch._dynamo.config.patch(**limits):
            return fn(*args)

    return call


def functions(compile_: bool) -> dict:
    return {n: compiled(n) for n in FUNCTIONS} if compile_ else dict(FUNCTIONS)

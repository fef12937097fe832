"""One decode step of an HF decoder-only LM over a static KV cache: a thin forward over the model's own modules.

For each row b (one new token at position ``pos[b]``, written to cache slot ``slot``, the same for every row)::

    h = embed(tok)
    per layer:  x = input_norm(h)
                q, k, v = q_proj(x), k_proj(x), v_proj(x)       (q_norm / k_norm per head when the model has them)
                q, k = rope(q, k, pos)
                K[:, :, slot], V[:, :, slot] = k, v
                h = h + o_proj(attend(q, K, V))     softmax(q Kᵀ * scaling) V over row b's valid slots
                h = h + mlp(post_attention_norm(h))
    logits = lm_head(norm(h))

The projections, norms, MLP and rotary embedding are the model's modules, called as the model calls them, so a
minite-patched linear runs its quantized path here as in the learner, and the numerics match HF's forward up
to the attention kernel's reduction order. Grouped-query attention runs without copying K/V: the ``rep`` query
heads that share a KV head are laid out as ``rep`` query rows of that head ([B, Hkv, rep, D] against
[B, Hkv, S, D]), which is the head order of HF's ``repeat_kv`` (head h uses KV head h // rep).

Nothing here synchronises with the host or allocates shape-dependent host state, so the step can be captured
in a CUDA graph. Models the step cannot reproduce exactly (sliding-window layers, rotary embeddings that
rescale with the sequence length) are refused by :func:`decoder_view` with the reason.

With ``fns`` (``fused.functions``), models whose norms are the standard RMSNorm and whose MLP is SiLU-gated
run the norms, residual adds, rotary embedding and SiLU product as the fused functions of ``fused.py``
(each layer's post-MLP residual add fused with the next layer's input norm); the linears stay module calls.

Example: Qwen3-0.6B (Hq = 16, Hkv = 8, D = 128) has rep = 2: query heads 2g and 2g+1 read KV head g.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

#: ``config.model_type`` values whose decoder layers this forward reproduces
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
#: rotary types whose cos/sin depend on the position only (``dynamic`` / ``longrope`` rescale with length)
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: norm classes computing ``w * (x32 * rsqrt(mean(x32^2) + eps)).to(dtype)`` (``fused.rms_norm``)
STANDARD_RMSNORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


class UnsupportedModel(ValueError):
    """The decode step cannot reproduce this model's forward; the message says why."""


@dataclass(frozen=True)
class DecoderView:
    embed: torch.nn.Module
    layers: tuple
    norm: torch.nn.Module
    lm_head: torch.nn.Module
    rotary: torch.nn.Module
    rope: Callable
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: bool
    #: why the fused functions cannot stand in for this model's modules (None: they can)
    unfusable: str | None = None
    eps: float = 0.0

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def decoder_view(model: Any) -> DecoderView:
    """The modules of ``model`` the decode step calls; raises :class:`UnsupportedModel` naming the reason."""
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(f"model_type {mt!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    inner = getattr(model, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            raise UnsupportedModel(f"{type(model).__name__}.model has no {name!r}")
    if not hasattr(model, "lm_head"):
        raise UnsupportedModel(f"{type(model).__name__} has no lm_head")
    rope_type = getattr(inner.rotary_emb, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope_type {rope_type!r} rescales with the sequence length "
                               f"(supported: {', '.join(STATIC_ROPE_TYPES)})")
    layers = tuple(inner.layers)
    attn0 = layers[0].self_attn
    for i, layer in enumerate(layers):
        a = layer.self_attn
        if getattr(a, "sliding_window", None) is not None:
            raise UnsupportedModel(f"layer {i} uses sliding-window attention")
        if float(a.scaling) != float(attn0.scaling):
            raise UnsupportedModel(f"layer {i} has another attention scaling")
    rope = getattr(sys.modules[type(attn0).__module__], "apply_rotary_pos_emb", None)
    if rope is None:
        raise UnsupportedModel(f"{type(attn0).__module__} has no apply_rotary_pos_emb")
    head_dim = int(attn0.head_dim)
    qk_norm = hasattr(attn0, "q_norm") and hasattr(attn0, "k_norm")
    unfusable, eps = _fusable(inner.norm, layers, qk_norm)
    return DecoderView(
        embed=inner.embed_tokens, layers=layers, norm=inner.norm, lm_head=model.lm_head, rotary=inner.rotary_emb,
        rope=rope, num_heads=int(cfg.num_attention_heads), num_kv_heads=int(cfg.num_key_value_heads),
        head_dim=head_dim, qk_norm=qk_norm, unfusable=unfusable, eps=eps,
    )


def _fusable(final_norm, layers, qk_norm: bool) -> tuple[str | None, float]:
    norms = [final_norm]
    for layer in layers:
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        if qk_norm:
            norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
    for n in norms:
        if type(n).__name__ not in STANDARD_RMSNORMS:
            return f"norm {type(n).__name__} is not one of {', '.join(STANDARD_RMSNORMS)}", 0.0
    eps = {float(n.variance_epsilon) for n in norms}
    if len(eps) != 1:
        return f"norms use several epsilons {sorted(eps)}", 0.0
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return f"layer {i}'s MLP is not gate/up/down", 0.0
        if type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
            return f"layer {i}'s MLP activation is {type(getattr(mlp, 'act_fn', None)).__name__}, not SiLU", 0.0
    return None, eps.pop()


def decode_logits(view: DecoderView, keys: list[torch.Tensor], values: list[torch.Tensor], tok: torch.Tensor,
                  pos: torch.Tensor, slot: torch.Tensor, attend: Callable, fns: dict | None = None,
                  packed: list | None = None, norm_quant: bool = False, down: list | None = None,
                  o: list | None = None) -> torch.Tensor:
    """Logits [B, V] of one decode step, writing this step's K/V into slot ``slot`` of each layer's cache.

    ``keys[i]`` / ``values[i]``: [B, Hkv, S, D] views of the static cache; ``tok``, ``pos``: int64 [B];
    ``slot``: int64 [1]; ``attend(q, K, V, scale)``: attention of q [B, Hkv, rep, D] over the slots each row
    attends to (``attention.py``: its valid slots, this step's included).
    ``fns``: the fused functions (``fused.functions``) for a model with ``view.unfusable is None``;
    ``packed``: with them, ``PackedLinears.layers`` (one GEMM for q/k/v and one for gate/up where packed;
    a group that returns None for this input runs as the model's modules).
    ``norm_quant``: a packed NVFP4 group takes its X̂ from the op before it, that op and the lane's activation
    quantization in one Triton launch (``minite_kernels.backends.triton.norm_quant``: residual add + RMSNorm
    for q/k/v and gate/up; the SiLU product for ``down[i]``, ``PackedLinears.down``), instead of the op's output
    quantized by the group.
    ``down`` / ``o``: per layer, the down / o projection as a one-module group (``PackedLinears.down`` / ``.o``)
    or None; such a group runs the projection where it takes the input (FP4 weights), else the module runs.
    """
    if fns is not None:
        return _decode_fused(view, keys, values, tok, pos, slot, attend, fns, packed, norm_quant, down, o)
    b = tok.shape[0]
    d, hkv = view.head_dim, view.num_kv_heads
    rep = view.num_heads // hkv
    h = view.embed(tok.unsqueeze(1))                                   # [B, 1, H]
    cos, sin = view.rotary(h, pos.unsqueeze(1))                        # [B, 1, D]
    for i, layer in enumerate(view.layers):
        a = layer.self_attn
        x = layer.input_layernorm(h)
        q = a.q_proj(x).view(b, 1, -1, d)
        k = a.k_proj(x).view(b, 1, -1, d)
        v = a.v_proj(x).view(b, 1, -1, d)
        if view.qk_norm:
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = view.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, Hq, 1, D], [B, Hkv, 1, D]
        keys[i].index_copy_(2, slot, k)
        values[i].index_copy_(2, slot, v.transpose(1, 2))
        att = attend(q.reshape(b, hkv, rep, d), keys[i], values[i], a.scaling)  # [B, Hkv, rep, D]
        h = h + a.o_proj(att.reshape(b, 1, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return view.lm_head(view.norm(h))[:, 0]


def _decode_fused(view: DecoderView, keys, values, tok, pos, slot, attend, fns: dict, packed,
                  norm_quant: bool = False, down: list | None = None, o: list | None = None) -> torch.Tensor:
    b = tok.shape[0]
    d, hkv, eps = view.head_dim, view.num_kv_heads, view.eps
    rep = view.num_heads // hkv
    h = view.embed(tok.unsqueeze(1))
    cos, sin = view.rotary(h, pos.unsqueeze(1))
    layers = view.layers
    groups = packed if packed is not None else [(None, None)] * len(layers)

    def norm(h, y, w, group):
        """(h + y, the normed x for ``group``): x itself, or its X̂ when the group takes one made here."""
        if norm_quant and group is not None and group.takes_deq(h):
            from minite_kernels.backends.triton import add_rms_norm_deq

            k = h.shape[-1]
            h2, x_hat, _ = add_rms_norm_deq(h.reshape(-1, k), None if y is None else y.reshape(-1, k), w, eps)
            return (h if h2 is None else h2.view(h.shape)), (x_hat, h.shape)
        if y is None:
            return h, fns["rms_norm"](h, w, eps)
        return fns["add_rms_norm"](h, y, w, eps)

    def project(group, x):
        """The group's concatenated outputs, or None where its modules must run on ``x``."""
        if group is None:
            return None
        return group.from_deq(*x) if isinstance(x, tuple) else group(x)

    h, x = norm(h, None, layers[0].input_layernorm.weight, groups[0][0])
    for i, layer in enumerate(layers):
        a, mlp = layer.self_attn, layer.mlp
        qkv, gu = groups[i]
        y = project(qkv, x)  # None: this group runs as its modules here
        if y is not None:
            q, k, v = y.split(qkv.splits, dim=-1)
        else:
            q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        q, k, v = q.view(b, 1, -1, d), k.view(b, 1, -1, d), v.view(b, 1, -1, d)
        wq, wk = (a.q_norm.weight, a.k_norm.weight) if view.qk_norm else (None, None)
        q = fns["qk_norm_rope_store"](q, k, v, wq, wk, eps, cos, sin, keys[i], values[i], slot)
        att = attend(q.reshape(b, hkv, rep, d), keys[i], values[i], a.scaling).reshape(b, 1, -1)
        y = project(o[i] if o is not None else None, att)
        h, x = norm(h, a.o_proj(att) if y is None else y, layer.post_attention_layernorm.weight, gu)
        y = project(gu, x)
        if y is not None:
            g, u = y.split(gu.splits, dim=-1)
        else:
            g, u = mlp.gate_proj(x), mlp.up_proj(x)
        dn = down[i] if down is not None else None
        if norm_quant and dn is not None and dn.takes_deq(g):
            from minite_kernels.backends.triton import silu_mul_deq

            k = g.shape[-1]
            y = dn.from_deq(silu_mul_deq(g.reshape(-1, k), u.reshape(-1, k))[0], g.shape)
        else:
            act = fns["silu_mul"](g, u)
            y = project(dn if dn is not None and dn.fp4 is not None else None, act)
            y = mlp.down_proj(act) if y is None else y
        last = i + 1 == len(layers)
        w_next = view.norm.weight if last else layers[i + 1].input_layernorm.weight
        h, x = norm(h, y, w_next, None if last else groups[i + 1][0])
    return view.lm_head(x)[:, 0]

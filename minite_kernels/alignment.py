"""Learner-vs-sampler alignment diagnostics (report §2.2, §4.4, §4.5).

Report §4.5: even with the same quantization policy, differences in kernels, reduction order or token layout
accumulate into train-inference log-probability gaps; the aligned configuration reaches a gap of ~1e-8.
Report §4.4: compare quantized data and scales only after aligning token (and expert) identities, so that a
permutation is not mistaken for numerical error. This module provides the comparisons:

- :func:`compare_quantized` — two NVFP4 (or two MXFP8) tensors: code/data match rate, scale match rate
  (raw bytes), amax equality (bitwise), first mismatch location, max |Δ| of the dequantized values.
- :func:`compare_logprobs` — per-token log-probs of the learner and the sampler with a mask. With
  ``δ = logp_learner - logp_sampler`` (report §2.1) over the masked tokens::

      mean_gap = mean δ;  mean_abs_gap = mean |δ|;  max_abs_gap = max |δ|;  p50/p90/p99 of |δ|
      frac_exact = fraction of tokens with bitwise-equal log-probs
      k3_kl = mean(exp(δ) - 1 - δ)   (the k3 estimator of KL(π_sampler ‖ π_learner) from sampler draws)

- :func:`compare_tensors` — bitwise agreement of two same-shape tensors; :func:`compare_tensor_dicts` —
  layer by layer, in order, with the first divergent name (for layerwise "deterministic mode" checks).
- :func:`align_rows` — reorder rows by token/expert ids before comparing.

All functions return plain Python values; ``.metrics()`` gives namespaced float dicts for logging.

Worked example: learner [-1.0, -2.0, -0.5], sampler [-1.0, -2.5, -0.4], mask [1, 1, 0]: δ = [0, 0.5];
mean_abs_gap = 0.25, max_abs_gap = 0.5, frac_exact = 0.5, k3_kl = ((e^0 - 1 - 0) + (e^0.5 - 1 - 0.5)) / 2
= 0.0743606.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .formats import MXFP8Tensor, NVFP4Tensor


def _first_mismatch(neq: torch.Tensor) -> tuple[int, ...] | None:
    idx = torch.nonzero(neq)
    return tuple(int(v) for v in idx[0]) if idx.numel() else None


def _bits(x: torch.Tensor) -> torch.Tensor:
    """A view of ``x`` as same-width integers, so equality is bitwise (NaN == NaN with the same payload)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return x.contiguous().view(ints[x.element_size()])


@dataclass(frozen=True)
class QuantizedComparison:
    """Result of :func:`compare_quantized` (``first_*`` are (row, col) in the [M, K] code / [M, K//blk] scale grid)."""

    n_elements: int
    code_match_rate: float
    scale_match_rate: float
    amax_equal: bool
    first_code_mismatch: tuple[int, ...] | None
    first_scale_mismatch: tuple[int, ...] | None
    max_abs_dequant_diff: float

    @property
    def bit_exact(self) -> bool:
        return self.code_match_rate == 1.0 and self.scale_match_rate == 1.0 and self.amax_equal

    def metrics(self, prefix: str = "align/quant") -> dict[str, float]:
        return {
            f"{prefix}/code_match_rate": self.code_match_rate,
            f"{prefix}/scale_match_rate": self.scale_match_rate,
            f"{prefix}/amax_equal": float(self.amax_equal),
            f"{prefix}/bit_exact": float(self.bit_exact),
            f"{prefix}/max_abs_dequant_diff": self.max_abs_dequant_diff,
        }


def compare_quantized(a: NVFP4Tensor | MXFP8Tensor, b: NVFP4Tensor | MXFP8Tensor) -> QuantizedComparison:
    """Compare two quantized tensors of the same kind and shape (e.g. learner vs sampler weights)."""
    if type(a) is not type(b) and not (isinstance(a, NVFP4Tensor) and isinstance(b, NVFP4Tensor)):
        raise TypeError(
            f"compare_quantized needs two tensors of one format, got {type(a).__name__} and {type(b).__name__}"
        )
    if isinstance(a, NVFP4Tensor):
        assert isinstance(b, NVFP4Tensor)
        for f in ("scaling", "tile", "rht"):
            if getattr(a, f) != getattr(b, f):
                raise ValueError(f"compare_quantized: {f} differs ({getattr(a, f)!r} vs {getattr(b, f)!r})")
        ca, cb = a.codes(), b.codes()
        amax_equal = a.amax.shape == b.amax.shape and torch.equal(_bits(a.amax), _bits(b.amax))
    elif isinstance(a, MXFP8Tensor):
        assert isinstance(b, MXFP8Tensor)
        ca, cb = _bits(a.data), _bits(b.data)
        amax_equal = True  # MXFP8 has no outer scale
    else:
        raise TypeError(f"compare_quantized expects NVFP4Tensor or MXFP8Tensor, got {type(a).__name__}")
    if ca.shape != cb.shape:
        raise ValueError(f"compare_quantized: shapes differ: {tuple(ca.shape)} vs {tuple(cb.shape)}")
    code_neq = ca != cb
    scale_neq = _bits(a.scales) != _bits(b.scales)
    diff = (a.dequantize().double() - b.dequantize().double()).abs()
    both_nan = torch.isnan(diff)
    max_diff = float(diff[~both_nan].max()) if bool((~both_nan).any()) else 0.0
    n = ca.numel()
    return QuantizedComparison(
        n_elements=n,
        code_match_rate=1.0 - int(code_neq.sum()) / n if n else 1.0,
        scale_match_rate=1.0 - int(scale_neq.sum()) / scale_neq.numel() if scale_neq.numel() else 1.0,
        amax_equal=bool(amax_equal),
        first_code_mismatch=_first_mismatch(code_neq),
        first_scale_mismatch=_first_mismatch(scale_neq),
        max_abs_dequant_diff=max_diff,
    )


def _quantiles(x: torch.Tensor, ps: tuple[float, ...]) -> list[float]:
    """Linear-interpolation quantiles (``torch.quantile``'s default) via one sort, without its size limit."""
    v = torch.sort(x.reshape(-1)).values
    n = v.numel()
    out = []
    for p in ps:
        pos = p * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        out.append(float(v[lo] + (v[hi] - v[lo]) * (pos - lo)))
    return out


@dataclass(frozen=True)
class LogprobComparison:
    """Result of :func:`compare_logprobs` (gaps are ``learner - sampler`` over masked, finite tokens)."""

    n_tokens: int
    n_nonfinite: int
    mean_gap: float
    mean_abs_gap: float
    max_abs_gap: float
    p50_abs_gap: float
    p90_abs_gap: float
    p99_abs_gap: float
    frac_exact: float
    k3_kl: float
    first_mismatch: tuple[int, ...] | None

    def metrics(self, prefix: str = "align/logp") -> dict[str, float]:
        d = asdict(self)
        d.pop("first_mismatch")
        return {f"{prefix}/{k}": float(v) for k, v in d.items()}


def compare_logprobs(
    learner: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor | None = None
) -> LogprobComparison:
    """Compare per-token log-probs ``[B, T]`` (any same shape) of the learner and the sampler under ``mask``.

    Tokens where either side is non-finite are excluded from the statistics and counted in ``n_nonfinite``
    (bitwise-equal pairs, e.g. both -inf, still count as exact). Accumulation in fp64.
    """
    if learner.shape != sampler.shape:
        raise ValueError(
            f"compare_logprobs: shapes differ: learner {tuple(learner.shape)} vs sampler {tuple(sampler.shape)}"
        )
    if mask is None:
        mask = torch.ones(learner.shape, dtype=torch.bool, device=learner.device)
    if mask.shape != learner.shape:
        raise ValueError(
            f"compare_logprobs: mask shape {tuple(mask.shape)} != log-prob shape {tuple(learner.shape)}"
        )
    m = mask.to(device=learner.device).bool()
    exact = (_bits(learner.detach()) == _bits(sampler.detach().to(learner.dtype))) & m
    lp, sp = learner.detach().double(), sampler.detach().double()
    finite = torch.isfinite(lp) & torch.isfinite(sp) & m
    n_tok = int(m.sum())
    if n_tok == 0:
        raise ValueError("compare_logprobs: the mask selects no tokens")
    delta = (lp - sp)[finite]
    n_fin = delta.numel()
    nan = math.nan
    if n_fin:
        ad = delta.abs()
        qs = _quantiles(ad, (0.5, 0.9, 0.99))
        stats = (
            float(delta.mean()),
            float(ad.mean()),
            float(ad.max()),
            *qs,
            float((torch.expm1(delta) - delta).mean()),
        )
    else:
        stats = (nan,) * 7
    mean_gap, mean_abs, max_abs, p50, p90, p99, k3 = stats
    return LogprobComparison(
        n_tokens=n_tok,
        n_nonfinite=n_tok - n_fin,
        mean_gap=mean_gap,
        mean_abs_gap=mean_abs,
        max_abs_gap=max_abs,
        p50_abs_gap=p50,
        p90_abs_gap=p90,
        p99_abs_gap=p99,
        frac_exact=int(exact.sum()) / n_tok,
        k3_kl=k3,
        first_mismatch=_first_mismatch(m & ~exact),
    )


@dataclass(frozen=True)
class TensorComparison:
    """Bitwise comparison of two same-shape tensors."""

    bit_exact: bool
    match_rate: float
    max_abs_diff: float
    first_mismatch: tuple[int, ...] | None


def compare_tensors(a: torch.Tensor, b: torch.Tensor) -> TensorComparison:
    """Bitwise agreement (same dtype required; NaN equals NaN with the same bits) and max |a - b|."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            f"compare_tensors: need the same shape and dtype, got {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
        )
    a, b = a.detach(), b.detach().to(a.device)
    neq = _bits(a) != _bits(b)
    n = a.numel()
    diff = (a.double() - b.double()).abs()
    diff = diff[~torch.isnan(diff)]
    return TensorComparison(
        bit_exact=not bool(neq.any()),
        match_rate=1.0 - int(neq.sum()) / n if n else 1.0,
        max_abs_diff=float(diff.max()) if diff.numel() else 0.0,
        first_mismatch=_first_mismatch(neq),
    )


def compare_tensor_dicts(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Compare two ``name -> tensor`` dumps (e.g. per-layer outputs of learner and sampler) in ``a``'s order.

    Returns ``{"per_name": {name: TensorComparison}, "first_divergent": name | None,
    "missing": [names only in one dump]}``.
    """
    per_name: dict[str, TensorComparison] = {}
    first = None
    for name, ta in a.items():
        if name not in b:
            continue
        c = compare_tensors(ta, b[name])
        per_name[name] = c
        if first is None and not c.bit_exact:
            first = name
    missing = sorted(set(a) ^ set(b))
    return {"per_name": per_name, "first_divergent": first, "missing": missing}


def align_rows(x: torch.Tensor, ids: torch.Tensor, ref_ids: torch.Tensor) -> torch.Tensor:
    """Reorder the rows of ``x`` (labelled by ``ids``) into the order of ``ref_ids`` (token or expert ids).

    Raises ValueError when the two id lists are not permutations of each other (or contain duplicates).
    """
    ids, ref_ids = ids.reshape(-1).to(x.device), ref_ids.reshape(-1).to(x.device)
    if ids.numel() != x.shape[0]:
        raise ValueError(f"align_rows: {ids.numel()} ids for {x.shape[0]} rows")
    s_ids, order = torch.sort(ids)
    s_ref, ref_order = torch.sort(ref_ids)
    if (
        s_ids.numel() != s_ref.numel()
        or not torch.equal(s_ids, s_ref)
        or bool((s_ids[1:] == s_ids[:-1]).any())
    ):
        raise ValueError("align_rows: ids and ref_ids must be permutations of the same unique ids")
    out = torch.empty_like(x)
    out[ref_order] = x[order]
    return out


# --- sampler-shaped vs learner-shaped execution, layer by layer -------------------------------------------------
@dataclass
class LayerGap:
    """One hidden state (embeddings = 0, after decoder layer i = i + 1) over the compared positions."""

    layer: int
    max_abs: float
    mean_abs: float
    #: fraction of the per-token NVFP4 codes of this hidden state that differ between the two paths
    code_diff_frac: float


@dataclass
class ExecutionGap:
    layers: list[LayerGap]
    first_diff_layer: int | None  # the first hidden state that differs at all (None: all equal)
    first_code_diff_layer: int | None  # the first whose NVFP4 codes differ
    logprob: LogprobComparison  # of each next token, decode path as "sampler", full forward as "learner"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def execution_gap(model, sequences: list[list[int]], prompt_lens: list[int]) -> ExecutionGap:
    """Run each sequence as the learner does (one full forward) and as a sampler does (a prefill of its prompt,
    then one token at a time through the KV cache, teacher-forced on the same tokens), and compare every
    hidden state and the next-token log-probs over the response positions.

    The differences come only from execution shape (report §2.2): with the same weights, formats and inputs,
    the GEMM and attention reductions run in another order. Under ``minite_kernels.strict.StrictMode`` they
    are zero. Example: ``execution_gap(model, [prompt + response], [len(prompt)]).first_diff_layer``.
    """
    from transformers import DynamicCache

    from .formats import quantize_nvfp4

    dev = next(model.parameters()).device
    per_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    lp_full, lp_dec = [], []
    for seq, p in zip(sequences, prompt_lens):
        if not 0 < p < len(seq):
            raise ValueError(f"prompt length {p} must be in [1, {len(seq) - 1}] for a sequence of {len(seq)}")
        ids = torch.tensor([seq], device=dev)
        full = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids[:, :p], past_key_values=cache, use_cache=True, output_hidden_states=True)
        dec_h = [[h[:, -1:]] for h in out.hidden_states]
        dec_logits = [out.logits[:, -1:]]
        for t in range(p, len(seq) - 1):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True, output_hidden_states=True)
            for i, h in enumerate(out.hidden_states):
                dec_h[i].append(h)
            dec_logits.append(out.logits)
        for i, h in enumerate(full.hidden_states):
            per_layer.setdefault(i, []).append((h[0, p - 1:len(seq) - 1], torch.cat(dec_h[i], 1)[0]))
        tgt = ids[0, p:]
        lp_full.append(torch.log_softmax(full.logits[0, p - 1:-1].float(), -1).gather(-1, tgt[:, None])[:, 0])
        lp_dec.append(torch.log_softmax(torch.cat(dec_logits, 1)[0].float(), -1).gather(-1, tgt[:, None])[:, 0])
    layers = []
    for i in sorted(per_layer):
        a = torch.cat([x for x, _ in per_layer[i]]).float()
        b = torch.cat([y for _, y in per_layer[i]]).float()
        d = (a - b).abs()
        k = a.shape[-1] - a.shape[-1] % 16
        codes = 0.0
        if k:
            qa = quantize_nvfp4(a[:, :k].contiguous(), scaling="per_token").data
            qb = quantize_nvfp4(b[:, :k].contiguous(), scaling="per_token").data
            # two E2M1 codes per byte: compare nibbles
            diff = ((qa ^ qb) & 0x0F).ne(0).float().sum() + ((qa ^ qb) >> 4).ne(0).float().sum()
            codes = float(diff / (2 * qa.numel()))
        layers.append(LayerGap(i, float(d.max()), float(d.mean()), codes))
    first = next((g.layer for g in layers if g.max_abs > 0), None)
    first_code = next((g.layer for g in layers if g.code_diff_frac > 0), None)
    full_lp, dec_lp = torch.cat(lp_full), torch.cat(lp_dec)
    return ExecutionGap(layers, first, first_code,
                        compare_logprobs(full_lp, dec_lp, torch.ones_like(full_lp)))

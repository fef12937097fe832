"""Fixed-length segments along the response axis, vectorised by reshape (report §2.5, Appendix B).

Position ``t`` (counted from the first response token) belongs to segment ``s = t // L``; with
``S = ceil(T / L)`` the last segment may be partial. The full segments of a ``[..., T]`` tensor are viewed
as ``[..., S_full, L]`` (no copy, the rows stay contiguous) and summed with one ``sum(-1)``; a partial last
segment is summed separately. No Python loop over segments or tokens.

Worked example (L = 2, T = 5)::

    x = [[1, 2, 3, 4, 5]]  ->  [[1, 2], [3, 4]] + [5]  ->  segment_sum = [[3, 7, 5]]
    expand_segments([[3, 7, 5]], 2, 5) = [[3, 3, 7, 7, 5]]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def num_segments(length: int, seg_len: int) -> int:
    return -(-length // seg_len)


def segment_view(x: torch.Tensor, seg_len: int) -> torch.Tensor:
    """``[..., T]`` -> ``[..., S, seg_len]`` (zero right-padding; a view when ``T % seg_len == 0``)."""
    t = x.shape[-1]
    s = num_segments(t, seg_len)
    pad = s * seg_len - t
    if pad:
        x = F.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], s, seg_len)


def segment_sum(x: torch.Tensor, seg_len: int) -> torch.Tensor:
    """``[..., T]`` -> ``[..., S]``: sum of each segment (differentiable; bool sums to int64)."""
    t = x.shape[-1]
    full = (t // seg_len) * seg_len
    if full == t:
        return x.reshape(*x.shape[:-1], t // seg_len, seg_len).sum(-1)
    head = x[..., :full].reshape(*x.shape[:-1], full // seg_len, seg_len).sum(-1)
    tail = x[..., full:].sum(-1, keepdim=True)
    return torch.cat((head, tail), dim=-1)


def expand_segments(seg: torch.Tensor, seg_len: int, length: int) -> torch.Tensor:
    """``[..., S]`` -> ``[..., length]``: each position takes its segment's value."""
    out = seg.unsqueeze(-1).expand(*seg.shape, seg_len)
    return out.reshape(*seg.shape[:-1], seg.shape[-1] * seg_len)[..., :length]


def segment_where(cond: torch.Tensor, seg: torch.Tensor, other: float, seg_len: int) -> torch.Tensor:
    """``where(cond[..., t], seg[..., t // seg_len], other)`` as one ``[..., T]`` tensor."""
    t = cond.shape[-1]
    if t % seg_len == 0:
        view = cond.reshape(*cond.shape[:-1], t // seg_len, seg_len)
        return torch.where(view, seg.unsqueeze(-1), other).reshape(cond.shape)
    return torch.where(cond, expand_segments(seg, seg_len, t), other)


def segment_count(x: torch.Tensor, seg_len: int) -> torch.Tensor:
    """``[..., T]`` bool -> ``[..., S]`` int32 counts of True per segment.

    Sums the bytes in uint8 when a segment fits (``seg_len <= 255``), which avoids the int64 copy that
    ``bool.sum`` makes."""
    if seg_len > 255 or x.dtype != torch.bool:
        return segment_sum(x, seg_len).to(torch.int32)
    t = x.shape[-1]
    full = (t // seg_len) * seg_len
    u8 = x.view(torch.uint8)
    head = u8[..., :full].reshape(*x.shape[:-1], full // seg_len, seg_len).sum(-1, dtype=torch.uint8)
    if full == t:
        return head.to(torch.int32)
    tail = u8[..., full:].sum(-1, keepdim=True, dtype=torch.uint8)
    return torch.cat((head, tail), dim=-1).to(torch.int32)

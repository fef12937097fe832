"""Masked linear-interpolation quantile, equal to ``torch.quantile(values[valid], q)`` (TRIAGE.md §6).

``torch.quantile`` (default ``interpolation='linear'``) on ``n`` values sorts them and computes, in the
input dtype (fp32 here):

    rank = fp32(q) * (n - 1)            (fp32 product)
    lo   = floor(rank),  hi = ceil(rank),  w = rank - lo
    q(x) = lerp(x_(lo), x_(hi), w)      (x_(i): the i-th smallest, 0-based)

Only ``x_(lo)`` and ``x_(hi)`` are needed, so no full sort and no boolean indexing (``x[valid]`` makes a
GPU wait to learn the size):

* sync-free (GPU): ``n`` stays a device tensor. Invalid entries are filled with ``+inf`` and one
  ``topk(largest=False, sorted=True)`` keeps the ``K`` smallest, with ``K`` a bound from the *total*
  size: ``K = floor(fp32(q) * (numel - 1)) + 2`` >= ``hi + 1`` for every ``n <= numel`` (the fp32 product
  is monotone). ``x_(lo)``, ``x_(hi)`` are then gathered at device indices. No host synchronisation.
* host count (CPU, where reading a count costs nothing): ``K = hi + 1`` exactly, an unsorted ``topk``,
  then ``x_(hi)`` = the largest of those and ``x_(lo)`` the second largest.

Both use the same fp32 rank arithmetic and the same ``torch.lerp`` as ``torch.quantile``, so results are
equal to it (tested, including with +-0 ties counted as equal); no valid value gives 0.0.
``torch.quantile`` also refuses inputs above 2^24 elements; this has no such limit.

Worked example (q = 0.05): values [-1, 0, 2, -3] all valid: n = 4, rank = 0.05 * 3 = 0.15 (fp32),
lo = 0, hi = 1, sorted [-3, -1, 0, 2] -> lerp(-3, -1, 0.15) = -2.7.
"""

from __future__ import annotations

import math
import struct

import torch


def avoid_host_sync(device: torch.device) -> bool:
    """Whether TRIAGE avoids reading device values back mid-computation on ``device`` (all but the CPU,
    where a read-back is free and lets cheaper exact paths be chosen)."""
    return device.type != "cpu"


def _rank_fp32(q: float, last_index: int) -> float:
    """``fp32(q) * last_index`` rounded to fp32, as ``torch.quantile`` computes it (exact for < 2^24)."""
    # the product of two fp32 values is exact in a double, so one rounding gives the fp32 product
    return _fp32(_fp32(q) * _fp32(float(last_index)))


def _fp32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def masked_quantile(
    values: torch.Tensor,
    valid: torch.Tensor,
    q: float,
    *,
    n: int | torch.Tensor | None = None,
    sync_free: bool | None = None,
) -> torch.Tensor:
    """0-dim tensor ``torch.quantile(values[valid].float(), q)`` (linear); 0.0 when nothing is valid.

    ``values``/``valid`` share any shape; ``values`` must be finite where ``valid``. ``n``: the number of
    valid entries if the caller already has it (a host ``int``, or a 0-dim integer tensor for the
    sync-free path). ``sync_free`` (default: on for every device but the CPU) selects the path that never
    reads a device value back to the host.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    if tuple(values.shape) != tuple(valid.shape):
        raise ValueError(
            f"shape mismatch: values has shape {tuple(values.shape)} but valid has shape {tuple(valid.shape)}"
        )
    if sync_free is None:
        sync_free = avoid_host_sync(values.device)
    x = values.detach().float().reshape(-1)
    ok = valid.reshape(-1)
    numel = x.numel()
    if numel == 0:
        return x.new_zeros(())
    filled = torch.where(ok, x, math.inf)
    if sync_free:
        n_t = n if isinstance(n, torch.Tensor) else torch.count_nonzero(ok)
        rank = (n_t - 1).clamp_(min=0).float() * q  # fp32 product, as torch.quantile
        lo = rank.long()
        w = rank - lo
        hi = rank.ceil().long()
        k = min(numel, math.floor(_rank_fp32(q, numel - 1)) + 2)
        smallest = torch.topk(filled, k, largest=False, sorted=True).values
        v_lo = smallest.index_select(0, lo.view(1))
        v_hi = smallest.index_select(0, hi.view(1))
        out = torch.lerp(v_lo, v_hi, w.view(1)).view(())
        return torch.where(n_t > 0, out, 0.0)
    if n is None or isinstance(n, torch.Tensor):
        n = int(n if n is not None else torch.count_nonzero(ok))
    if n == 0:
        return x.new_zeros(())
    rank = _rank_fp32(q, n - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    smallest = torch.topk(filled, hi + 1, largest=False, sorted=False).values
    top2 = torch.topk(smallest, min(2, hi + 1)).values  # descending: x_(hi), x_(hi - 1)
    v_hi = top2[:1]
    v_lo = top2[1:2] if hi > lo else v_hi
    w = torch.tensor([rank - lo], dtype=torch.float32, device=x.device)
    return torch.lerp(v_lo, v_hi, w).view(())

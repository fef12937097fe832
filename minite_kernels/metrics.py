"""Reconstruction-error metrics between a reference tensor and its approximation (report §2.3).

With reference ``x`` (``ref``) and decoded approximation ``x̂`` (``x``), n elements, fp64 accumulation::

    rel_l2 = ||x̂ - x||_2 / ||x||_2
    snr_db = 20 · log10(||x||_2 / ||x̂ - x||_2)
    mae    = (1/n) · Σ_j |x̂_j - x_j|
    cosine = <x, x̂> / (||x||_2 · ||x̂||_2)

Conventions where the report's assumption of a nonzero reference fails: an exact reconstruction gives
rel_l2 = 0 and snr_db = +inf (also when both are zero); a zero reference with a nonzero error gives
rel_l2 = +inf and snr_db = -inf. cosine is 1.0 when both tensors are all-zero and 0.0 when exactly one is.
NaN inputs give NaN. Shapes must match (ValueError otherwise); empty tensors raise ValueError.

Worked example: ref = [3, 4], x = [3, 5]: error [0, 1], ||ref|| = 5, rel_l2 = 0.2,
snr_db = 20·log10(5) = 13.9794, mae = 0.5, cosine = (9 + 20) / (5 · sqrt(34)) = 0.994692.
"""

from __future__ import annotations

import math

import torch

__all__ = ["cosine", "mae", "rel_l2", "snr_db"]


def _pair(ref: torch.Tensor, x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(ref, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} expects two tensors, got {type(ref).__name__} and {type(x).__name__}")
    if ref.shape != x.shape:
        raise ValueError(f"{name}: shapes differ: ref {tuple(ref.shape)} vs x {tuple(x.shape)}")
    if ref.numel() == 0:
        raise ValueError(f"{name}: empty tensors have no error metric")
    return ref.detach().reshape(-1).to(torch.float64), x.detach().reshape(-1).to(
        device=ref.device, dtype=torch.float64
    )


def _norms(ref: torch.Tensor, x: torch.Tensor, name: str) -> tuple[float, float]:
    r, v = _pair(ref, x, name)
    return float(torch.linalg.vector_norm(r)), float(torch.linalg.vector_norm(v - r))


def rel_l2(ref: torch.Tensor, x: torch.Tensor) -> float:
    """``||x - ref||_2 / ||ref||_2`` (0 for an exact match; +inf for a zero ref with a nonzero error)."""
    ref_n, err_n = _norms(ref, x, "rel_l2")
    if math.isnan(ref_n) or math.isnan(err_n):
        return math.nan
    if err_n == 0.0:
        return 0.0
    return math.inf if ref_n == 0.0 else err_n / ref_n


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    """``20·log10(||ref||_2 / ||x - ref||_2)`` in dB (+inf for an exact match; -inf for a zero ref)."""
    ref_n, err_n = _norms(ref, x, "snr_db")
    if math.isnan(ref_n) or math.isnan(err_n):
        return math.nan
    if err_n == 0.0:
        return math.inf
    if ref_n == 0.0 or math.isinf(err_n):
        return -math.inf
    return 20.0 * math.log10(ref_n / err_n)


def mae(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Mean absolute error ``mean |x - ref|``."""
    r, v = _pair(ref, x, "mae")
    return float((v - r).abs().mean())


def cosine(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors (1.0 if both are zero, 0.0 if exactly one is)."""
    r, v = _pair(ref, x, "cosine")
    nr, nv = float(torch.linalg.vector_norm(r)), float(torch.linalg.vector_norm(v))
    if math.isnan(nr) or math.isnan(nv):
        return math.nan
    if nr == 0.0 or nv == 0.0:
        return 1.0 if nr == nv else 0.0
    return float(torch.dot(r, v)) / (nr * nv)

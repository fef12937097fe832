"""Input checking shared by every TRIAGE entry point.

All ``[B, T]`` inputs must share one shape and device; log-probs and advantages must be floating point
(bf16 / fp16 / fp32 / fp64; computation is fp32); the mask may be bool or 0/1 numbers; advantages may
be ``[B]`` (one per response) or ``[B, T]``. Violations raise an error naming both shapes / the dtype.

Non-finite policy: a token whose log-probs (or advantage) are NaN or +-inf is removed from the valid
mask (it contributes to no loss term, no gradient and no statistic) and counted; the count is reported
as the metric ``triage/nonfinite_tokens``.
"""

from __future__ import annotations

import torch

from triage.quantile import avoid_host_sync


def check_logprob(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tuple(x.shape)}")
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(
            f"shape mismatch: {name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (bf16/fp16/fp32/fp64), got dtype {x.dtype} "
            f"(shape {tuple(x.shape)}; {ref_name} is {ref.dtype}, shape {tuple(ref.shape)})"
        )
    if x.device != ref.device:
        raise ValueError(f"device mismatch: {name} is on {x.device} but {ref_name} is on {ref.device}")


def as_mask(mask: torch.Tensor, ref_name: str, ref: torch.Tensor) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(ref.shape):
        raise ValueError(
            f"shape mismatch: mask has shape {tuple(mask.shape)} but {ref_name} has shape {tuple(ref.shape)}"
        )
    if mask.device != ref.device:
        raise ValueError(f"device mismatch: mask is on {mask.device} but {ref_name} is on {ref.device}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"mask must be bool or 0/1 numbers, got dtype {mask.dtype}")
    valid = mask != 0
    if not avoid_host_sync(mask.device):  # CPU: a read-back is free, so check now and name the value
        bad = valid & (mask != 1)  # 0.5, 2, -1 and NaN are not "in" or "out"
        if bool(bad.any()):
            raise ValueError(f"mask must hold only 0 and 1 (or be bool); it holds {mask[bad].flatten()[0].item()!r} "
                             f"at {int(bad.sum())} position(s)")
    return valid


#: metric key under which a GPU pass carries its count of mask values other than 0 and 1 to the single read-back
MASK_VIOLATIONS = "_mask_violations"


def mask_violations(mask: torch.Tensor) -> torch.Tensor | None:
    """On a GPU, the number of mask values other than 0 and 1 as a 0-d tensor (no host read); None where
    :func:`as_mask` already checked (bool masks, the CPU). :func:`raise_on_mask_violations` reads it back."""
    if not isinstance(mask, torch.Tensor) or mask.dtype == torch.bool or not avoid_host_sync(mask.device):
        return None
    return ((mask != 0) & (mask != 1)).sum()


def raise_on_mask_violations(floats: dict[str, float]) -> dict[str, float]:
    """Remove the :data:`MASK_VIOLATIONS` count from read-back metrics; raise if it is not zero."""
    bad = floats.pop(MASK_VIOLATIONS, 0.0)
    if bad:
        raise ValueError(f"mask must hold only 0 and 1 (or be bool); {int(bad)} position(s) hold other values")
    return floats


def as_advantages(advantages: torch.Tensor, ref_name: str, ref: torch.Tensor) -> torch.Tensor:
    """``[B]`` or ``[B, T]`` -> fp32 ``[B, T]`` (a broadcast view for ``[B]``)."""
    if not isinstance(advantages, torch.Tensor):
        raise TypeError(f"advantages must be a torch.Tensor, got {type(advantages).__name__}")
    b, t = ref.shape
    if advantages.dim() == 1 and advantages.shape[0] == b:
        adv = advantages.unsqueeze(-1).expand(b, t)
    elif tuple(advantages.shape) == (b, t):
        adv = advantages
    else:
        raise ValueError(
            f"shape mismatch: advantages has shape {tuple(advantages.shape)} but {ref_name} has shape "
            f"{tuple(ref.shape)}; advantages must be [B] = ({b},) or [B, T] = ({b}, {t})"
        )
    if not adv.is_floating_point():
        raise TypeError(f"advantages must be floating point, got dtype {advantages.dtype}")
    if adv.device != ref.device:
        raise ValueError(f"device mismatch: advantages is on {adv.device} but {ref_name} is on {ref.device}")
    return adv.float()


def finite_valid(mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid, nonfinite_count): ``mask`` minus tokens where any input is NaN/inf."""
    with torch.no_grad():
        total = tensors[0].detach().float()
        for x in tensors[1:]:
            total = total + x.detach().float()
        # log-probs and advantages are far from fp32 overflow, so the sum is finite iff every term is
        finite = torch.isfinite(total)
        valid = mask & finite
        nonfinite = (mask & ~finite).sum()
    return valid, nonfinite

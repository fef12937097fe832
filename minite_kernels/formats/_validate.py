"""Input validation shared by the quantizers: clear errors that name the problem and the valid choices."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minite_util.choices import did_you_mean

#: Input dtypes the quantizers accept. float64 is rounded to float32 first (the kernels compute in fp32).
VALID_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_choice(field: str, value: object, choices: Sequence[object]) -> None:
    """Raise ValueError naming ``field``, the valid ``choices`` and a close one when ``value`` is not one."""
    if value in choices:
        return
    hint = did_you_mean(value, choices) if isinstance(value, str) else ""
    raise ValueError(f"{field}={value!r} is not valid; choose one of {list(choices)}{hint}")


def check_float_tensor(x: object, what: str) -> torch.Tensor:
    """Check that ``x`` is a real floating tensor with a dtype the quantizers accept."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in VALID_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in VALID_DTYPES)
        raise TypeError(
            f"{what} expects a floating tensor; got dtype {str(x.dtype).replace('torch.', '')}. "
            f"Valid dtypes: {names}"
        )
    if x.is_meta:
        raise ValueError(f"{what}: a meta tensor has no values to quantize; materialize it first "
                         "(e.g. module.to_empty(device=...) and load the weights)")
    return x


def as_rows(x: torch.Tensor, block: int, what: str) -> torch.Tensor:
    """View ``x`` as a 2-D [M, K] fp32 tensor (1-D -> one row; >2-D -> leading dims flattened).

    Raises ValueError when K (the last dim) is zero or not a multiple of ``block``.
    """
    if x.dim() == 0:
        raise ValueError(
            f"{what} needs at least 1 dimension (quantization runs along the last dim K); got a scalar"
        )
    k = x.shape[-1]
    if k == 0 or k % block != 0:
        raise ValueError(
            f"{what}: K={k} (the last dim of shape {tuple(x.shape)}) must be a positive multiple of {block} "
            f"(one scale per {block} consecutive elements); pad K to {max(block, -(-k // block) * block)}"
        )
    return x.reshape(-1, k).to(torch.float32).contiguous()

"""16-point random Hadamard transform (RHT) used before NVFP4 quantization of wgrad operands.

Notes §1.6 (TE ``reference_nvfp4.py:_apply_rht``, ``nvfp4_tensor.py:get_rht_matrix``)::

    R = diag(s) · H16 / 4        H16 = Sylvester ±1 Hadamard matrix (H_{2n} = [[H, H], [H, -H]])
    s = [1,1,1,-1, 1,-1,-1,-1, -1,-1,-1,1, -1,1,-1,-1]         (TE's fixed sign vector, C++ mask 0xD7E8)

R is orthogonal (R Rᵀ = I) and exact in bf16 (entries ±1/4). The transform acts on the last dim in chunks
of 16: ``y[..., 16c:16c+16] = x[..., 16c:16c+16] @ R = (chunk ⊙ s) @ H16 / 4``.

TE builds R in bf16 and runs a bf16 matmul, so the output is rounded to bf16 *before* amax and quantization.
We define it device-independently: the input is rounded to bf16, multiplied by R in fp64 (every product
±x/4 is exact and a sum of 16 such terms is exact in fp64), and the exact result is rounded to fp32 and then
to bf16 — what a bf16 GEMM with an fp32 accumulator (TE, a Triton kernel) produces whenever its fp32 partial
sums are exact, i.e. unless the 16 inputs of a chunk span more than ~16 binades (on heavy-tailed data
torch's CPU bf16 matmul differed from this in 1 of 65536 outputs).
In a wgrad GEMM ``dW = (dYᵀB)(XᵀB)ᵀ`` with ``B = blockdiag(R)`` the transforms cancel.

Worked example: x = e_0 (1 then fifteen 0s) gives y = R[0] = s_0 · H16[0] / 4 = sixteen 0.25s.
"""

from __future__ import annotations

import torch

RHT_SIZE = 16
RHT_SIGNS: tuple[int, ...] = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def hadamard_matrix(n: int = RHT_SIZE, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix with ±1 entries (n a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h.to(dtype)


def rht_matrix(dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> torch.Tensor:
    """R = diag(s) · H16 / 4 (16 x 16), exact in bf16 and fp32."""
    s = torch.tensor(RHT_SIGNS, dtype=torch.float32)
    r = s[:, None] * hadamard_matrix(RHT_SIZE) / 4.0
    return r.to(dtype=dtype, device=device)


_CACHE: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _cached_rht_matrix(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``rht_matrix(dtype, device)`` built once per (dtype, device): no CPU build and host-to-device copy
    (a synchronization on CUDA) per call. Internal and never written to; ``rht_matrix`` returns a fresh one."""
    key = (dtype, device)
    r = _CACHE.get(key)
    if r is None:
        r = _CACHE[key] = rht_matrix(dtype, device)
    return r


def apply_rht(x: torch.Tensor) -> torch.Tensor:
    """Apply the RHT along the last dim (a multiple of 16) in 16-chunks; returns bf16 (see module doc)."""
    k = x.shape[-1]
    if k % RHT_SIZE:
        raise ValueError(f"RHT needs the last dim K={k} to be a multiple of {RHT_SIZE}")
    xb = x.to(torch.bfloat16).to(torch.float64).reshape(*x.shape[:-1], k // RHT_SIZE, RHT_SIZE)
    y = torch.matmul(xb, _cached_rht_matrix(torch.float64, x.device))
    return y.reshape(x.shape).to(torch.float32).to(torch.bfloat16)


def inverse_rht(y: torch.Tensor) -> torch.Tensor:
    """Undo the RHT along the last dim in fp32 (``y @ Rᵀ`` per 16-chunk); for diagnostics and tests."""
    k = y.shape[-1]
    if k % RHT_SIZE:
        raise ValueError(f"RHT needs the last dim K={k} to be a multiple of {RHT_SIZE}")
    yc = y.to(torch.float32).reshape(*y.shape[:-1], k // RHT_SIZE, RHT_SIZE)
    return torch.matmul(yc, _cached_rht_matrix(torch.float32, y.device).T).reshape(y.shape)

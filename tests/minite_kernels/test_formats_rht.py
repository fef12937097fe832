"""16-point RHT (notes §1.6): R is as specified and orthogonal; bf16 rounding; amax after the transform."""

from __future__ import annotations

import math

import torch

from minite_kernels.formats import (
    RHT_SIGNS,
    apply_rht,
    hadamard_matrix,
    inverse_rht,
    quantize_nvfp4,
    rht_matrix,
)


def test_sign_vector_is_te_mask_0xd7e8():
    # TE's C++ mask 0xD7E8 read LSB first, bit set = -1
    mask = 0xD7E8
    assert list(RHT_SIGNS) == [-1 if (mask >> i) & 1 else 1 for i in range(16)]
    assert list(RHT_SIGNS) == [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]


def test_hadamard_is_sylvester():
    h = hadamard_matrix(16)
    # independent closed form of the Sylvester matrix: H[i, j] = (-1)^popcount(i & j)
    want = torch.tensor(
        [[(-1) ** (i & j).bit_count() for j in range(16)] for i in range(16)], dtype=torch.float32
    )
    assert torch.equal(h, want)
    assert torch.equal(h @ h.T, 16 * torch.eye(16))


def test_r_is_diag_s_times_h_over_4_exact_in_bf16_and_orthogonal():
    r = rht_matrix(torch.bfloat16)
    assert r.dtype == torch.bfloat16 and r.shape == (16, 16)
    s = torch.tensor(RHT_SIGNS, dtype=torch.float32)
    assert torch.equal(r.float(), torch.diag(s) @ hadamard_matrix(16) / 4)
    rf = r.float()
    assert torch.equal(rf @ rf.T, torch.eye(16)) and torch.equal(rf.T @ rf, torch.eye(16))


def test_apply_rht_is_a_chunked_bf16_gemm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=g) * 3
    y = apply_rht(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    # heavy-tailed data too (fp32 accumulation would not always be exact here)
    heavy = torch.randn(5, 64, generator=g) * torch.exp(4 * torch.randn(5, 64, generator=g))
    for inp in (x, heavy):
        # independent reference: per output, the exact sum (math.fsum) of x_i * s_i * H[i, j] / 4 -> fp32 -> bf16
        xb = inp.bfloat16().double().tolist()
        ref = [
            [
                math.fsum(
                    xb[r][16 * c + i] * RHT_SIGNS[i] * (-1) ** (i & j).bit_count() / 4 for i in range(16)
                )
                for c in range(4)
                for j in range(16)
            ]
            for r in range(5)
        ]
        assert torch.equal(apply_rht(inp), torch.tensor(ref, dtype=torch.float64).float().bfloat16())
    # chunk @ R == (chunk * s) @ H / 4
    alt = (
        (x.bfloat16().double().view(5, 4, 16) * torch.tensor(RHT_SIGNS, dtype=torch.float64))
        @ hadamard_matrix(16).double()
        / 4
    )
    assert torch.equal(y, alt.view(5, 64).bfloat16())
    # e_0 -> first row of R: sixteen 0.25s
    e0 = torch.zeros(1, 16)
    e0[0, 0] = 1
    assert torch.equal(apply_rht(e0).float(), torch.full((1, 16), 0.25))
    # inverse within bf16 rounding of the output
    assert torch.allclose(inverse_rht(y), x.bfloat16().float(), rtol=0, atol=0.02 * x.abs().max().item())


def test_quantize_with_rht_takes_amax_after_the_transform():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 64, generator=g)
    x[3, 7] = 40.0  # an outlier that the RHT spreads over its 16-chunk
    q = quantize_nvfp4(x, rht=True)
    y = apply_rht(x).float()
    assert q.rht and q.amax.item() == y.abs().max().item() < 40.0
    plain = quantize_nvfp4(y)
    assert torch.equal(q.data, plain.data) and torch.equal(
        q.scales.view(torch.uint8), plain.scales.view(torch.uint8)
    )
    # dequantize() is in the transformed domain; inverse_rht brings it back close to x
    back = inverse_rht(q.dequantize())
    assert (back - x).norm() / x.norm() < 0.2
    # per-token amax is also taken after the transform
    pt = quantize_nvfp4(x, scaling="per_token", rht=True)
    assert torch.equal(pt.amax, y.abs().amax(dim=1))

"""StrictMode: reductions in fp64, rounded once, so results do not depend on batch shape."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minite_kernels.strict import StrictMode


def test_worked_example_sum_is_order_free():
    x = torch.tensor([1e8, 1.0, -1e8])
    with StrictMode():
        assert float(x.sum()) == 1.0 and float(torch.sum(x.flip(0))) == 1.0


def test_linear_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 300, generator=g)
    w = torch.randn(64, 300, generator=g)
    with StrictMode():
        full = F.linear(x, w)
        rows = torch.cat([F.linear(x[i:i + 1], w) for i in range(37)])
        mm = x @ w.t()
    assert torch.equal(full, rows) and torch.equal(full, mm)
    assert full.dtype == torch.float32
    assert torch.equal(full, (x.double() @ w.double().t()).float())


def test_attention_decode_row_equals_its_row_in_the_full_causal_pass():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(3))
    with StrictMode():
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        last = F.scaled_dot_product_attention(q[:, :, -1:], k, v)
    assert torch.equal(full[:, :, -1:], last)


def test_dtype_argument_and_non_float_ops():
    x = torch.randn(4, 8).to(torch.bfloat16)
    with StrictMode():
        p = F.softmax(x, dim=-1, dtype=torch.float32)
        n = torch.tensor([1, 2, 3]).sum()
        y = torch.mean(x, dim=-1)
    assert p.dtype == torch.float32 and n.dtype == torch.int64 and int(n) == 6
    assert y.dtype == torch.bfloat16
    assert torch.equal(p, torch.softmax(x.double(), dim=-1).float())

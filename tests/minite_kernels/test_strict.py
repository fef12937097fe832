"""StrictMode: reductions in fp64 rounded once (CPU), or batch-invariant kernels (CUDA; on CPU under Triton's
interpreter), so results do not depend on batch shape."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from minite_test_support import IN_INTERPRETER, interp_only

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


# ------------------------------------------------------------------------------- the kernels (CUDA's way)


def _padded_batch(dev, dtype=torch.float32, d=16, lengths=(9, 5, 12)):
    """Left-padded q/k/v [B, H, L, D] with HF's boolean causal+padding mask, and each sequence alone."""
    g = torch.Generator().manual_seed(3)
    L, B = max(lengths), len(lengths)
    seqs = [tuple(torch.randn(1, 2, n, d, generator=g).to(dev, dtype) for _ in range(3)) for n in lengths]
    qkv = [torch.zeros(B, 2, L, d, device=dev, dtype=dtype) for _ in range(3)]
    keep = torch.zeros(B, L, dtype=torch.bool, device=dev)
    for b, (n, s) in enumerate(zip(lengths, seqs)):
        for t, x in zip(qkv, s):
            t[b, :, L - n:] = x[0]
        keep[b, L - n:] = True
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    mask = causal[None, None] & keep[:, None, None, :]
    return seqs, qkv, mask


def _check_mode_kernels(dev):
    from minite_kernels.strict import decode_attention

    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 300, generator=g).to(dev)
    w = torch.randn(64, 300, generator=g).to(dev)
    with StrictMode(kernels="triton"):
        full = F.linear(x, w)
        rows = torch.cat([F.linear(x[i:i + 1], w) for i in range(0, 37, 6)])
        mm = x @ w.t()
        ms = x.pow(2).mean(-1, keepdim=True)
        lsm = torch.log_softmax(x, dim=-1)
    assert torch.equal(full[::6], rows) and torch.equal(full, mm)
    assert ms.shape == (37, 1) and torch.allclose(ms, x.pow(2).mean(-1, keepdim=True), rtol=1e-6)
    assert torch.allclose(lsm, torch.log_softmax(x, -1), atol=1e-5)
    # attention: each left-padded sequence's rows equal the sequence alone; a decode step equals its row
    seqs, (q, k, v), mask = _padded_batch(dev)
    L = q.shape[2]
    with StrictMode(kernels="triton"):
        batched = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        for b, (sq, sk, sv) in enumerate(seqs):
            n = sq.shape[2]
            alone = F.scaled_dot_product_attention(sq, sk, sv, is_causal=True)
            assert torch.equal(batched[b:b + 1, :, L - n:], alone), b
        start = (~mask[:, 0, -1]).sum(-1)
        last = decode_attention(q[:, :, -1:].transpose(1, 2).reshape(len(seqs), 2, 1, -1), k, v, start,
                                torch.tensor([L], device=dev), q.shape[-1] ** -0.5)
    assert torch.equal(last.view(len(seqs), 2, -1), batched[:, :, -1])
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(batched[mask[:, 0].any(-1)[:, None].expand(-1, 2, -1)],
                          ref[mask[:, 0].any(-1)[:, None].expand(-1, 2, -1)], atol=1e-5)
    # autograd: the strict forward carries PyTorch's gradient
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    with StrictMode(kernels="triton"):
        y = F.linear(xg, wg).logsumexp(-1).sum()
    y.backward()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.linear(xr, wr).logsumexp(-1).sum().backward()
    assert torch.allclose(xg.grad, xr.grad, atol=1e-4) and torch.allclose(wg.grad, wr.grad, atol=1e-4)


@interp_only
def test_interp_mode_runs_the_batch_invariant_kernels():
    _check_mode_kernels("cpu")


def test_strict_mode_kernels_under_interpreter(run_interp_tests):
    run_interp_tests(__file__)


@pytest.mark.gpu
def test_gpu_mode_runs_the_batch_invariant_kernels():
    _check_mode_kernels("cuda")


def test_key_ranges_of_causal_padding_and_broken_masks():
    from minite_kernels.strict import key_ranges

    _, _, mask = _padded_batch("cpu", lengths=(3, 5))
    lo, hi = key_ranges(mask, False, 5, 5, "cpu")
    assert lo.shape == hi.shape == (2, 1, 5)
    # sequence 0 (3 real tokens after 2 pads): pad queries see nothing (0, 0); query t sees [2, t + 1)
    assert lo[0, 0].tolist() == [0, 0, 2, 2, 2] and hi[0, 0].tolist() == [0, 0, 3, 4, 5]
    assert lo[1, 0].tolist() == [0] * 5 and hi[1, 0].tolist() == [1, 2, 3, 4, 5]
    lo, hi = key_ranges(None, True, 3, 3, "cpu")
    assert lo.flatten().tolist() == [0, 0, 0] and hi.flatten().tolist() == [1, 2, 3]
    additive = torch.zeros(5, 5).masked_fill(~mask[1, 0], float("-inf"))
    assert [t.flatten().tolist() for t in key_ranges(additive, False, 5, 5, "cpu")] == [[0] * 5, [1, 2, 3, 4, 5]]
    gap = mask.clone()
    gap[1, 0, 4, 2] = False
    with pytest.raises(ValueError, match="one contiguous run"):
        key_ranges(gap, False, 5, 5, "cpu")
    with pytest.raises(ValueError, match="adds other biases"):
        key_ranges(torch.full((5, 5), 0.5), False, 5, 5, "cpu")


def test_kernels_choice_is_validated():
    with pytest.raises(ValueError, match="valid: auto, fp64, triton"):
        StrictMode(kernels="fast")
    if not IN_INTERPRETER:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), StrictMode(kernels="triton"):
            F.linear(torch.zeros(1, 4), torch.zeros(2, 4))

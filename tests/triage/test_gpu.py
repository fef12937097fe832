"""CUDA checks (run on the GPU machine: ``pytest -m gpu tests/triage``); no verl or hypothesis needed."""

from __future__ import annotations

import pytest
import torch

from triage import TriageConfig, mismatch_metrics, triage_policy_loss
from triage.reference import triage_policy_loss_reference

pytestmark = pytest.mark.gpu


def _inputs(device, dtype, b=16, t=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 4
    logp = old + 0.3 * torch.randn(b, t, generator=g)
    sampler = old + 1.5 * torch.randn(b, t, generator=g) + 2.0 * torch.rand(b, 1, generator=g)
    adv = torch.randn(b, generator=g)
    mask = torch.arange(t).unsqueeze(0) < torch.randint(1, t + 1, (b, 1), generator=g)
    return [x.to(device) for x in (logp.to(dtype), old.to(dtype), sampler.to(dtype))] + [
        adv.to(device),
        mask.to(device),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_fused_matches_cpu_reference(dtype):
    logp, old, sampler, adv, mask = _inputs("cuda", dtype)
    lg = logp.clone().requires_grad_()
    loss, metrics = triage_policy_loss(lg, old, sampler, adv, mask)
    loss.backward()
    lc = logp.cpu().clone().requires_grad_()
    ref, ref_m = triage_policy_loss_reference(lc, old.cpu(), sampler.cpu(), adv.cpu(), mask.cpu())
    ref.backward()
    assert loss.device.type == "cuda" and loss.dtype == torch.float32
    torch.testing.assert_close(loss.cpu(), ref, rtol=1e-5, atol=1e-6)
    rtol = 8e-3 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(lg.grad.cpu().float(), lc.grad.float(), rtol=rtol, atol=1e-7)
    for k, v in ref_m.items():
        assert metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-5), k


def test_cuda_mismatch_metrics_match_cpu():
    _, old, sampler, adv, mask = _inputs("cuda", torch.float32, seed=1)
    delta = old - sampler
    got = mismatch_metrics(delta, adv, mask, TriageConfig())
    ref = mismatch_metrics(delta.cpu(), adv.cpu(), mask.cpu(), TriageConfig())
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


def _sync_warnings(fn):
    """Run ``fn`` with CUDA sync debugging on; return the synchronising calls it made (one warning each)."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return out, [w for w in caught if "synchroniz" in str(w.message)]


@pytest.mark.parametrize("cfg", [TriageConfig(), TriageConfig(diagnostics=False)])
def test_cuda_loss_synchronises_once(cfg):
    # every metric is stacked on the device and read back with one .tolist(): exactly one host sync
    logp, old, sampler, adv, mask = _inputs("cuda", torch.float32, b=8, t=4096, seed=2)
    lg = logp.clone().requires_grad_()
    triage_policy_loss(lg, old, sampler, adv, mask, cfg)  # warm-up (allocator, lazy init)
    (_loss, metrics), syncs = _sync_warnings(lambda: triage_policy_loss(lg, old, sampler, adv, mask, cfg))
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert all(isinstance(v, float) for v in metrics.values())


def test_cuda_masked_quantile_equals_torch_quantile():
    from triage.quantile import masked_quantile

    g = torch.Generator().manual_seed(4)
    for b, t, keep in ((1, 1, 1.0), (3, 77, 0.5), (64, 8192, 0.75), (16, 1000, 0.01)):
        x = (3 * torch.randn(b, t, generator=g)).cuda()
        m = (torch.rand(b, t, generator=g) < keep).cuda()
        if not m.any():
            continue
        for q in (0.0, 0.05, 0.37, 1.0):
            want = torch.quantile(x[m], q)
            (got, syncs) = _sync_warnings(lambda x=x, m=m, q=q: masked_quantile(x, m, q))
            assert syncs == [], [str(w.message) for w in syncs]
            assert torch.equal(got, want), (b, t, keep, q)
            assert torch.equal(masked_quantile(x, m, q, sync_free=False), want)

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
    for _ in range(2):  # warm-up: allocator, lazy init, and the CUDA graph's capture (a bucket's second call)
        triage_policy_loss(lg, old, sampler, adv, mask, cfg)
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


def _loss_grad(cfg, logp, old, sampler, adv, mask):
    x = logp.clone().requires_grad_()
    loss, metrics = triage_policy_loss(x, old, sampler, adv, mask, cfg)
    loss.backward()
    return loss.detach(), x.grad, metrics


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_equals_the_eager_pass(dtype):
    """16 x 1024 is a bucket (nothing padded): the first call runs the padded pass eagerly, the second captures
    the graph, the later ones replay it, each with new values. Loss, gradient and every metric equal the eager
    pass's bit for bit."""
    import triage.fused

    triage.fused.GRAPHS.clear()
    for cfg in (TriageConfig(), TriageConfig(diagnostics=False, repair=False)):
        for seed in range(4):
            args = _inputs("cuda", dtype, b=16, t=1024, seed=seed)
            got = _loss_grad(cfg, *args)
            want = _loss_grad(TriageConfig(**{**cfg.to_dict(), "cuda_graphs": False}), *args)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (cfg, seed)
            assert got[2] == want[2], (cfg, seed)
    assert len(triage.fused.GRAPHS) == 2
    assert all(triage.fused.GRAPHS.captured(k) for k in triage.fused.GRAPHS._entries)


def test_cuda_graph_of_padded_inputs_is_their_eager_pass():
    """9 x 900 after 10 x 1000 (one bucket, 10 x 1024): the replayed pass equals the eager pass of the
    zero-padded inputs bit for bit, and the loss the unpadded eager loss up to the order of fp32 sums."""
    import triage.fused
    from triage.fused import fused_terms

    triage.fused.GRAPHS.clear()
    cfg, eager = TriageConfig(), TriageConfig(cuda_graphs=False)
    for b, t, seed in ((10, 1000, 5), (10, 1000, 6), (9, 900, 7)):  # the second call captures
        logp, old, sampler, adv, mask = _inputs("cuda", torch.float32, b=b, t=t, seed=seed)
        got = fused_terms(logp, old, adv, mask, cfg, sampler_logp=sampler)
    assert triage.fused.GRAPHS.captured(next(iter(triage.fused.GRAPHS._entries)))

    def pad(x):
        out = x.new_zeros((10, 1024) if x.dim() == 2 else (10,))
        out[tuple(slice(0, n) for n in x.shape)] = x
        return out

    lp, od, sp, ad, mk = (pad(x) for x in (logp, old, sampler, adv, mask))
    want = fused_terms(lp, od, ad, mk, eager, sampler_logp=sp)
    for name in ("k_adv", "u", "r_active", "valid", "repair_member"):
        assert torch.equal(getattr(got, name), getattr(want, name)[:9, :900]), name
    assert torch.equal(got.gate_sum, want.gate_sum[:9]) and torch.equal(got.phi_sum, want.phi_sum)
    for k in got.metrics:
        assert torch.equal(got.metrics[k], want.metrics[k]), k
    loss, grad, metrics = _loss_grad(cfg, logp, old, sampler, adv, mask)
    loss_e, grad_e, metrics_e = _loss_grad(eager, logp, old, sampler, adv, mask)
    torch.testing.assert_close(loss, loss_e, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, grad_e, rtol=1e-6, atol=1e-9)
    for k in metrics:
        assert metrics[k] == pytest.approx(metrics_e[k], rel=1e-5, abs=1e-7), k


def test_cuda_graph_losses_kept_for_one_backward():
    """Two micro-batches of one bucket, both forward before one backward: the second replay overwrites the
    graph's buffers, so each loss must have kept its own gradient. Both gradients equal the eager ones."""
    import triage.fused

    triage.fused.GRAPHS.clear()
    first = _inputs("cuda", torch.float32, b=16, t=1024, seed=8)
    for _ in range(2):  # eager-padded call, then the capture
        _loss_grad(TriageConfig(), *first)
    second = _inputs("cuda", torch.float32, b=16, t=1024, seed=9)
    grads = []
    for cfg in (TriageConfig(), TriageConfig(cuda_graphs=False)):
        xs = [a[0].clone().requires_grad_() for a in (first, second)]
        losses = [triage_policy_loss(x, *a[1:], cfg)[0] for x, a in zip(xs, (first, second))]
        (losses[0] + losses[1]).backward()
        grads.append([x.grad for x in xs])
    assert triage.fused.GRAPHS.captured(next(iter(triage.fused.GRAPHS._entries)))
    for got, want in zip(*grads):
        assert torch.equal(got, want)
    assert not torch.equal(grads[0][0], grads[0][1])

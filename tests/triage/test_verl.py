from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("verl")

from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
from verl.workers.config import ActorConfig

import triage.verl as tv
from triage import TriageConfig, triage_policy_loss
from triage.config import CLIP_RATIO_C, CLIP_RATIO_HIGH, CLIP_RATIO_LOW


def actor_config(mode="seq-mean-token-mean", triage=None, **kw):
    """A verl ActorConfig with TriageConfig's clip ratios unless given (verl's own default is 0.2 above)."""
    kw = {"clip_ratio_low": CLIP_RATIO_LOW, "clip_ratio_high": CLIP_RATIO_HIGH, "clip_ratio_c": CLIP_RATIO_C, **kw}
    pl = tv.TriagePolicyLossConfig(triage=triage or {})
    return ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=mode, policy_loss=pl, **kw
    )


def batch(seed, b=6, t=300, lengths=None):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 4
    logp = old + 0.2 * torch.randn(b, t, generator=g)
    # per-row offsets in [0, 2.5): gaps delta = old - sampler centre on -offset, so gate and repair engage
    offset = 2.5 * torch.rand(b, 1, generator=g)
    sampler = old + 1.5 * torch.randn(b, t, generator=g) + offset
    adv = torch.randn(b, generator=g)
    if lengths is None:
        lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < torch.as_tensor(lengths).unsqueeze(1)
    return logp, old, sampler, adv, mask


def call(cfg, logp, old, sampler, adv, mask, weights=None):
    """Exactly the keyword call of verl.workers.utils.losses.ppo_loss."""
    fn = get_policy_loss_fn(cfg.policy_loss.get("loss_mode", "vanilla"))
    return fn(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv.unsqueeze(-1) * mask,
        response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
        rollout_is_weights=tv.make_rollout_is_weights(old, sampler, mask) if weights is None else weights,
    )


def test_registered_and_weights_match_verl_raw_ratio():
    assert get_policy_loss_fn("triage") is tv.compute_policy_loss_triage
    _, old, sampler, _, mask = batch(0)
    ref, _ = compute_rollout_correction_weights(
        old - sampler, mask, rollout_is="token", rollout_is_threshold=tv.RAW_RATIO_THRESHOLD
    )
    assert torch.equal(tv.make_rollout_is_weights(old, sampler, mask), ref)
    # delta = log(w) is recovered up to fp32 rounding (|delta| <= 20)
    rec = tv.sampler_logp_from_weights(old, ref, mask)
    torch.testing.assert_close(rec[mask], sampler[mask], rtol=0, atol=5e-6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_gate_repair_off_equals_verl_vanilla_times_tis(mode):
    logp0, old, sampler, adv, mask = batch(1)
    cfg = actor_config(mode, {"gate": False, "repair": False})
    w_tis, _ = compute_rollout_correction_weights(
        old - sampler, mask, rollout_is="token", rollout_is_threshold=2.0
    )
    lv = logp0.clone().requires_grad_()
    ref, ref_m = compute_policy_loss_vanilla(old, lv, adv.unsqueeze(-1) * mask, mask, mode, cfg, w_tis)
    ref.backward()
    lt = logp0.clone().requires_grad_()
    ours, m = call(cfg, lt, old, sampler, adv, mask)
    ours.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lt.grad, lv.grad, rtol=1e-5, atol=1e-8)
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m[k] == pytest.approx(ref_m[k], rel=1e-5, abs=1e-7)


def test_seq_mean_token_mean_equals_spec_policy_term():
    # gate on, repair off: agg_loss with c_i = sum m / sum m g reproduces TRIAGE.md §3 exactly
    logp0, old, sampler, adv, mask = batch(2)
    l1 = logp0.clone().requires_grad_()
    ours, m = call(actor_config(triage={"repair": False}), l1, old, sampler, adv, mask)
    ours.backward()
    l2 = logp0.clone().requires_grad_()
    spec, ms = triage_policy_loss(l2, old, sampler, adv, mask, TriageConfig(repair=False))
    spec.backward()
    assert ms["triage/gated_token_frac"] > 0  # the gate is really active in this batch
    torch.testing.assert_close(ours, spec, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(l1.grad, l2.grad, rtol=1e-4, atol=1e-8)
    assert m["mismatch/gap_mean"] == pytest.approx(ms["mismatch/gap_mean"], rel=1e-4)


def test_token_mean_applies_response_factor():
    # token-mean: L = sum_{i,t} m c_i g w l / N_tok, every response keeps total token weight sum_t m
    logp, old, sampler, adv, mask = batch(3)
    cfg = actor_config("token-mean", {"repair": False})
    ours, _ = call(cfg, logp, old, sampler, adv, mask)
    from triage.reference import compute_terms

    terms = compute_terms(logp, old, sampler, adv, mask, TriageConfig(repair=False))
    c = terms.row_tokens / terms.gate_sum.clamp(min=1e-30)
    expected = (terms.l * terms.weight * c.unsqueeze(-1)).sum() / mask.sum()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    # per-response total token weight preserved: sum_t m c_i g = sum_t m
    from triage.gate import compute_gate

    delta = torch.where(mask, old - sampler, 0.0)
    gate = compute_gate(
        delta, torch.where(mask, adv.unsqueeze(-1).expand_as(mask), 0.0), mask, TriageConfig()
    )
    assert (gate.g[mask] < 1).any()
    torch.testing.assert_close((gate.g * mask * c.unsqueeze(-1)).sum(-1), mask.sum(-1).float())


def test_repair_normaliser_in_verl():
    # 1 response, A = +1, 256 valid tokens, d = -1.5 everywhere -> 2 active 128-token segments, phi = sqrt2 - 1
    t = 256
    old = torch.full((1, t), -2.0)
    sampler = old + 1.5
    logp = old.clone().requires_grad_()
    mask = torch.ones(1, t, dtype=torch.bool)
    adv = torch.ones(1)
    phi = math.sqrt(2) - 1
    off, _ = call(actor_config(triage={"repair": False}), logp, old, sampler, adv, mask)
    # no global info: normaliser = local tokens / 128 = 2 = N_seg -> same as TRIAGE.md §4
    on, m = call(actor_config(), logp, old, sampler, adv, mask)
    assert (on - off).item() == pytest.approx(0.1 * 2 * phi / 2, rel=1e-5)
    assert m["triage/repair_loss"] == pytest.approx(0.1 * phi, rel=1e-5)
    # global mini-batch of 1024 tokens on 2 DP ranks: 0.1 * dp * sum phi / (1024 / 128)
    cfg = actor_config()
    cfg.global_batch_info.update(
        dp_size=2, batch_num_tokens=1024, global_batch_size=4, loss_scale_factor=None
    )
    cfg_off = actor_config(triage={"repair": False})
    cfg_off.global_batch_info.update(cfg.global_batch_info)
    on_g, _ = call(cfg, logp, old, sampler, adv, mask)
    off_g, _ = call(cfg_off, logp, old, sampler, adv, mask)
    assert (on_g - off_g).item() == pytest.approx(0.1 * 2 * (2 * phi) / 8, rel=1e-5)
    cfg_bad = actor_config()
    cfg_bad.global_batch_info.update(dp_size=2, global_batch_size=4)  # agg_loss is satisfied, repair is not
    with pytest.raises(ValueError, match="batch_num_tokens"):
        call(cfg_bad, logp, old, sampler, adv, mask)


def test_missing_weights_and_bad_config_errors():
    logp, old, sampler, adv, mask = batch(4, b=2, t=10)
    fn = get_policy_loss_fn("triage")
    with pytest.raises(ValueError, match="rollout_is=token"):
        fn(
            old_log_prob=old,
            log_prob=logp,
            advantages=adv.unsqueeze(-1) * mask,
            response_mask=mask,
            loss_agg_mode="seq-mean-token-mean",
            config=actor_config(),
            rollout_is_weights=None,
        )
    with pytest.raises(ValueError, match=r"rollout_is_weights has shape \(2, 9\)"):
        call(actor_config(), logp, old, sampler, adv, mask, weights=torch.ones(2, 9))
    with pytest.raises(ValueError, match="did you mean 'repair_coef'"):
        tv.TriagePolicyLossConfig(triage={"repair_coeff": 1.0})
    with pytest.warns(UserWarning, match="loss_mode=triage"):
        tv.TriagePolicyLossConfig(loss_mode="vanilla")


def test_zero_weight_is_masked_and_counted():
    logp, old, sampler, adv, mask = batch(5, b=2, t=10, lengths=[10, 10])
    w = tv.make_rollout_is_weights(old, sampler, mask)
    w[0, 3] = 0.0  # e.g. rejected by an IcePop band: no gap can be recovered
    loss, m = call(actor_config(), logp.requires_grad_(), old, sampler, adv, mask, weights=w)
    loss.backward()
    assert m["triage/nonfinite_tokens"] == 1.0
    assert logp.grad[0, 3] == 0 and torch.isfinite(logp.grad).all()


def test_actor_clip_ratios_reach_the_loss():
    cfg = actor_config(clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=5.0)
    t = tv.triage_config_from_actor(cfg)
    assert (t.clip_ratio_low, t.clip_ratio_high, t.clip_ratio_c) == (0.1, 0.28, 5.0)
    # a plain PolicyLossConfig gives TriageConfig defaults
    plain = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    assert tv.triage_config_from_actor(plain).repair_coef == TriageConfig().repair_coef


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.lists(st.integers(1, 3), min_size=1, max_size=4),
    st.sampled_from(["seq-mean-token-mean", "token-mean"]),
)
def test_property_micro_batch_split_gives_same_gradient(seed, sizes, mode):
    b = sum(sizes)
    logp0, old, sampler, adv, mask = batch(seed, b=b, t=200)
    assume(bool(mask.any()))  # a global batch without tokens: verl's token-mean is 0 / 0 (NaN), nothing to split
    info = {
        "dp_size": 1,
        "batch_num_tokens": int(mask.sum()),
        "global_batch_size": b,
        "loss_scale_factor": None,
    }
    cfg = actor_config(mode)
    cfg.global_batch_info.update(info)
    full = logp0.clone().requires_grad_()
    loss_full, _ = call(cfg, full, old, sampler, adv, mask)
    loss_full.backward()
    split = logp0.clone().requires_grad_()
    total = 0.0
    start = 0
    for n in sizes:  # micro-batches, gradients accumulate as in verl's FSDP engine
        sl = slice(start, start + n)
        part, _ = call(cfg, split[sl], old[sl], sampler[sl], adv[sl], mask[sl])
        part.backward()
        total += part.item()
        start += n
    torch.testing.assert_close(split.grad, full.grad, rtol=1e-5, atol=1e-8)
    assert total == pytest.approx(loss_full.item(), rel=1e-5, abs=1e-7)
    # two data-parallel ranks: each scales by dp_size, FSDP averages the gradients
    half = b // 2
    if 0 < half < b:
        dp = logp0.clone().requires_grad_()
        cfg_dp = actor_config(mode)
        cfg_dp.global_batch_info.update(info, dp_size=2)
        for sl in (slice(0, half), slice(half, b)):
            part, _ = call(cfg_dp, dp[sl], old[sl], sampler[sl], adv[sl], mask[sl])
            (part / 2).backward()
        torch.testing.assert_close(dp.grad, full.grad, rtol=1e-5, atol=1e-8)


def test_hydra_config_reaches_the_loss():
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    # clip_ratio_high is TriageConfig's default (0.28) and still reaches verl, whose actor default is 0.2
    overrides = tv.verl_overrides({"gate": False, "repair_coef": 0.05})
    overrides.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as ActorRolloutRefWorker.init_model does
    assert isinstance(actor, ActorConfig) and isinstance(actor.policy_loss, tv.TriagePolicyLossConfig)
    assert actor.policy_loss.loss_mode == "triage" and actor.loss_agg_mode == "seq-mean-token-mean"
    t = tv.triage_config_from_actor(actor)
    assert (t.gate, t.repair_coef, t.clip_ratio_high) == (False, 0.05, 0.28)
    rc = cfg.algorithm.rollout_correction
    assert rc.rollout_is == "token" and float(rc.rollout_is_threshold) > math.exp(20)
    assert rc.rollout_is_batch_normalize is False
    # the settings change the loss: gate off equals an explicit gate-off config
    logp, old, sampler, adv, mask = batch(6)
    a, _ = call(actor, logp, old, sampler, adv, mask)
    b_, _ = call(
        actor_config(triage={"gate": False, "repair_coef": 0.05}, clip_ratio_high=0.28),
        logp,
        old,
        sampler,
        adv,
        mask,
    )
    c, _ = call(actor_config(clip_ratio_high=0.28), logp, old, sampler, adv, mask)
    torch.testing.assert_close(a, b_)
    assert not torch.allclose(a, c)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    e.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=e,
        cwd="/",
        timeout=300,
        check=False,
    )


def test_entry_point_and_external_lib_register_in_fresh_processes():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="verl.plugins") if ep.name == "triage"]
    assert eps and eps[0].value == "triage.verl", "project not installed: run `pip install -e .`"
    r = _run(
        """
        import sys, verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        assert "triage.verl" in sys.modules
        print(get_policy_loss_fn("triage").__name__)
        # external_lib route (HFModelConfig.__post_init__ calls import_external_libs)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("compute_policy_loss_triage")
    r = _run(
        """
        import verl
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
        assert "triage" not in POLICY_LOSS_REGISTRY  # plugins disabled
        from verl.utils.import_utils import import_external_libs
        import_external_libs("triage.verl")
        print(get_policy_loss_fn("triage").__name__)
        """,
        VERL_USE_EXTERNAL_PLUGINS="none",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("compute_policy_loss_triage")


def test_through_verl_ppo_loss_with_a_tensordict():
    # verl.workers.utils.losses.ppo_loss: unpads the model's flat log-probs, fills global_batch_info,
    # selects the batch fields and calls get_policy_loss_fn("triage") -- the real worker code path
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    b, t, p = 3, 300, 2
    lens = torch.tensor([300, 120, 7])
    logp0, old, sampler, adv, mask = batch(7, b=b, t=t, lengths=lens)
    old, logp0, sampler = old * mask, logp0 * mask, sampler * mask
    adv_bt = adv.unsqueeze(-1) * mask
    w = tv.make_rollout_is_weights(old, sampler, mask)
    data = TensorDict(
        {
            "prompts": torch.ones(b, p, dtype=torch.long),
            "responses": torch.ones(b, t, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.long), mask.long()], 1),
            "response_mask": mask.long(),
            "old_log_probs": old,
            "advantages": adv_bt,
            "rollout_is_weights": w,
        },
        batch_size=[b],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=b)
    lp = logp0.clone().requires_grad_()
    # flat model output: the log-prob of response token j sits at sequence position p - 1 + j
    flat = torch.cat([torch.cat([torch.zeros(p - 1), lp[i, : lens[i]], torch.zeros(1)]) for i in range(b)])
    loss, metrics = ppo_loss(actor_config(), {"log_probs": flat}, data)
    loss.backward()
    assert "mismatch/gap_q05" in metrics and "actor/pg_loss" in metrics
    direct = logp0.clone().requires_grad_()
    cfg = actor_config()
    cfg.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=b, loss_scale_factor=None
    )
    ref, _ = call(cfg, direct, old, sampler, adv, mask, weights=w)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(lp.grad, direct.grad)
    assert lp.grad.abs().sum() > 0


@pytest.mark.parametrize("num_tokens", [None, 2000, "tensor"])
def test_verl_loss_reads_back_once_on_the_gpu_path(num_tokens, force_sync_free, read_backs, monkeypatch):
    # what a GPU trainer runs: no host read-back before the single metrics .tolist() (agg_loss included);
    # a host batch_num_tokens must not be copied to the device (that copy waits for the stream on CUDA)
    logp, old, sampler, adv, mask = batch(7, b=4, t=200)
    cfg = actor_config("token-mean")
    if num_tokens is not None:
        n = mask.sum() if num_tokens == "tensor" else num_tokens
        cfg.global_batch_info.update(
            dp_size=1, batch_num_tokens=n, global_batch_size=4, loss_scale_factor=None
        )
    weights = tv.make_rollout_is_weights(old, sampler, mask)
    lg = logp.clone().requires_grad_()
    as_tensor = torch.as_tensor
    copies = []
    monkeypatch.setattr(torch, "as_tensor", lambda *a, **k: copies.append(a) or as_tensor(*a, **k))
    counter = read_backs()
    loss, metrics = call(cfg, lg, old, sampler, adv, mask, weights)
    loss.backward()
    calls = list(counter.calls)
    monkeypatch.undo()
    assert calls == ["tolist"], calls
    assert copies == []
    assert "triage/repair_loss" in metrics and math.isfinite(loss.item())


def test_sampler_log_probs_route_equals_the_weights_route_without_the_round_trip():
    """A local trainer hands the sampler's log-probs over directly: the loss and gradient equal verl's
    rollout_is_weights route up to the fp32 rounding of exp/log; both at once, or neither, is an error."""
    logp0, old, sampler, adv, mask = batch(3)
    cfg = actor_config()
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=6,
                                 loss_scale_factor=None)
    a, b = logp0.clone().requires_grad_(), logp0.clone().requires_grad_()
    la, ma = call(cfg, a, old, sampler, adv, mask)
    lb, mb = tv.compute_policy_loss_triage(old_log_prob=old, log_prob=b, advantages=adv.unsqueeze(-1) * mask,
                                           response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg,
                                           sampler_log_prob=sampler)
    la.backward()
    lb.backward()
    assert mb["triage/gated_token_frac"] > 0  # the gate is engaged, so the comparison covers it
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-7)
    assert mb.keys() == ma.keys()
    with pytest.raises(ValueError, match="not both"):
        tv.compute_policy_loss_triage(old_log_prob=old, log_prob=b, advantages=adv.unsqueeze(-1) * mask,
                                      response_mask=mask, config=cfg, sampler_log_prob=sampler,
                                      rollout_is_weights=tv.make_rollout_is_weights(old, sampler, mask))
    with pytest.raises(ValueError, match="rollout_is_weights"):
        tv.compute_policy_loss_triage(old_log_prob=old, log_prob=b, advantages=adv, response_mask=mask, config=cfg)


@pytest.fixture
def padded_route(monkeypatch):
    """Route the fused pass through its CUDA-graph path's padding on the CPU (the capture itself needs CUDA)."""
    import triage.fused
    from triage.graphs import PaddedGraphs

    monkeypatch.setattr(triage.fused, "usable", lambda device: True)
    monkeypatch.setattr(triage.fused, "GRAPHS", PaddedGraphs())


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("route", ["weights", "sampler"])
def test_padded_pass_through_verl_equals_the_eager_one(padded_route, force_sync_free, read_backs, mode, route):
    """Both routes of the verl loss on the padded pass (6 x 300 runs as 6 x 384), twice per bucket as a trainer
    calls it: loss and gradient as the eager pass's up to the order of fp32 sums, one read-back per call."""
    cfg, eager = actor_config(mode), actor_config(mode, triage={"cuda_graphs": False})
    for seed in (3, 4):
        logp0, old, sampler, adv, mask = batch(seed)
        extra = {"sampler_log_prob": sampler} if route == "sampler" else {
            "rollout_is_weights": tv.make_rollout_is_weights(old, sampler, mask)}
        out = []
        for c in (cfg, eager):
            lp = logp0.clone().requires_grad_()
            counter = read_backs()
            loss, metrics = tv.compute_policy_loss_triage(
                old_log_prob=old, log_prob=lp, advantages=adv.unsqueeze(-1) * mask, response_mask=mask,
                loss_agg_mode=mode, config=c, **extra)
            loss.backward()
            assert counter.calls == ["tolist"], counter.calls
            out.append((loss.detach(), lp.grad, metrics))
        (loss, grad, metrics), (loss_e, grad_e, metrics_e) = out
        torch.testing.assert_close(loss, loss_e, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(grad, grad_e, rtol=1e-6, atol=1e-9)
        assert grad.abs().sum() > 0 and metrics.keys() == metrics_e.keys()
        for k in metrics:
            assert metrics[k] == pytest.approx(metrics_e[k], rel=1e-5, abs=1e-7), k

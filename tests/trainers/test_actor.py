"""verl algorithm pieces as the trainer calls them: GRPO advantages, IS weights, micro-batch invariance."""
from __future__ import annotations

import pytest
import torch

from rollout.local import LocalSampler, SamplingParams
from trainers.config import AlgorithmConfig, RolloutCorrectionConfig
from trainers.learner import actor as A
from trainers.learner.batch import collate, micro_batches
from trainers.learner.logprobs import response_logprobs


def test_grpo_advantages_hand_computed():
    # one group of 4: scores [1, 0, 1, 1] -> mean 0.75, unbiased std 0.5 -> A = [0.5, -1.5, 0.5, 0.5]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    adv = A.grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), mask, [0, 0, 0, 0])
    expected = torch.tensor([0.5, -1.5, 0.5, 0.5]).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_rollout_is_weights_routes():
    old = torch.tensor([[0.0, -1.0]])
    sampler = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    # TIS (verl): w = min(exp(old - sampler), 2) = [min(e, 2), 1] = [2, 1]
    tis = AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    w, m = A.rollout_is_weights(tis, old, sampler, mask)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0]]))
    assert any(k.startswith("rollout_corr/") for k in m)
    # TRIAGE: no weights; the loss takes the sampler log-probs and truncates itself
    assert A.rollout_is_weights(AlgorithmConfig(loss_mode="triage"), old, sampler, mask) == (None, {})
    assert A.rollout_is_weights(AlgorithmConfig(), old, sampler, mask)[0] is None


def test_unknown_loss_mode_lists_registry():
    with pytest.raises(ValueError, match=r"'trage' is not a registered verl policy loss; did you mean 'triage'\?"):
        A.policy_loss_fn("trage")


@pytest.mark.parametrize("loss_mode,agg", [("vanilla", "token-mean"), ("triage", "seq-mean-token-mean")])
def test_micro_batching_is_invariant(tiny_model, loss_mode, agg):
    """Summed micro-batch gradients equal the one-shot mini-batch gradient (global_batch_info, as verl)."""
    model, tok = tiny_model
    s = LocalSampler(model, tok)
    prompts = [tok.encode(t) for t in ("a", "bb cc", "what is two plus two", "x y")]
    b = collate(s.generate(prompts, SamplingParams(max_new_tokens=10, seed=5)), s.pad_id)
    alg = AlgorithmConfig(loss_mode=loss_mode, loss_agg_mode=agg)
    cfg = A.build_actor_config(alg, micro_batch_size=2, mini_batch_size=4, n=2)
    fn = A.policy_loss_fn(loss_mode)
    adv = A.grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), b.response_mask, [0, 0, 1, 1])
    old = b.sampler_logp + 0.05 * torch.randn_like(b.sampler_logp) * b.response_mask  # a non-zero gap
    w, _ = A.rollout_is_weights(alg, old, b.sampler_logp, b.response_mask)
    A.set_global_batch_info(cfg, num_tokens=int(b.response_mask.sum()), num_seqs=4)
    param = model.model.layers[1].self_attn.o_proj.weight

    def grad(chunks):
        model.zero_grad(set_to_none=True)
        for rows in chunks:
            sub = b.select(rows)
            r = sub.response_mask.shape[1]
            lp, _ = response_logprobs(model, sub.input_ids, sub.attention_mask, sub.response_mask,
                                      prompt_len=sub.prompt_len, with_entropy=False)
            loss, _ = A.micro_batch_loss(cfg, fn, logp=lp, entropy=None, old_logp=old[rows, :r],
                                         advantages=adv[rows, :r], mask=b.response_mask[rows, :r],
                                         weights=None if w is None else w[rows, :r],
                                         sampler_logp=b.sampler_logp[rows, :r])
            loss.backward()
        return param.grad.clone()

    whole = grad([torch.arange(4)])
    split = grad([torch.tensor([0, 1]), torch.tensor([2, 3])])
    # uneven micro-batches from a token budget, in a permuted order, as the local engine forms them
    order = torch.tensor([2, 0, 3, 1])
    budget = micro_batches(b, order, 4, max_tokens=b.select(order[:3]).input_ids.numel())
    uneven = grad([c.index for c in budget])
    model.zero_grad(set_to_none=True)
    assert whole.abs().sum() > 0
    assert len(budget) >= 2 and {len(c) for c in budget} != {2}
    torch.testing.assert_close(split, whole, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(uneven, whole, atol=1e-6, rtol=1e-4)

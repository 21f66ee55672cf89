"""Stacks and shared semantics as the official code runs them.

The reference below is written out here, operation by operation, from the TACO repository's verl actor
(xiuyilou/TACO `verl/workers/actor/dp_actor.py`, the update loop: AR-Lopti reweighting, TACO
(`compute_taco_token_advantages` in `core_algos.py`), then one of STAPO / TAMPO / min-p, each multiplying
`response_mask`, then the policy loss `compute_policy_loss_clip_cov`, which reads that reduced, possibly soft, mask).
It calls none of the package's helpers. The package runs the same stacks through `apply_credit_stack`, the loop the
trainer runs.
"""

import math

import pytest
import torch

from trl_credit.methods import apply_credit_method, apply_credit_stack

STACKS = {
    "stapo": "ar_lopti+taco+stapo+clip_cov",
    "tampo": "ar_lopti+taco+tampo+clip_cov",
    "minp": "ar_lopti+taco+minp_support+clip_cov",
}
# Looser thresholds than the defaults, so that each dropping step drops or weighs many tokens of a small batch.
SETTINGS = {
    "ar_lopti_alpha": 0.1,
    "taco_alpha": 0.5,
    "taco_lambda": 0.9,
    "stapo_prob_threshold": 0.1,
    "stapo_entropy_quantile": 0.6,
    "tampo_prob_threshold": 0.1,
    "tampo_entropy_threshold": 2.0,
    "minp_support_min_p": 0.3,
    "minp_support_tau": 0.2,
    "minp_support_min_weight": 0.2,
}
CLIP_RANGE = (0.2, 0.28)


def fixed_batch(seed: int, groups: int = 4, group_size: int = 4, T: int = 12, V: int = 10):
    """Sequence advantages, a padded mask and the statistics of random logits, with uniformly drawn tokens (many
    improbable ones). Rewards are 0/1 per group, normalised per group as GRPO does."""
    g = torch.Generator().manual_seed(seed)
    B = groups * group_size
    logits = 2.0 * torch.randn(B, T, V, generator=g)
    old_logits = logits + 0.4 * torch.randn(B, T, V, generator=g)
    ids = torch.randint(V, (B, T), generator=g)
    logp_all = torch.log_softmax(logits, -1)
    logps = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    old_logps = torch.log_softmax(old_logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    logit_gap = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - logits.amax(-1)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = (torch.rand(groups, group_size, generator=g) < 0.4).float()
    rewards[:, 0] = 1.0  # every group has a success ...
    rewards[:, 1] = 0.0  # ... and a failure: no zero advantage
    advantages_B = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    statistics = {
        "rollout_logps": old_logps,
        "policy_logps": logps,
        "policy_entropy": entropy,
        "policy_logit_gap": logit_gap,
    }
    return advantages_B, mask, statistics


def masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def official_actor(dropper, advantages_B, mask, statistics, s, clip_cov_ratio, clip_cov_lb, clip_cov_ub):
    """The official actor's order on one micro-batch: the advantages its loss uses (`advantages * corr`) and its
    final `response_mask`."""
    old_log_prob, log_prob = statistics["rollout_logps"], statistics["policy_logps"]
    entropy = statistics["policy_entropy"]
    response_mask = mask.float()
    advantages = advantages_B.unsqueeze(1) * response_mask  # verl's GRPO advantage, zero at padding
    # AR-Lopti style advantage reweighting.
    advantages = advantages * ((1.0 - s["ar_lopti_alpha"]) + s["ar_lopti_alpha"] * old_log_prob.exp())
    # TACO: positive means this `advantages` tensor > 0.
    m = response_mask.bool()
    tail_risk = torch.where(m, -log_prob - entropy + math.log(s["taco_alpha"]), 0.0)
    weights = torch.where(
        (tail_risk > 0) & m, 1.0 - s["taco_lambda"] * (1.0 - torch.exp(-tail_risk)), torch.ones_like(advantages)
    )
    advantages = torch.where((advantages > 0) & m, weights * advantages, advantages)
    prob = log_prob.exp()
    if dropper == "stapo":
        valid = response_mask > 0
        candidate = valid & (advantages > 0)
        source = entropy[candidate] if candidate.sum() > 0 else entropy[valid]
        threshold = torch.quantile(source, s["stapo_entropy_quantile"]).item()
        spurious = candidate & (prob < s["stapo_prob_threshold"]) & (entropy < threshold)
        response_mask = response_mask * torch.where(spurious, 0.0, 1.0)
    elif dropper == "tampo":
        positive = (response_mask > 0) & (advantages > 0)
        truncate = positive & (prob <= s["tampo_prob_threshold"]) & (entropy <= s["tampo_entropy_threshold"])
        response_mask = response_mask * torch.where(truncate, 0.0, 1.0)
    else:  # min-p support weighting from the raw logit gap
        margin = statistics["policy_logit_gap"] - torch.log(torch.tensor(s["minp_support_min_p"]))
        w_min = s["minp_support_min_weight"]
        support = w_min + (1.0 - w_min) * torch.exp(torch.clamp(margin, max=0.0) / s["minp_support_tau"])
        support = torch.where(advantages > 0, support, torch.ones_like(support))
        response_mask = response_mask * support
    # Clip-Cov over the reduced (possibly soft) mask.
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - CLIP_RANGE[0], 1 + CLIP_RANGE[1])
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    candidates = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0)
    corr = torch.ones_like(advantages)
    corr[candidates] = 0.0
    return advantages * corr, response_mask, candidates, clip_num


def run_package(spec, advantages_B, mask, statistics, **clip_cov):
    settings = {k: v for k, v in SETTINGS.items() if k.split("_")[0] in spec.replace("minp_support", "minp")}
    return apply_credit_stack(spec, advantages_B, mask, statistics, clip_range=CLIP_RANGE, **settings, **clip_cov)


def differences(ours, official_advantages, official_mask, mask):
    """Largest differences of the loss weights (valid tokens) and of the advantages (tokens the loss keeps)."""
    our_weights = ours.loss_mask_BT if ours.loss_mask_BT is not None else mask.float()
    kept = official_mask > 0
    weight_gap = (our_weights - official_mask)[mask].abs().max().item()
    advantage_gap = (ours.advantages_BT - official_advantages)[kept].abs().max().item()
    return weight_gap, advantage_gap


@pytest.mark.parametrize("dropper", list(STACKS))
@pytest.mark.parametrize("seed", range(6))
def test_stack_runs_as_the_official_actor(dropper, seed):
    """Clip-Cov with bounds that make a handful of candidates and a ratio that detaches all of them, so the random
    draw cannot matter: every difference is one of means, masks or selection."""
    advantages_B, mask, statistics = fixed_batch(seed)
    clip_cov = {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.05, "clip_cov_ub": 0.6}
    official_advantages, official_mask, candidates, clip_num = official_actor(
        dropper, advantages_B, mask, statistics, SETTINGS, *clip_cov.values()
    )
    assert 0 < candidates.sum() <= clip_num
    assert (official_mask[mask] < 1).any(), "nothing dropped or weighed: the test would prove nothing"
    ours = run_package(STACKS[dropper], advantages_B, mask, statistics, **clip_cov)
    weight_gap, advantage_gap = differences(ours, official_advantages, official_mask, mask)
    assert weight_gap <= 1e-6 and advantage_gap <= 1e-6, (weight_gap, advantage_gap)


@pytest.mark.parametrize("dropper", list(STACKS))
def test_clip_cov_counts_the_reduced_soft_mask(dropper):
    """Every kept, unclipped token a candidate (bounds far apart): Clip-Cov detaches `int(ratio * sum of the loss
    weights)` of them, the official count over the reduced (for min-p, soft) mask."""
    advantages_B, mask, statistics = fixed_batch(0)
    clip_cov = {"clip_cov_ratio": 0.5, "clip_cov_lb": -1e6, "clip_cov_ub": 1e6}
    _, official_mask, candidates, clip_num = official_actor(
        dropper, advantages_B, mask, statistics, SETTINGS, *clip_cov.values()
    )
    assert clip_num < candidates.sum()
    ours = run_package(STACKS[dropper], advantages_B, mask, statistics, **clip_cov)
    before_clip_cov = run_package(STACKS[dropper].removesuffix("+clip_cov"), advantages_B, mask, statistics)
    detached = (ours.advantages_BT == 0) & (before_clip_cov.advantages_BT != 0) & (official_mask > 0)
    assert detached.sum() == clip_num and not (detached & ~candidates).any()


@pytest.mark.parametrize("name", ["taco", "stapo", "tampo", "minp_support"])
def test_positive_token_is_the_sign_of_the_incoming_token_advantage(name):
    """The official code reads the sign of the `advantages` tensor it is handed: a token whose incoming advantage is
    negative inside a positive response is not positive, and the reverse."""
    advantages_B, mask, statistics = fixed_batch(1)
    flip = torch.Generator().manual_seed(7)
    signs = torch.where(torch.rand(mask.shape, generator=flip) < 0.5, -1.0, 1.0)
    incoming = advantages_B.unsqueeze(1) * signs * mask
    settings = {k: v for k, v in SETTINGS.items() if k.startswith(name.split("_")[0])}
    flipped = apply_credit_method(name, advantages_B, mask, statistics, advantages_BT=incoming, **settings)
    # The same incoming tensor, with sequence advantages of the opposite sign: nothing may change.
    opposite = apply_credit_method(name, -advantages_B, mask, statistics, advantages_BT=incoming, **settings)
    torch.testing.assert_close(flipped.advantages_BT, opposite.advantages_BT, rtol=0, atol=0)
    if flipped.loss_mask_BT is not None:
        torch.testing.assert_close(flipped.loss_mask_BT, opposite.loss_mask_BT, rtol=0, atol=0)
    # And a token with a negative incoming advantage keeps it and its full loss weight.
    negative = mask & (incoming < 0)
    torch.testing.assert_close(flipped.advantages_BT[negative], incoming[negative], rtol=0, atol=0)
    if flipped.loss_mask_BT is not None:
        assert flipped.loss_mask_BT[negative].eq(1).all()

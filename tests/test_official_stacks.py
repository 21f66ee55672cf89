"""Stacks and shared semantics as the official code runs them.

The reference below is written out here, operation by operation, from the TACO repository's verl actor
(xiuyilou/TACO `verl/workers/actor/dp_actor.py`, the update loop: AR-Lopti reweighting, TACO
(`compute_taco_token_advantages` in `core_algos.py`), then one of STAPO / TAMPO / min-p, each multiplying
`response_mask`, then the policy loss `compute_policy_loss_clip_cov`, which reads that reduced, possibly soft, mask).
It calls none of the package's helpers. The package runs the same stacks through `apply_credit_stack`, which hands
each method the batch `CreditBatch.followed_by` makes of the previous result: `run_stack`, which the trainer runs too
(`tests/test_baselines.py` checks the trainer against it).
"""

import math

import pytest
import torch

from trl_credit.methods import CREDIT_METHODS, apply_credit_method, apply_credit_stack

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
    """The official actor's order on one micro-batch: the advantages its loss uses (after Clip-Cov's detaching) and
    its final `response_mask`."""
    old_log_prob, log_prob = statistics["rollout_logps"], statistics["policy_logps"]
    entropy = statistics["policy_entropy"]
    response_mask = mask.float()
    advantages = advantages_B.unsqueeze(1) * response_mask  # verl's GRPO advantage, zero at padding
    # AR-Lopti style advantage reweighting.
    advantages = advantages * ((1.0 - s["ar_lopti_alpha"]) + s["ar_lopti_alpha"] * old_log_prob.exp())
    # TACO: positive means this `advantages` tensor > 0.
    m = response_mask.bool()
    risk = torch.where(m, -log_prob - entropy + math.log(s["taco_alpha"]), 0.0)
    weights = torch.where(
        (risk > 0) & m, 1.0 - s["taco_lambda"] * (1.0 - torch.exp(-risk)), torch.ones_like(advantages)
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
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - CLIP_RANGE[0], 1 + CLIP_RANGE[1])
    ppo_clipped = (loss_clipped > loss_unclipped) & (response_mask > 0)
    covariance = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob, response_mask)
    )
    covariance[response_mask == 0] = -torch.inf
    covariance[ppo_clipped] = -torch.inf
    count = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    candidates = (covariance < clip_cov_ub) & (covariance > clip_cov_lb) & (response_mask > 0)
    keeps_gradient = torch.ones_like(advantages)
    keeps_gradient[candidates] = 0.0
    return advantages * keeps_gradient, response_mask, candidates, count


def own_settings(*names):
    """The entries of SETTINGS that belong to the methods `names`."""
    return {k: v for k, v in SETTINGS.items() if any(k in CREDIT_METHODS[name].argument_names for name in names)}


def run_package(spec, advantages_B, mask, statistics, **clip_cov):
    settings = own_settings(*spec.split("+"))
    return apply_credit_stack(spec, advantages_B, mask, **statistics, clip_range=CLIP_RANGE, **settings, **clip_cov)


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
    official_advantages, official_mask, candidates, count = official_actor(
        dropper, advantages_B, mask, statistics, SETTINGS, *clip_cov.values()
    )
    assert 0 < candidates.sum() <= count
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
    _, official_mask, candidates, count = official_actor(
        dropper, advantages_B, mask, statistics, SETTINGS, *clip_cov.values()
    )
    assert count < candidates.sum()
    ours = run_package(STACKS[dropper], advantages_B, mask, statistics, **clip_cov)
    before_clip_cov = run_package(STACKS[dropper].removesuffix("+clip_cov"), advantages_B, mask, statistics)
    detached = (ours.advantages_BT == 0) & (before_clip_cov.advantages_BT != 0) & (official_mask > 0)
    assert detached.sum() == count and not (detached & ~candidates).any()


@pytest.mark.parametrize("name", ["taco", "stapo", "tampo", "minp_support"])
def test_positive_token_is_the_sign_of_the_incoming_token_advantage(name):
    """The official code reads the sign of the `advantages` tensor it is handed: a token whose incoming advantage is
    negative inside a positive response is not positive, and the reverse."""
    advantages_B, mask, statistics = fixed_batch(1)
    flip = torch.Generator().manual_seed(7)
    signs = torch.where(torch.rand(mask.shape, generator=flip) < 0.5, -1.0, 1.0)
    incoming = advantages_B.unsqueeze(1) * signs * mask
    settings = own_settings(name)
    flipped = apply_credit_method(name, advantages_B, mask, **statistics, advantages_BT=incoming, **settings)
    # The same incoming tensor, with sequence advantages of the opposite sign: nothing may change.
    opposite = apply_credit_method(name, -advantages_B, mask, **statistics, advantages_BT=incoming, **settings)
    torch.testing.assert_close(flipped.advantages_BT, opposite.advantages_BT, rtol=0, atol=0)
    if flipped.loss_mask_BT is not None:
        torch.testing.assert_close(flipped.loss_mask_BT, opposite.loss_mask_BT, rtol=0, atol=0)
    # And a token with a negative incoming advantage keeps it and its full loss weight.
    negative = mask & (incoming < 0)
    torch.testing.assert_close(flipped.advantages_BT[negative], incoming[negative], rtol=0, atol=0)
    if flipped.loss_mask_BT is not None:
        assert flipped.loss_mask_BT[negative].eq(1).all()


# ------------------------------------------------------------------------------------------------ EAPO


def official_eapo(advantages_B, entropy, completion_mask, kappa, quantiles=(0.1, 0.9)):
    """The official EAPO trainer (wgcyeo/EAPO `src/trainers/eapo_trainer.py`: `_linear_quantile`,
    `normalize_token_entropies`, `eapo_token_advantages`), written out: quantiles by `kthvalue` and `torch.lerp`, the
    row shift by the maximum over every position, the mean floored at 1e-8."""

    def linear_quantile(values, q):
        rank = q * (values.numel() - 1)
        low, high = math.floor(rank), math.ceil(rank)
        lower = values.kthvalue(low + 1).values
        return lower if low == high else torch.lerp(lower, values.kthvalue(high + 1).values, rank - low)

    mask = completion_mask.bool()
    valid = entropy[mask].float()
    q_low, q_high = linear_quantile(valid, quantiles[0]), linear_quantile(valid, quantiles[1])
    normalized = ((entropy.float() - q_low) / (q_high - q_low + 1e-8)).clamp(0.0, 1.0) * mask.float()
    weights_mask = completion_mask.float()
    log_raw = kappa * torch.sign(advantages_B.float().unsqueeze(1)) * normalized
    raw = torch.exp(log_raw - log_raw.max(dim=-1, keepdim=True).values)
    mean = (raw * weights_mask).sum(-1, keepdim=True) / weights_mask.sum(-1, keepdim=True).clamp_min(1.0)
    return advantages_B.float().unsqueeze(1) * (raw / mean.clamp_min(1e-8) * weights_mask)


def eapo_batch(seed, padded=True, B=32, T=40):
    """Rollout entropies, a completion mask and a tool mask: an 8-token tool result in every other completion, with
    the low entropies of copied text."""
    g = torch.Generator().manual_seed(seed)
    entropy = 3.0 * torch.rand(B, T, generator=g)
    lengths = torch.randint(T // 3, T + 1, (B,), generator=g) if padded else torch.full((B,), T)
    completion_mask = torch.arange(T) < lengths.unsqueeze(1)
    tool_mask = torch.ones(B, T, dtype=torch.bool)
    for row in range(0, B, 2):
        start = int(torch.randint(0, int(lengths[row]) - 8, (1,), generator=g))
        tool_mask[row, start : start + 8] = False
    entropy = torch.where(tool_mask, entropy, 0.2 * entropy)
    return torch.randn(B, generator=g), entropy, completion_mask, tool_mask


@pytest.mark.parametrize("kappa", [math.log(4), 10.0, 18.0])
@pytest.mark.parametrize("seed", range(4))
def test_eapo_equals_the_official_trainer(kappa, seed):
    """Without padding (where both shifts coincide) and without tool tokens, bit for bit at any kappa: the quantile
    interpolates with `torch.lerp`, as the official code does."""
    advantages_B, entropy, completion_mask, _ = eapo_batch(seed, padded=False)
    ours = apply_credit_method("eapo", advantages_B, completion_mask, rollout_entropy=entropy, eapo_kappa=kappa)
    official = official_eapo(advantages_B, entropy, completion_mask, kappa)
    assert torch.equal(ours.advantages_BT, official)


@pytest.mark.parametrize("kappa", [math.log(4), 15.0])
def test_eapo_departures_from_the_official_trainer_have_their_documented_size(kappa):
    """On padded rows the shift by the largest valid exponent rounds differently (docs/methods.md: up to 7e-7
    relative below kappa 18); tool-result tokens stay out of the quantiles and means, where the official trainer,
    which reads only the completion mask, counts them: with the official mask restricted to the same tokens the two
    agree to float32 rounding; as the official trainer runs, they differ by the documented amounts."""
    shift_gap = tool_gap = 0.0
    for seed in range(20):
        advantages_B, entropy, completion_mask, tool_mask = eapo_batch(seed)
        valid = completion_mask & tool_mask
        ours = apply_credit_method("eapo", advantages_B, valid, rollout_entropy=entropy, eapo_kappa=kappa)
        same_tokens = official_eapo(advantages_B, entropy, valid, kappa)
        relative = (ours.advantages_BT - same_tokens).abs() / same_tokens.abs().clamp_min(1e-30)
        shift_gap = max(shift_gap, relative[valid].max().item())
        with_tools = official_eapo(advantages_B, entropy, completion_mask, kappa)
        tool_gap = max(tool_gap, (ours.advantages_BT - with_tools)[valid].abs().max().item())
    assert shift_gap <= 7e-7
    assert {math.log(4): 1.0, 15.0: 10.0}[kappa] < tool_gap < {math.log(4): 2.0, 15.0: 25.0}[kappa]

"""The pure credit functions against the specification: plain per-token loops and every invariant."""

import math

import pytest
import torch

from trl_credit.methods import eapo_advantages, quantile_linear, taco_advantages, tide_advantages

B, T, V = 6, 9, 50


def random_inputs(seed=0, B=B, T=T):
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(B, generator=g)
    adv[0] = 0.0
    entropy = torch.rand(B, T, generator=g) * 3
    logps = -torch.rand(B, T, generator=g) * 8
    deviation = torch.rand(B, T, generator=g) * 0.5
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 1
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return adv, logps, entropy, deviation, mask


# ----------------------------------------------------------------------------------- loop references


def taco_loop(adv, logps, entropy, mask, alpha, lam):
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            r = -logps[i, t].item() - entropy[i, t].item() + math.log(alpha)
            w = 1.0 if r <= 0 else 1 - lam * (1 - math.exp(-r))
            out[i, t] = adv[i] * w if adv[i] > 0 else adv[i]
    return out


def eapo_loop(adv, entropy, mask, kappa, quantiles):
    valid = sorted(entropy[i, t].item() for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t])

    def q(p):  # linear interpolation between order statistics
        pos = p * (len(valid) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(valid) - 1)
        return valid[lo] + (valid[hi] - valid[lo]) * (pos - lo)

    q_lo, q_hi = q(quantiles[0]), q(quantiles[1])
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        sign = int(adv[i] > 0) - int(adv[i] < 0)
        ratios = {}
        for t in range(mask.shape[1]):
            if mask[i, t]:
                h = min(max((entropy[i, t].item() - q_lo) / (q_hi - q_lo + 1e-8), 0.0), 1.0)
                ratios[t] = math.exp(kappa * sign * h)
        for t, r in ratios.items():
            out[i, t] = adv[i] * r / (sum(ratios.values()) / len(ratios))
    return out


def tide_loop(adv, deviation, entropy, mask, vocab_size, tau, kappa):
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        scores = {}
        for t in range(mask.shape[1]):
            if mask[i, t]:
                gate = min(max(entropy[i, t].item() / math.log(vocab_size), 0.0), 1.0)
                scores[t] = deviation[i, t].item() * gate**kappa / tau
        z = sum(math.exp(s) for s in scores.values())
        for t, s in scores.items():
            out[i, t] = adv[i] * len(scores) * math.exp(s) / z
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha,lam", [(0.01, 0.9), (0.5, 0.3), (1.0, 1.0)])
def test_taco_matches_loop(seed, alpha, lam):
    adv, logps, entropy, _, mask = random_inputs(seed)
    out = taco_advantages(adv, logps, entropy, mask, alpha=alpha, lam=lam)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, taco_loop(adv, logps, entropy, mask, alpha, lam))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kappa,quantiles", [(math.log(4), (0.1, 0.9)), (2.0, (0.25, 0.6)), (0.5, (0.0, 1.0))])
def test_eapo_matches_loop(seed, kappa, quantiles):
    adv, _, entropy, _, mask = random_inputs(seed)
    out = eapo_advantages(adv, entropy, mask, kappa=kappa, quantiles=quantiles)
    torch.testing.assert_close(out, eapo_loop(adv, entropy, mask, kappa, quantiles))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tau,kappa", [(0.5, 1.0), (0.1, 0.0), (2.0, 3.0)])
def test_tide_matches_loop(seed, tau, kappa):
    adv, _, entropy, deviation, mask = random_inputs(seed)
    out = tide_advantages(adv, deviation, entropy, mask, V, tau=tau, kappa=kappa)
    torch.testing.assert_close(out, tide_loop(adv, deviation, entropy, mask, V, tau, kappa))


def test_tide_hellinger_option_uses_square_root():
    adv, _, entropy, deviation, mask = random_inputs(1)
    out = tide_advantages(adv, deviation, entropy, mask, V, distance="hellinger")
    torch.testing.assert_close(out, tide_loop(adv, deviation.sqrt(), entropy, mask, V, 0.5, 1.0))


def test_quantile_matches_torch():
    values = torch.rand(1001)
    for q in (0.0, 0.1, 0.37, 0.9, 1.0):
        torch.testing.assert_close(quantile_linear(values, q), torch.quantile(values, q))


# ------------------------------------------------------------------------------------------ invariants

ALL = {
    "taco": lambda adv, logps, ent, dev, mask: taco_advantages(adv, logps, ent, mask),
    "eapo": lambda adv, logps, ent, dev, mask: eapo_advantages(adv, ent, mask),
    "tide": lambda adv, logps, ent, dev, mask: tide_advantages(adv, dev, ent, mask, V),
}


@pytest.mark.parametrize("method", ALL)
@pytest.mark.parametrize("seed", range(3))
def test_weights_positive_finite_and_sign_preserving(method, seed):
    adv, logps, entropy, deviation, mask = random_inputs(seed)
    out = ALL[method](adv, logps, entropy, deviation, mask)
    assert torch.isfinite(out).all()
    assert (out[~mask] == 0).all()
    nonzero = adv != 0
    weights = out[nonzero] / adv[nonzero].unsqueeze(1)
    assert (weights[mask[nonzero]] > 0).all()
    assert (out[0] == 0).all()  # A = 0 stays 0


@pytest.mark.parametrize("method", ALL)
def test_padding_changes_nothing(method):
    adv, logps, entropy, deviation, mask = random_inputs(2)
    out = ALL[method](adv, logps, entropy, deviation, mask)

    def pad(x, value):
        return torch.cat([x, torch.full((x.shape[0], 5), value, dtype=x.dtype)], dim=1)

    # Garbage (even NaN) in padded positions must neither change a statistic nor leak.
    padded = ALL[method](
        adv, pad(logps, float("nan")), pad(entropy, 1e6), pad(deviation, float("nan")), pad(mask, False)
    )
    torch.testing.assert_close(padded[:, :T], out)
    assert (padded[:, T:] == 0).all()
    # Garbage under the mask inside the sequence too.
    noisy_entropy = torch.where(mask, entropy, torch.full_like(entropy, 1e4))
    torch.testing.assert_close(ALL[method](adv, logps, noisy_entropy, deviation, mask), out)


@pytest.mark.parametrize("method", ["eapo", "tide"])
def test_per_response_mean_is_sequence_advantage(method):
    adv, logps, entropy, deviation, mask = random_inputs(3)
    out = ALL[method](adv, logps, entropy, deviation, mask)
    means = (out * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(means, adv)


def test_taco_invariants():
    adv, logps, entropy, _, mask = random_inputs(4)
    logps = logps * 3  # push many tokens into the tail
    lam = 0.7
    out = taco_advantages(adv, logps, entropy, mask, lam=lam)
    non_positive = adv <= 0
    torch.testing.assert_close(out[non_positive], (adv[non_positive].unsqueeze(1) * mask[non_positive]))
    positive = adv > 0
    weights = (out[positive] / adv[positive].unsqueeze(1))[mask[positive]]
    assert (weights > 1 - lam).all() and (weights <= 1).all() and (weights < 1).any()
    grpo = adv.unsqueeze(1) * mask
    torch.testing.assert_close(taco_advantages(adv, logps, entropy, mask, lam=0.0), grpo)


def test_grpo_limits_of_eapo_and_tide():
    adv, _, entropy, deviation, mask = random_inputs(5)
    grpo = adv.unsqueeze(1) * mask
    torch.testing.assert_close(eapo_advantages(adv, entropy, mask, kappa=0.0), grpo)
    constant = torch.full_like(deviation, 0.3)
    torch.testing.assert_close(tide_advantages(adv, constant, torch.full_like(entropy, 2.0), mask, V), grpo)


def test_eapo_direction_and_ratio_bound():
    adv = torch.tensor([1.0, -1.0])
    entropy = torch.tensor([[0.1, 1.0, 2.0, 3.0], [0.1, 1.0, 2.0, 3.0]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    out = eapo_advantages(adv, entropy, mask)
    assert out[0, 3] > out[0, 0] > 0  # success: high entropy gets more credit
    assert out[1, 0] < out[1, 3] < 0  # failure: low entropy gets the largest penalty
    for row in out.abs():
        assert row.max() / row.min() <= 4 + 1e-5


def test_edge_cases_single_token_all_masked_ties_and_equal_quantiles():
    adv = torch.tensor([1.0, -2.0, 0.5])
    entropy = torch.ones(3, 4)  # all ties: q_hi == q_lo
    mask = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    for method, fn in ALL.items():
        out = fn(adv, -torch.ones(3, 4), entropy, torch.full((3, 4), 0.2), mask)
        assert torch.isfinite(out).all(), method
        assert out[0, 0] == pytest.approx(1.0), method  # one valid token: weight 1 (TACO: not in tail)
        assert (out[1] == 0).all(), method  # all-masked row
        torch.testing.assert_close(out[2], torch.full((4,), 0.5)), method
    # Everything masked everywhere.
    none = torch.zeros(3, 4, dtype=torch.bool)
    for fn in ALL.values():
        assert (fn(adv, -torch.ones(3, 4), entropy, torch.zeros(3, 4), none) == 0).all()


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda a, lp, e, d, m: taco_advantages(a, lp, e, m, alpha=0.0), r"taco_alpha must be in \(0, 1\], got 0.0"),
        (lambda a, lp, e, d, m: taco_advantages(a, lp, e, m, lam=1.5), r"taco_lambda must be in \[0, 1\], got 1.5"),
        (lambda a, lp, e, d, m: eapo_advantages(a, e, m, kappa=-1.0), "eapo_kappa must be finite and >= 0, got -1.0"),
        (
            lambda a, lp, e, d, m: eapo_advantages(a, e, m, quantiles=(0.9, 0.1)),
            "eapo_quantiles must be two values lo, hi",
        ),
        (lambda a, lp, e, d, m: tide_advantages(a, d, e, m, V, tau=0.0), "tide_tau must be finite and > 0, got 0.0"),
        (lambda a, lp, e, d, m: tide_advantages(a, d, e, m, 1), r"vocabulary size \|V\| >= 2"),
        (lambda a, lp, e, d, m: tide_advantages(a, d, e, m, V, distance="kl"), "tide_distance must be one of"),
        (
            lambda a, lp, e, d, m: tide_advantages(a, d + 2, e, m, V),
            r"statistic 'reference_deviation' must lie in \[0, 1\]",
        ),
        (
            lambda a, lp, e, d, m: taco_advantages(a, lp[:, :3], e, m),
            "statistic 'policy_logps' must have the shape of the mask",
        ),
        (
            lambda a, lp, e, d, m: taco_advantages(a[:2], lp, e, m),
            r"advantages_B must have shape \(B,\) and mask_BT \(B, T\)",
        ),
        (lambda a, lp, e, d, m: eapo_advantages(a.unsqueeze(1), e, m), r"advantages_B must have shape \(B,\)"),
        (lambda a, lp, e, d, m: eapo_advantages(a * float("nan"), e, m), "sequence_advantages_B has NaN or inf"),
        (
            lambda a, lp, e, d, m: eapo_advantages(a, torch.where(m, float("inf"), e), m),
            "statistic 'rollout_entropy' has NaN or inf at valid positions",
        ),
    ],
)
def test_bad_input_raises_clear_value_error(call, message):
    adv, logps, entropy, deviation, mask = random_inputs(0)
    with pytest.raises(ValueError, match=message):
        call(adv, logps, entropy, deviation, mask)


def test_no_autograd_graph():
    adv, logps, entropy, deviation, mask = random_inputs(0)
    logps.requires_grad_(True)
    entropy.requires_grad_(True)
    for fn in ALL.values():
        assert not fn(adv, logps, entropy, deviation, mask).requires_grad


@pytest.mark.parametrize("distance", ["squared_hellinger", "hellinger"])
def test_tide_scores_are_the_scores_the_advantages_use(distance):
    """`tide_scores` (logged as tide/mean_score) must follow `tide_advantages`' inline fast path."""
    from trl_credit.methods import tide_scores

    adv, _, entropy, deviation, mask = random_inputs(7)
    scores = tide_scores(deviation, entropy, V, kappa=2.0, distance=distance)
    logits = torch.where(mask, scores / 0.5, -math.inf)
    softmax = torch.softmax(torch.where(mask.any(1, keepdim=True), logits, 0.0), dim=1)
    expected = adv.unsqueeze(1) * mask.sum(1, keepdim=True) * softmax * mask
    got = tide_advantages(adv, deviation, entropy, mask, V, tau=0.5, kappa=2.0, distance=distance)
    torch.testing.assert_close(got, expected)

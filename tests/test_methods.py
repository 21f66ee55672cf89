"""TACO, EAPO and TIDE on plain tensors against the reference loops (`reference_formulas.py`): every invariant, and
the inputs they accept."""

import math

import pytest
import torch
from reference_formulas import T, V, eapo_loop, random_inputs, taco_loop, tide_loop

from trl_credit.methods.eapo import eapo_advantages, quantile_linear
from trl_credit.methods.taco import taco_advantages
from trl_credit.methods.tide import tide_advantages


# Each method with its statistics in the reference loops' order and its hyperparameters by their registered names.
def taco(adv, logps, entropy, mask, **hyperparameters):
    return taco_advantages(adv, mask, policy_logps=logps, policy_entropy=entropy, **hyperparameters).advantages_BT


def eapo(adv, entropy, mask, **hyperparameters):
    return eapo_advantages(adv, mask, rollout_entropy=entropy, **hyperparameters).advantages_BT


def tide(adv, deviation, entropy, mask, vocab_size=V, **hyperparameters):
    return tide_advantages(
        adv, mask, reference_deviation=deviation, rollout_entropy=entropy, vocab_size=vocab_size, **hyperparameters
    ).advantages_BT


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha,lam", [(0.01, 0.9), (0.5, 0.3), (1.0, 1.0)])
def test_taco_matches_loop(seed, alpha, lam):
    adv, logps, entropy, _, mask = random_inputs(seed)
    out = taco(adv, logps, entropy, mask, taco_alpha=alpha, taco_lambda=lam)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, taco_loop(adv, logps, entropy, mask, alpha, lam))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kappa,quantiles", [(math.log(4), (0.1, 0.9)), (2.0, (0.25, 0.6)), (0.5, (0.0, 1.0))])
def test_eapo_matches_loop(seed, kappa, quantiles):
    adv, _, entropy, _, mask = random_inputs(seed)
    out = eapo(adv, entropy, mask, eapo_kappa=kappa, eapo_quantiles=quantiles)
    torch.testing.assert_close(out, eapo_loop(adv, entropy, mask, kappa, quantiles))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tau,kappa", [(0.5, 1.0), (0.1, 0.0), (2.0, 3.0)])
def test_tide_matches_loop(seed, tau, kappa):
    adv, _, entropy, deviation, mask = random_inputs(seed)
    out = tide(adv, deviation, entropy, mask, tide_tau=tau, tide_kappa=kappa)
    torch.testing.assert_close(out, tide_loop(adv, deviation, entropy, mask, V, tau, kappa))


def test_tide_hellinger_option_uses_square_root():
    adv, _, entropy, deviation, mask = random_inputs(1)
    out = tide(adv, deviation, entropy, mask, tide_distance="hellinger")
    torch.testing.assert_close(out, tide_loop(adv, deviation.sqrt(), entropy, mask, V, 0.5, 1.0))


def test_quantile_matches_torch():
    values = torch.rand(1001)
    for q in (0.0, 0.1, 0.37, 0.9, 1.0):
        torch.testing.assert_close(quantile_linear(values, q), torch.quantile(values, q))


# ------------------------------------------------------------------------------------------ invariants

ALL = {
    "taco": lambda adv, logps, ent, dev, mask: taco(adv, logps, ent, mask),
    "eapo": lambda adv, logps, ent, dev, mask: eapo(adv, ent, mask),
    "tide": lambda adv, logps, ent, dev, mask: tide(adv, dev, ent, mask),
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
    out = taco(adv, logps, entropy, mask, taco_lambda=lam)
    non_positive = adv <= 0
    torch.testing.assert_close(out[non_positive], (adv[non_positive].unsqueeze(1) * mask[non_positive]))
    positive = adv > 0
    weights = (out[positive] / adv[positive].unsqueeze(1))[mask[positive]]
    assert (weights > 1 - lam).all() and (weights <= 1).all() and (weights < 1).any()
    grpo = adv.unsqueeze(1) * mask
    torch.testing.assert_close(taco(adv, logps, entropy, mask, taco_lambda=0.0), grpo)


def test_grpo_limits_of_eapo_and_tide():
    adv, _, entropy, deviation, mask = random_inputs(5)
    grpo = adv.unsqueeze(1) * mask
    torch.testing.assert_close(eapo(adv, entropy, mask, eapo_kappa=0.0), grpo)
    constant = torch.full_like(deviation, 0.3)
    torch.testing.assert_close(tide(adv, constant, torch.full_like(entropy, 2.0), mask), grpo)


def test_eapo_direction_and_ratio_bound():
    adv = torch.tensor([1.0, -1.0])
    entropy = torch.tensor([[0.1, 1.0, 2.0, 3.0], [0.1, 1.0, 2.0, 3.0]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    out = eapo(adv, entropy, mask)
    assert out[0, 3] > out[0, 0] > 0  # success: high entropy gets more credit
    assert out[1, 0] < out[1, 3] < 0  # failure: low entropy gets the largest penalty
    for row in out.abs():
        assert row.max() / row.min() <= 4 + 1e-5


def test_eapo_takes_net_credit_off_the_confident_tokens_a_success_and_a_failure_share():
    """Worked by hand: one success (A = +1) and one failure (A = -1) with the same two tokens, entropies 0 and 1, so
    h = 0 and 1. Success: r = 1, 4 (kappa = ln 4), mean 2.5, w = 0.4, 1.6. Failure: r = 1, 1/4, mean 0.625,
    w = 1.6, 0.4. The net credit on the low-entropy token is 0.4 - 1.6 = -1.2 where GRPO's is 0: the push that moves
    the lab's template tokens (docs/evidence.md, "Collapses")."""
    out = eapo(torch.tensor([1.0, -1.0]), torch.tensor([[0.0, 1.0], [0.0, 1.0]]), torch.ones(2, 2, dtype=torch.bool))
    torch.testing.assert_close(out, torch.tensor([[0.4, 1.6], [-1.6, -0.4]]))
    torch.testing.assert_close(out.sum(0), torch.tensor([-1.2, 1.2]))


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
        (lambda a, lp, e, d, m: taco(a, lp, e, m, taco_alpha=0.0), r"taco_alpha must be in \(0, 1\], got 0.0"),
        (lambda a, lp, e, d, m: taco(a, lp, e, m, taco_lambda=1.5), r"taco_lambda must be in \[0, 1\], got 1.5"),
        (lambda a, lp, e, d, m: eapo(a, e, m, eapo_kappa=-1.0), "eapo_kappa must be finite and >= 0, got -1.0"),
        (
            lambda a, lp, e, d, m: eapo(a, e, m, eapo_quantiles=(0.9, 0.1)),
            "eapo_quantiles must be two values lo, hi",
        ),
        (lambda a, lp, e, d, m: tide(a, d, e, m, tide_tau=0.0), "tide_tau must be finite and > 0, got 0.0"),
        (lambda a, lp, e, d, m: tide(a, d, e, m, vocab_size=1), r"vocabulary size \|V\| >= 2"),
        (lambda a, lp, e, d, m: tide(a, d, e, m, tide_distance="kl"), "tide_distance must be one of"),
        (
            lambda a, lp, e, d, m: tide(a, d + 2, e, m),
            r"statistic 'reference_deviation' must lie in \[0, 1\]",
        ),
        (
            lambda a, lp, e, d, m: taco(a, lp[:, :3], e, m),
            "statistic 'policy_logps' must have the shape of the mask",
        ),
        (
            lambda a, lp, e, d, m: taco(a[:2], lp, e, m),
            r"advantages_B must have shape \(B,\) and mask_BT \(B, T\)",
        ),
        (lambda a, lp, e, d, m: eapo(a.unsqueeze(1), e, m), r"advantages_B must have shape \(B,\)"),
        (lambda a, lp, e, d, m: eapo(a * float("nan"), e, m), "sequence_advantages_B has NaN or inf"),
        (
            lambda a, lp, e, d, m: eapo(a, torch.where(m, float("inf"), e), m),
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
    """`tide_scores` (logged as tide/mean_score) are the scores whose softmax spreads the advantage."""
    from trl_credit.methods.tide import tide_scores

    adv, _, entropy, deviation, mask = random_inputs(7)
    scores = tide_scores(deviation, entropy, V, kappa=2.0, distance=distance)
    logits = torch.where(mask, scores / 0.5, -math.inf)
    softmax = torch.softmax(torch.where(mask.any(1, keepdim=True), logits, 0.0), dim=1)
    expected = adv.unsqueeze(1) * mask.sum(1, keepdim=True) * softmax * mask
    got = tide(adv, deviation, entropy, mask, tide_tau=0.5, tide_kappa=2.0, tide_distance=distance)
    torch.testing.assert_close(got, expected)


# ------------------------------------------------------------------------------------ plain-tensor inputs
# What the methods accept on plain tensors, against the reference loops: any mask dtype, garbage and low precision at
# masked positions, extreme temperatures, non-finite values named.

CALLS = {
    "taco": (
        lambda a, lp, e, d, m: taco(a, lp, e, m),
        lambda a, lp, e, d, m: taco_loop(a, lp, e, m, 0.01, 0.9),
    ),
    "eapo": (
        lambda a, lp, e, d, m: eapo(a, e, m),
        lambda a, lp, e, d, m: eapo_loop(a, e, m, math.log(4), (0.1, 0.9)),
    ),
    "tide": (
        lambda a, lp, e, d, m: tide(a, d, e, m),
        lambda a, lp, e, d, m: tide_loop(a, d, e, m, V, 0.5, 1.0),
    ),
}


@pytest.mark.parametrize("method", CALLS)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int32, torch.int64, torch.float32])
def test_mask_dtypes_agree(method, mask_dtype):
    adv, logps, entropy, deviation, mask = random_inputs(7)
    fast, loop = CALLS[method]
    out = fast(adv, logps, entropy, deviation, mask.to(mask_dtype))
    torch.testing.assert_close(out, loop(adv, logps, entropy, deviation, mask))


@pytest.mark.parametrize("method", CALLS)
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -float("inf"), 3e38, -3e38])
def test_masked_garbage_changes_nothing(method, garbage):
    adv, logps, entropy, deviation, mask = random_inputs(8)
    fast, loop = CALLS[method]
    dirty = [torch.where(mask, x, torch.full_like(x, garbage)) for x in (logps, entropy, deviation)]
    out = fast(adv, *dirty, mask)
    torch.testing.assert_close(out, loop(adv, logps, entropy, deviation, mask))
    assert (out[~mask] == 0).all()


@pytest.mark.parametrize("method", CALLS)
def test_low_precision_inputs(method):
    adv, logps, entropy, deviation, mask = random_inputs(9)
    fast, loop = CALLS[method]
    half = [x.bfloat16() for x in (logps, entropy, deviation)]
    out = fast(adv, *half, mask)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, loop(adv, *(x.float() for x in half), mask))


@pytest.mark.parametrize("tau", [0.0125, 0.005])  # scores / tau far above 1: the softmax must not overflow
def test_tide_small_temperatures(tau):
    adv, _, entropy, deviation, mask = random_inputs(10, T=64)
    deviation = deviation * 0.8  # scores s <= ~0.3: s / tau stays inside float32 exp range for the reference loop
    out = tide(adv, deviation, entropy, mask, tide_tau=tau)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, tide_loop(adv, deviation, entropy, mask, V, tau, 1.0), rtol=1e-4, atol=1e-5)


def test_nonfinite_valid_inputs_are_still_named():
    adv, logps, entropy, deviation, mask = random_inputs(11)
    bad = torch.where(mask, torch.full_like(logps, float("nan")), logps)
    with pytest.raises(ValueError, match="'taco': statistic 'policy_logps' has NaN or inf at valid positions"):
        taco(adv, bad, entropy, mask)
    with pytest.raises(ValueError, match="'tide': statistic 'reference_deviation' has NaN or inf"):
        tide(adv, bad, entropy, mask)
    out_of_range = torch.where(mask, deviation, torch.full_like(deviation, 5.0))  # only under the mask: fine
    tide(adv, out_of_range, entropy, mask)


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_selection_quantiles_match_sorting(n):
    g = torch.Generator().manual_seed(n)
    for values in (torch.rand(n, generator=g), torch.randint(0, 4, (n,), generator=g).float()):  # with ties
        ordered = torch.sort(values).values
        for q in (0.0, 0.1, 0.5, 0.9, 1.0):
            position = q * (n - 1)
            below, above = math.floor(position), min(math.floor(position) + 1, n - 1)
            expected = ordered[below] + (ordered[above] - ordered[below]) * (position - below)
            assert quantile_linear(values, q) == expected


def test_entropy_bounds_ignore_masked_values():
    _, _, entropy, _, mask = random_inputs(12)
    dirty = torch.where(mask, entropy, torch.full_like(entropy, float("nan")))
    expected = [torch.quantile(entropy[mask], q).item() for q in (0.1, 0.9)]
    adv = torch.ones(mask.size(0))
    metrics = eapo_advantages(adv, mask, rollout_entropy=dirty).metrics
    assert [metrics["q_lo"], metrics["q_hi"]] == pytest.approx(expected, abs=1e-6)
    empty = eapo_advantages(adv, torch.zeros_like(mask), rollout_entropy=entropy).metrics
    assert (empty["q_lo"], empty["q_hi"]) == (0.0, 0.0)

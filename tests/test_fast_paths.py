"""The credit functions' fast paths (float masks, optimistic finiteness checks, shifted softmax, selection
quantiles) against the per-token loops of the specification, on the inputs that switch between paths."""

import math

import pytest
import torch
from test_methods import V, eapo_loop, random_inputs, taco_loop, tide_loop

from trl_credit.methods import apply_credit_method, eapo_advantages, quantile_linear, taco_advantages, tide_advantages
from trl_credit.methods.registry import ROLLOUT_ENTROPY

CALLS = {
    "taco": (
        lambda a, lp, e, d, m: taco_advantages(a, lp, e, m),
        lambda a, lp, e, d, m: taco_loop(a, lp, e, m, 0.01, 0.9),
    ),
    "eapo": (
        lambda a, lp, e, d, m: eapo_advantages(a, e, m),
        lambda a, lp, e, d, m: eapo_loop(a, e, m, math.log(4), (0.1, 0.9)),
    ),
    "tide": (
        lambda a, lp, e, d, m: tide_advantages(a, d, e, m, V),
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
def test_masked_garbage_takes_the_exact_path_and_changes_nothing(method, garbage):
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


@pytest.mark.parametrize("tau", [0.0125, 0.005])  # constant-shift and per-row-max branches of TIDE's softmax
def test_tide_small_temperatures(tau):
    adv, _, entropy, deviation, mask = random_inputs(10, T=64)
    deviation = deviation * 0.8  # scores s <= ~0.3: s / tau stays inside float32 exp range for the reference loop
    out = tide_advantages(adv, deviation, entropy, mask, V, tau=tau)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, tide_loop(adv, deviation, entropy, mask, V, tau, 1.0), rtol=1e-4, atol=1e-5)


def test_nonfinite_valid_inputs_are_still_named():
    adv, logps, entropy, deviation, mask = random_inputs(11)
    bad = torch.where(mask, torch.full_like(logps, float("nan")), logps)
    with pytest.raises(ValueError, match="'taco': statistic 'policy_logps' has NaN or inf at valid positions"):
        taco_advantages(adv, bad, entropy, mask)
    with pytest.raises(ValueError, match="'tide': statistic 'reference_deviation' has NaN or inf"):
        tide_advantages(adv, bad, entropy, mask, V)
    out_of_range = torch.where(mask, deviation, torch.full_like(deviation, 5.0))  # only under the mask: fine
    tide_advantages(adv, out_of_range, entropy, mask, V)


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
    metrics = apply_credit_method("eapo", adv, mask, {ROLLOUT_ENTROPY: dirty}).metrics
    assert [metrics["q_lo"], metrics["q_hi"]] == pytest.approx(expected, abs=1e-6)
    empty = apply_credit_method("eapo", adv, torch.zeros_like(mask), {ROLLOUT_ENTROPY: entropy}).metrics
    assert (empty["q_lo"], empty["q_hi"]) == (0.0, 0.0)

"""The diagnostics the trainer logs for every method (`METHOD/mean_weight`, `weight_std`, `weight_max`, `mean_shift`,
docs/metrics.md) against their definitions worked token by token, where the incoming advantage is near zero: GTPO's
additive `-gamma * H` over a tied group's rounding noise, the case that logged `gtpo/mean_weight` -4635 before."""

import math

import pytest
import torch

from trl_credit.methods import CreditBatch, StackCredit
from trl_credit.methods.gtpo import gtpo_advantages
from trl_credit.trainer.diagnostics import credit_metrics

ENTROPY = 0.3  # every token's: each completion's mean entropy, gamma * H = 0.03 under the default gamma 0.1


def gtpo_rows(advantages):
    """GTPO over one group per pair of advantages; each pair's completions share their first token (a conflict)."""
    rows = len(advantages)
    ids = torch.tensor([[7, 10 + 2 * r, 11 + 2 * r] for r in range(rows)])
    mask = torch.ones(rows, 3, dtype=torch.bool)
    adv = torch.tensor(advantages)
    result = gtpo_advantages(
        adv,
        mask,
        rollout_entropy=torch.full((rows, 3), ENTROPY),
        completion_ids_BT=ids,
        group_index_B=torch.arange(rows) // 2,
        pad_token_id=0,
    )
    return adv.view(-1, 1) * mask, result, mask


def diagnostics_by_hand(incoming_BT, outgoing_BT, mask_BT):
    """docs/metrics.md, token by token: the factor Â / A where |A| > 1e-3 of the largest |A| or |Â|; the shift Â - A."""
    tokens = [
        (float(incoming_BT[i, t]), float(outgoing_BT[i, t]))
        for i in range(mask_BT.size(0))
        for t in range(mask_BT.size(1))
        if mask_BT[i, t]
    ]
    largest = max(max(abs(a), abs(b)) for a, b in tokens)
    factors = [b / a for a, b in tokens if abs(a) > 1e-3 * largest]
    shift = sum(b - a for a, b in tokens) / len(tokens)
    if not factors:
        return {"mean_weight": math.nan, "weight_std": math.nan, "weight_max": math.nan, "mean_shift": shift}
    mean = sum(factors) / len(factors)
    std = math.sqrt(sum((f - mean) ** 2 for f in factors) / len(factors))
    return {"mean_weight": mean, "weight_std": std, "weight_max": max(factors), "mean_shift": shift}


def logged(accelerator, incoming_BT, result, mask_BT):
    """The diagnostics the trainer logs for a stack of GTPO alone, handed `incoming_BT`, that returned `result`."""
    handed = CreditBatch(incoming_BT, incoming_BT[:, 0], mask_BT)
    credit = StackCredit(handed.followed_by(result), None, None, (("gtpo", handed, result),))
    metrics = credit_metrics(accelerator, credit)
    return {name: metrics[f"gtpo/{name}"] for name in ("mean_weight", "weight_std", "weight_max", "mean_shift")}


@pytest.mark.parametrize("tiny", [1e-6, -1e-6])
def test_near_zero_advantages_beside_real_ones_carry_no_factor(accelerator, tiny):
    """A group of spread rewards (A = +-0.5) and a tied one whose mean left A = +-1e-6."""
    incoming_BT, result, mask_BT = gtpo_rows([0.5, -0.5, tiny, -tiny])
    got = logged(accelerator, incoming_BT, result, mask_BT)
    want = diagnostics_by_hand(incoming_BT, result.advantages_BT, mask_BT)
    assert all(math.isfinite(value) for value in got.values())
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    # Only the spread group's tokens carry a factor: (0.5 - 0.03) * d / n / 0.5 with d = 2 (the shared first token)
    # and n = 1 on the positive, 0 on the negative's conflict, 1 elsewhere.
    factors = [2 * 0.47 / 0.5, 0.47 / 0.5, 0.47 / 0.5, 0.0, 0.53 / 0.5, 0.53 / 0.5]
    assert got["mean_weight"] == pytest.approx(sum(factors) / 6, rel=1e-5)
    assert got["weight_max"] == pytest.approx(2 * 0.47 / 0.5, rel=1e-5)
    # Without the floor the tied group's factors (about -0.03 / 1e-6) would swamp the mean.
    everything = (result.advantages_BT / incoming_BT)[mask_BT]
    assert everything.abs().max() > 1e4


def test_a_batch_of_near_zero_advantages_has_no_factor_but_a_finite_shift(accelerator):
    incoming_BT, result, mask_BT = gtpo_rows([1e-6, -1e-6, 1e-6, -1e-6])
    got = logged(accelerator, incoming_BT, result, mask_BT)
    want = diagnostics_by_hand(incoming_BT, result.advantages_BT, mask_BT)
    assert math.isnan(got["mean_weight"]) and math.isnan(got["weight_std"]) and math.isnan(got["weight_max"])
    # The shift is what GTPO did: -gamma * H (times d / n) on the positives, 0 on the negatives' conflict token.
    assert math.isfinite(got["mean_shift"]) and got["mean_shift"] == pytest.approx(want["mean_shift"], rel=1e-5)
    assert got["mean_shift"] == pytest.approx(-(2 * 0.03 + 0.03 + 0.03 + 0.0 + 0.03 + 0.03) / 6, rel=1e-3)


def test_ordinary_advantages_keep_every_token_in_the_factor(accelerator):
    incoming_BT, result, mask_BT = gtpo_rows([0.5, -0.5, 1.5, -1.5])
    got = logged(accelerator, incoming_BT, result, mask_BT)
    factors = (result.advantages_BT / incoming_BT)[mask_BT]  # every token: no advantage is near zero
    assert got["mean_weight"] == pytest.approx(factors.mean().item(), rel=1e-5)
    assert got["weight_std"] == pytest.approx(factors.std(unbiased=False).item(), rel=1e-4)
    assert got["weight_max"] == pytest.approx(factors.max().item(), rel=1e-5)


def test_a_token_exactly_at_the_floor_carries_no_factor(accelerator):
    """A weight is defined where |in| exceeds WEIGHT_FLOOR times the largest |in| or |out| (here 2000): a token at
    exactly that share (|in| = 2) has none, so the mean weight is the first token's 2."""
    from trl_credit.methods import CreditResult
    from trl_credit.trainer.diagnostics import WEIGHT_FLOOR

    incoming_BT, mask_BT = torch.tensor([[1000.0, 2.0]]), torch.ones(1, 2, dtype=torch.bool)
    got = logged(accelerator, incoming_BT, CreditResult(torch.tensor([[2000.0, 0.0]])), mask_BT)
    assert WEIGHT_FLOOR * 2000.0 == 2.0 and got["mean_weight"] == 2.0 and got["weight_max"] == 2.0

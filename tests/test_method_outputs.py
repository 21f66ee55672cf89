"""What each registered method returns besides its advantages: the per-token statistic of the token-credit view (the
"Token statistic:" of its docstring) and the metrics it logs, against the definitions the docstring gives
(`TOKEN_STATISTICS` and `METRICS` of `reference_credit.py`, worked from the batch's statistics and the reference rules),
on `random_reference_batch` under `MOVING_SETTINGS`.

The registry drives the test: a method that declares a token statistic or metrics and has no reference for them fails,
and one that declares none must return none."""

import pytest
import torch
from conftest import PACKAGE_METHODS
from reference_credit import (
    METRICS,
    MOVING_SETTINGS,
    TOKEN_STATISTICS,
    ReferenceBatch,
    random_reference_batch,
    resolved_hyperparameters,
    restarted,
)

from trl_credit.methods import CREDIT_METHODS, CreditBatch, StackCredit, apply_credit_method
from trl_credit.trainer.diagnostics import credit_metrics


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(PACKAGE_METHODS))
def test_the_token_statistic_is_the_one_the_docstring_defines(name, seed):
    method = CREDIT_METHODS[name]
    batch = random_reference_batch(seed)
    settings = MOVING_SETTINGS[name]
    advantages_B, mask_BT, named = batch.package_inputs()
    result = apply_credit_method(name, advantages_B, mask_BT, **named, **settings)
    if method.token_statistic is None:
        assert result.statistic_BT is None
        return
    assert name in TOKEN_STATISTICS, (
        f"{name!r} declares the token statistic {method.token_statistic}: add its definition to TOKEN_STATISTICS in "
        "tests/reference_credit.py"
    )
    assert result.statistic_BT is not None and result.statistic_BT.shape == mask_BT.shape
    want_BT = TOKEN_STATISTICS[name](batch, resolved_hyperparameters(name, settings))
    torch.testing.assert_close(result.statistic_BT.double()[mask_BT], want_BT[mask_BT], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------- the logged metrics


def _with_tied_group_0(batch: ReferenceBatch) -> ReferenceBatch:
    """`batch` with the advantages of prompt group 0 set to 0 (equal rewards): no token there is positive."""
    return restarted(batch, batch.sequence_advantages_B.masked_fill(batch.group_index_B == 0, 0.0))


@pytest.mark.parametrize("case", ["seed 0", "seed 1", "a tied group"])
@pytest.mark.parametrize("name", list(PACKAGE_METHODS))
def test_the_logged_metrics_are_the_ones_the_docstring_defines(accelerator, name, case):
    """`name/metric` as the trainer logs it (`credit_metrics`, one process), for every metric the method declares."""
    method = CREDIT_METHODS[name]
    if not method.diagnostics:
        return
    assert name in METRICS, (
        f"{name!r} logs {sorted(method.diagnostics)}: add their definitions to METRICS in tests/reference_credit.py"
    )
    batch = (
        _with_tied_group_0(random_reference_batch(0))
        if case == "a tied group"
        else random_reference_batch(int(case[-1]))
    )
    settings = MOVING_SETTINGS[name]
    advantages_B, mask_BT, named = batch.package_inputs()
    result = apply_credit_method(name, advantages_B, mask_BT, **named, **settings)
    handed = CreditBatch(named["advantages_BT"], advantages_B, mask_BT)
    logged = credit_metrics(
        accelerator, StackCredit(handed.followed_by(result), None, None, ((name, handed, result),))
    )
    want = METRICS[name](batch, resolved_hyperparameters(name, settings))
    assert sorted(want) == sorted(method.diagnostics)
    assert {metric: logged[f"{name}/{metric}"] for metric in want} == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("empty", ["one completion", "every completion"])
@pytest.mark.parametrize("name", list(PACKAGE_METHODS))
def test_a_completion_without_valid_tokens_leaves_every_output_finite(name, empty):
    """A completion whose every token is masked (a tool's output, a prompt that filled the context), and a micro-batch
    of such completions: the advantages stay finite everywhere and 0 there, and a metric of a micro-batch without
    valid tokens carries no weight in the mean over micro-batches."""
    batch = random_reference_batch(0)
    advantages_B, mask_BT, named = batch.package_inputs()
    mask_BT = mask_BT.clone()
    mask_BT[: 1 if empty == "one completion" else None] = False
    named["advantages_BT"] = named["advantages_BT"] * mask_BT
    named["loss_weights_BT"] = named["loss_weights_BT"] * mask_BT
    result = apply_credit_method(name, advantages_B, mask_BT, **named, **MOVING_SETTINGS[name])
    assert torch.isfinite(result.advantages_BT).all() and (result.advantages_BT[~mask_BT] == 0).all()
    for metric, value in result.metrics.items():
        parts = value if isinstance(value, tuple) else (value,)
        assert all(torch.isfinite(torch.as_tensor(part, dtype=torch.float)).all() for part in parts), metric
        if isinstance(value, tuple) and empty == "every completion":
            assert value[1].sum() == 0 and value[0].sum() == 0, f"{name}/{metric} counts a micro-batch without tokens"

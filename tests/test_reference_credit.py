"""The reference of every registered method (`reference_credit.py`) against the package, where the method moves credit.

The registry drives every test: a newly registered method fails here until it has a reference rule and moving
settings. The package's plain-tensor call must equal the reference at 1e-5, and the method must have moved credit.
"""

from pathlib import Path

import pytest
import torch
from reference_credit import (
    MOVING_SETTINGS,
    REFERENCE_RULES,
    assert_credit_moved,
    credit_moved_share,
    random_reference_batch,
    reference_stack,
)

from trl_credit.methods import CREDIT_METHODS, apply_credit_method, apply_credit_stack

DOCS = Path(__file__).resolve().parent.parent / "docs"
REGISTERED = sorted(CREDIT_METHODS)
SEEDS = [0, 1, 2]


@pytest.mark.parametrize("name", REGISTERED)
def test_every_registered_method_has_a_reference_and_moving_settings(name):
    assert name in REFERENCE_RULES, (
        f"credit method {name!r} has no reference rule: add an independent recomputation of its official rule to "
        "REFERENCE_RULES in tests/reference_credit.py"
    )
    assert name in MOVING_SETTINGS, (
        f"credit method {name!r} has no MOVING_SETTINGS in tests/reference_credit.py: give settings under which it "
        "moves credit on random_reference_batch's inputs"
    )


def _compare(spec, batch, settings):
    """The package's result on `batch` and the reference's, and the share of tokens whose credit moved."""
    advantages_B, mask_BT, named = batch.package_inputs()
    flat = {key: value for method in spec.split("+") for key, value in settings.get(method, {}).items()}
    if "+" in spec:
        got = apply_credit_stack(spec, advantages_B, mask_BT, **named, **flat)
    else:
        got = apply_credit_method(spec, advantages_B, mask_BT, **named, **flat)
    want = reference_stack(spec, batch, settings)
    torch.testing.assert_close(got.advantages_BT.double(), want.advantages_BT, atol=1e-5, rtol=1e-5)
    got_weights_BT = mask_BT.double() if got.loss_mask_BT is None else got.loss_mask_BT.double() * mask_BT
    torch.testing.assert_close(got_weights_BT, want.loss_weights_BT, atol=1e-6, rtol=0)
    return credit_moved_share(want.advantages_BT, batch.sequence_advantages_B, mask_BT, want.loss_weights_BT)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["grpo", *REGISTERED])
def test_method_equals_its_reference_where_it_moves_credit(name, seed):
    if name not in REFERENCE_RULES or name not in MOVING_SETTINGS:
        pytest.fail(f"credit method {name!r} has no reference rule or moving settings (see the test above)")
    batch = random_reference_batch(seed)
    if name == "grpo":  # no method: the reference is the identity, and nothing moves
        want = reference_stack("grpo", batch)
        torch.testing.assert_close(want.advantages_BT, batch.advantages_BT)
        assert credit_moved_share(want.advantages_BT, batch.sequence_advantages_B, batch.mask_BT) == 0
        return
    share = _compare(name, batch, {name: MOVING_SETTINGS[name]})
    assert_credit_moved(name, share)


def test_assert_credit_moved_names_the_method_that_moved_nothing():
    batch = random_reference_batch(0)
    share = credit_moved_share(batch.advantages_BT, batch.sequence_advantages_B, batch.mask_BT)
    assert share == 0
    with pytest.raises(AssertionError, match="'taco' moved no credit"):
        assert_credit_moved("taco", share)

"""The reference of every registered method (`reference_credit.py`) against the package, where the method moves credit.

The registry drives every test: a newly registered method fails here until it has a reference rule and moving
settings. The package's plain-tensor call must equal the reference at 1e-5, and the method must have moved credit.
"""

import dataclasses

import pytest
import torch
from conftest import PACKAGE_METHODS
from reference_credit import (
    MOVING_SETTINGS,
    REFERENCE_RULES,
    assert_credit_moved,
    credit_moved_share,
    documented_stacks,
    random_reference_batch,
    reference_stack,
    stack_settings,
)

from trl_credit.methods import apply_credit_method, apply_credit_stack

STACKS = documented_stacks()
REGISTERED = list(PACKAGE_METHODS)  # the package's, not the probes other test modules register
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
    if name == "grpo":  # no method: the package's stack "grpo" and the reference are the identity, nothing moves
        advantages_B, mask_BT, named = batch.package_inputs()
        got = apply_credit_stack("grpo", advantages_B, mask_BT, **named)
        want = reference_stack("grpo", batch)
        torch.testing.assert_close(got.advantages_BT.double(), want.advantages_BT, atol=1e-6, rtol=0)
        assert got.loss_mask_BT is None
        assert credit_moved_share(want.advantages_BT, batch.sequence_advantages_B, batch.mask_BT) == 0
        return
    share = _compare(name, batch, {name: MOVING_SETTINGS[name]})
    assert_credit_moved(name, share)


@pytest.mark.parametrize("name", REGISTERED)
def test_a_method_on_a_batch_without_rows_returns_one_without_rows(name):
    """No completions at all: an empty result of the batch's width, not an error (nor a guard's fallback value)."""
    full = random_reference_batch(0)
    rows = {
        f.name: getattr(full, f.name)[:0]
        for f in dataclasses.fields(full)
        if isinstance(getattr(full, f.name), torch.Tensor)
    }
    empty = dataclasses.replace(full, **rows, statistics={key: value[:0] for key, value in full.statistics.items()})
    advantages_B, mask_BT, named = empty.package_inputs()
    got = apply_credit_method(name, advantages_B, mask_BT, **named, **MOVING_SETTINGS[name])
    assert got.advantages_BT.shape == (0, full.mask_BT.size(1))
    assert got.loss_mask_BT is None or got.loss_mask_BT.shape == (0, full.mask_BT.size(1))


def test_assert_credit_moved_names_the_method_that_moved_nothing():
    batch = random_reference_batch(0)
    share = credit_moved_share(batch.advantages_BT, batch.sequence_advantages_B, batch.mask_BT)
    assert share == 0
    with pytest.raises(AssertionError, match="'taco' moved no credit"):
        assert_credit_moved("taco", share)


def test_the_docs_stacks_are_found():
    # The stacks the docs spell out (docs/methods.md, docs/baselines.md, README.md), so the stack test is not vacuous.
    assert {"eapo+taco", "eapo+stapo", "otb+taco", "otb+stapo", "ar_lopti+taco+stapo+clip_cov"} <= set(STACKS)
    assert "eapo+mypackage" not in " ".join(STACKS)  # a user's module path is no registered stack


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spec", STACKS)
def test_documented_stack_equals_the_reference_stack(spec, seed):
    batch, settings = random_reference_batch(seed), stack_settings(spec)
    assert_credit_moved(spec, _compare(spec, batch, settings))
    # Every method of the stack moves credit where it stands, so a later method's error cannot hide behind an earlier.
    names = spec.split("+")
    for k in range(1, len(names)):
        before, after = reference_stack(names[:k], batch, settings), reference_stack(names[: k + 1], batch, settings)
        changed_BT = ((after.advantages_BT - before.advantages_BT).abs() > 1e-6) | (
            (after.loss_weights_BT - before.loss_weights_BT).abs() > 1e-6
        )
        assert_credit_moved(f"{names[k]} (in {spec})", float(changed_BT.double().mean()))


# The other branches of each rule: options off their defaults, a later step, a one-token draw.
VARIANTS = [
    ("eapo", {"eapo_kappa_decay_steps": 8, "eapo_quantiles": [0.2, 0.7]}, 3),
    ("tide", {"tide_distance": "hellinger", "tide_reference": "old", "tide_tau": 0.2, "tide_kappa": 2.0}, 0),
    ("stare", {"stare_target_entropy": 100.0, "stare_variant": "O1", "stare_top_p_ratio": 0.5}, 0),
    ("otb", {"otb_handle_zero_tail": False}, 0),
    ("gtpo", {"gtpo_entropy_threshold": 100.0, "gtpo_conflict_normalization": False, "gtpo_conflict_weight": 3.0}, 0),
    ("stapo", {"stapo_prob_threshold": 0.3, "stapo_entropy_quantile": 0.5, "stapo_only_positive_advantage": False}, 0),
    ("minp_support", {"minp_support_min_p": 0.5, "minp_support_only_positive_advantage": False}, 0),
    ("clip_cov", {"clip_cov_lb": -10.0, "clip_cov_ub": 10.0, "clip_cov_seed": 7}, 5),  # default ratio: 1 token
    ("high_entropy", {"high_entropy_top_ratio": 0.55}, 0),
    ("entropy_adv", {"entropy_adv_alpha": 0.05, "entropy_adv_kappa": 1.5}, 0),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,settings,step", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_method_variant_equals_its_reference(name, settings, step, seed):
    batch = dataclasses.replace(random_reference_batch(seed), step=step)
    assert_credit_moved(name, _compare(name, batch, {name: settings}))

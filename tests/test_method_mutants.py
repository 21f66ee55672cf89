"""Behaviour that mutation testing (docs/testing.md) found no test for: each method's hyperparameter ranges at their
edges, and a few rules in cases the random-input tests never reach (equal EAPO quantiles, out-of-range TIDE inputs,
the Clip-Cov covariance at dropped tokens). Expected values are the ranges the fields' help states and numbers worked
by hand or by the loops of tests/reference_formulas.py."""

import math
import typing

import pytest
import torch
from conftest import PACKAGE_METHODS
from reference_credit import RANGES, UNBOUNDED
from reference_formulas import eapo_loop, tide_loop

from trl_credit.methods import CREDIT_METHODS, apply_credit_method
from trl_credit.methods.clip_cov import clip_cov_covariance
from trl_credit.methods.eapo import eapo_advantages, eapo_normalized_entropy, quantile_linear
from trl_credit.methods.settings import SettingError
from trl_credit.methods.taco import taco_tail_risk
from trl_credit.methods.tide import tide_advantages, tide_scores


def _owner(field_name: str):
    return next(method for method in CREDIT_METHODS.values() if field_name in method.argument_names)


def _bounded_fields():
    for method in (CREDIT_METHODS[name] for name in PACKAGE_METHODS):  # the lab's oracle is not the package's
        hints = typing.get_type_hints(method.arguments) if method.arguments else {}
        for field in method.argument_fields():
            declared = hints[field.name]
            if declared is bool or typing.get_origin(declared) is typing.Literal or field.name in UNBOUNDED:
                continue
            yield field.name


def test_every_bounded_field_has_its_range_here():
    # A new method's ranged hyperparameters enter these edge tests, or this test names them.
    assert sorted(set(_bounded_fields()) - set(RANGES)) == []
    assert sorted(set(RANGES) - set(_bounded_fields())) == []


@pytest.mark.parametrize("field_name", sorted(RANGES))
def test_a_hyperparameter_is_accepted_inside_its_range_and_refused_outside(field_name):
    method = _owner(field_name)
    allowed, accepted, refused = RANGES[field_name]
    for value in accepted:
        settings = method.hyperparameters({field_name: value})
        assert settings[field_name] == value or (value is not None and math.isnan(settings[field_name]))
    for value in refused:
        with pytest.raises(SettingError) as error:
            method.hyperparameters({field_name: value})
        assert error.value.name == field_name
        assert str(error.value).startswith(f"{field_name} must be {allowed}, got "), str(error.value)


def test_clip_cov_upper_bound_must_exceed_the_lower():
    method = CREDIT_METHODS["clip_cov"]
    assert method.hyperparameters({"clip_cov_lb": 2.0, "clip_cov_ub": 2.5})["clip_cov_ub"] == 2.5
    with pytest.raises(SettingError) as error:
        method.hyperparameters({"clip_cov_lb": 2.0, "clip_cov_ub": 2.0})
    assert error.value.name == "clip_cov_ub"
    assert str(error.value) == "clip_cov_ub must be > clip_cov_lb = 2.0, got 2.0"


def test_public_helpers_default_to_the_registered_defaults():
    defaults = {f.name: f.default for m in CREDIT_METHODS.values() for f in m.argument_fields()}
    logps, entropy = torch.tensor([-6.0, -1.0]), torch.tensor([0.5, 0.2])
    assert torch.equal(taco_tail_risk(logps, entropy), taco_tail_risk(logps, entropy, defaults["taco_alpha"]))
    deviation, entropy, vocab = torch.tensor([0.04, 0.36]), torch.tensor([1.0, 2.0]), 20
    assert torch.equal(
        tide_scores(deviation, entropy, vocab),
        tide_scores(deviation, entropy, vocab, defaults["tide_kappa"], defaults["tide_distance"]),
    )


def test_eapo_kappa_decays_linearly_to_zero_and_stays_there():
    # kappa * max(0, 1 - step / decay_steps): 2.0 over 4 steps gives 2, 1.5, 1, 0 and 0 past the end.
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3, dtype=torch.bool)
    entropy = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.6, 1.0]])
    for step, expected in [(0, 2.0), (1, 1.5), (2, 1.0), (4, 0.0), (6, 0.0)]:
        result = eapo_advantages(
            adv, mask, rollout_entropy=entropy, step=step, eapo_kappa=2.0, eapo_kappa_decay_steps=4
        )
        assert result.metrics["kappa"] == pytest.approx(expected)
    # One decay step: full kappa at step 0, none from step 1 on; 0 decay steps keep kappa constant.
    one = [eapo_advantages(adv, mask, rollout_entropy=entropy, step=s, eapo_kappa_decay_steps=1) for s in (0, 1)]
    assert [r.metrics["kappa"] for r in one] == pytest.approx([math.log(4.0), 0.0])
    assert torch.allclose(one[1].advantages_BT, adv.unsqueeze(1).expand(2, 3))  # kappa 0: every weight 1
    constant = eapo_advantages(adv, mask, rollout_entropy=entropy, step=10**6, eapo_kappa_decay_steps=0)
    assert constant.metrics["kappa"] == pytest.approx(math.log(4.0))


def test_eapo_with_equal_quantiles_is_a_step_at_the_quantile():
    # Eleven tokens at H = 1 and one at H = 2: the 10 % and 90 % quantiles are both 1, so h = 1 above 1, 0 at it.
    assert torch.equal(eapo_normalized_entropy(torch.tensor([0.5, 1.0, 2.0]), 1.0, 1.0), torch.tensor([0.0, 0.0, 1.0]))
    adv = torch.tensor([1.0, -0.5])
    mask = torch.ones(2, 6, dtype=torch.bool)
    entropy = torch.ones(2, 6)
    entropy[0, 3] = 2.0
    result = eapo_advantages(adv, mask, rollout_entropy=entropy, eapo_kappa=2.0)
    assert result.metrics["q_lo"] == result.metrics["q_hi"] == pytest.approx(1.0)
    expected = eapo_loop(adv, entropy, mask, 2.0, (0.1, 0.9))
    assert not torch.allclose(expected, adv.unsqueeze(1).expand(2, 6))  # the step moved credit
    torch.testing.assert_close(result.advantages_BT, expected, rtol=1e-6, atol=1e-6)


def test_a_quantile_of_no_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match=r"^cannot take a quantile of an empty set of valid tokens$"):
        quantile_linear(torch.empty(0), 0.5)


def test_tide_against_the_previous_policy_reads_the_previous_policy_deviation():
    method = CREDIT_METHODS["tide"]
    assert "previous_policy_deviation" in method.statistics_for(method.hyperparameters({"tide_reference": "old"}))
    assert "reference_deviation" in method.statistics_for(method.hyperparameters({"tide_reference": "ref"}))
    g = torch.Generator().manual_seed(3)
    adv, mask = torch.tensor([1.0, -2.0, 0.5]), torch.ones(3, 4, dtype=torch.bool)
    mask[2, 2:] = False
    deviation, entropy, vocab = torch.rand(3, 4, generator=g) * 0.5, torch.rand(3, 4, generator=g) * 3, 50
    result = tide_advantages(
        adv, mask, previous_policy_deviation=deviation, rollout_entropy=entropy, vocab_size=vocab, tide_reference="old"
    )
    expected = tide_loop(adv, deviation, entropy, mask, vocab, 0.5, 1.0)
    torch.testing.assert_close(result.advantages_BT, expected, rtol=1e-5, atol=1e-6)


def test_tide_scores_clamp_out_of_range_deviations_and_entropies():
    # Hellinger d' = sqrt(clamp(d, 0, 1)) and gate Hn = clamp(H / log|V|, 0, 1), kappa 1: a rounding-negative deviation
    # scores 0 (not NaN), d > 1 counts as 1, H above log|V| gates 1 and a negative H gates 0.
    vocab = 20
    log_v = math.log(vocab)
    deviation = torch.tensor([-1e-7, 0.25, 1.5, 0.25])
    entropy = torch.tensor([log_v, 0.5 * log_v, 3.0 * log_v, -0.1])
    scores = tide_scores(deviation, entropy, vocab, kappa=1.0, distance="hellinger")
    torch.testing.assert_close(scores, torch.tensor([0.0, 0.25, 1.0, 0.0]))
    squared = tide_scores(torch.tensor([1.5, -0.2]), torch.tensor([2.0 * log_v, log_v]), vocab, kappa=1.0)
    torch.testing.assert_close(squared, torch.tensor([1.0, 0.0]))


def test_clip_cov_covariance_uses_weighted_means_and_is_zero_off_the_loss():
    # Weights 1, 0.5, 1, 0: weighted means A = (1 + 1 + 3) / 2.5 = 2 and log p = (-1 - 1 - 3) / 2.5 = -2, so
    # cov = (A - 2)(log p + 2) = -1, 0, -1, and 0 where the weight is 0 (there (10 - 2)(-9 + 2) would be -56).
    advantages = torch.tensor([[1.0, 2.0], [3.0, 10.0]])
    logps = torch.tensor([[-1.0, -2.0], [-3.0, -9.0]])
    weights = torch.tensor([[1.0, 0.5], [1.0, 0.0]])
    covariance = clip_cov_covariance(advantages, logps, weights)
    torch.testing.assert_close(covariance, torch.tensor([[-1.0, 0.0], [-1.0, 0.0]]))


def _next_float32_above(value: float) -> float:
    return torch.nextafter(torch.tensor(value), torch.tensor(math.inf)).item()


def test_stapo_keeps_a_token_whose_probability_equals_the_threshold():
    # TACO's dp_actor.py: spurious where p < threshold (strictly) and H below the candidates' quantile (here 2.5).
    logps, entropy = torch.tensor([[-3.0, -1.0, -0.5, -0.2]]), torch.tensor([[0.1, 2.0, 3.0, 4.0]])
    p = logps[0, 0].exp().item()  # float32, as the method computes it

    def kept(threshold):
        result = apply_credit_method(
            "stapo",
            torch.tensor([1.0]),
            torch.ones(1, 4, dtype=torch.bool),
            policy_logps=logps,
            policy_entropy=entropy,
            stapo_prob_threshold=threshold,
            stapo_entropy_quantile=0.5,
        )
        return result.loss_mask_BT.tolist()

    assert kept(p) == [[1.0, 1.0, 1.0, 1.0]]
    assert kept(_next_float32_above(p)) == [[0.0, 1.0, 1.0, 1.0]]


def test_tampo_drops_no_token_of_a_completion_without_a_positive_advantage():
    # The same token (p = 0.1, H = 0.2, under both thresholds) in a completion with A = 1, A = 0 and A = -1.
    mask = torch.ones(3, 2, dtype=torch.bool)
    result = apply_credit_method(
        "tampo",
        torch.tensor([1.0, 0.0, -1.0]),
        mask,
        policy_logps=torch.log(torch.tensor([[0.1, 0.9]] * 3)),
        policy_entropy=torch.full((3, 2), 0.2),
        tampo_prob_threshold=0.5,
        tampo_entropy_threshold=1.0,
    )
    assert result.loss_mask_BT.tolist() == [[0.0, 1.0], [1.0, 1.0], [1.0, 1.0]]


def test_entropy_adv_counts_a_bonus_equal_to_its_bound_as_unbounded():
    # alpha H = 0.2 * 0.5 = 0.1 = |A| / kappa = 0.2 / 2 exactly in float32; the other token's bonus 0.2 * 2 is bounded.
    result = apply_credit_method(
        "entropy_adv",
        torch.tensor([0.2]),
        torch.ones(1, 2, dtype=torch.bool),
        policy_entropy=torch.tensor([[0.5, 2.0]]),
        entropy_adv_alpha=0.2,
        entropy_adv_kappa=2.0,
    )
    bounded, valid = result.metrics["bounded_fraction"]
    assert bounded.tolist() == [[False, True]] and valid.all()
    torch.testing.assert_close(result.advantages_BT, torch.tensor([[0.3, 0.3]]))


def test_clip_cov_bounds_exclude_a_covariance_equal_to_either_bound():
    # Candidates have lb < cov < ub (verl's compute_policy_loss_clip_cov); here the means are A = 0 and log p = -2, so
    # cov = A (log p + 2) is -1, 0 or 1 (no token clipped: the policy is the rollout policy), and the bounds sit
    # exactly on -1 and 1.
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    logps = torch.tensor([[-3.0, -1.0], [-2.0, -2.0], [-1.0, -3.0], [-2.0, -2.0]])
    result = apply_credit_method(
        "clip_cov",
        advantages,
        torch.ones(4, 2, dtype=torch.bool),
        policy_logps=logps,
        rollout_logps=logps,
        clip_cov_lb=-1.0,
        clip_cov_ub=1.0,
        clip_cov_ratio=1.0,
    )
    candidates, _ = result.metrics["candidate_fraction"]
    torch.testing.assert_close(result.statistic_BT, torch.tensor([[-1.0, 1.0], [0.0, 0.0], [-1.0, 1.0], [0.0, 0.0]]))
    assert candidates.tolist() == [[False, False], [True, True], [False, False], [True, True]]


def test_tampo_drops_a_token_whose_probability_and_entropy_equal_the_thresholds():
    # TACO's dp_actor.py truncates where p <= p_max and H <= H_max: at both equalities the token leaves the loss.
    logps = torch.tensor([[-1.5, -0.1]])
    p = logps[0, 0].exp().item()  # float32, as the method computes it
    result = apply_credit_method(
        "tampo",
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        policy_logps=logps,
        policy_entropy=torch.tensor([[0.5, 0.5]]),
        tampo_prob_threshold=p,
        tampo_entropy_threshold=0.5,
    )
    assert result.loss_mask_BT.tolist() == [[0.0, 1.0]]


def test_stare_on_a_micro_batch_of_one_valid_token():
    # The gate reads the generation batch's mean entropy at the micro-batch's valid positions: here there is one.
    mask = torch.tensor([[True, False], [False, False]])
    result = apply_credit_method(
        "stare",
        torch.tensor([1.0, -1.0]),
        mask,
        policy_logps=torch.tensor([[-2.0, 0.0], [0.0, 0.0]]),
        rollout_mean_entropy=torch.tensor([[0.5, 0.0], [0.0, 0.0]]),
        stare_target_entropy=1.0,
        stare_reweight_w=1.5,
        stare_top_p_ratio=1.0,
    )
    torch.testing.assert_close(result.advantages_BT, torch.tensor([[1.5, 0.0], [0.0, 0.0]]))


def test_eapo_weights_stay_finite_and_average_one_at_a_large_kappa():
    # kappa = 60: exp(kappa h) overflows float32 from h ~ 1.5 / 60 past the shift by each row's largest exponent.
    entropy = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    result = eapo_advantages(torch.tensor([1.0, -1.0]), mask, rollout_entropy=entropy, eapo_kappa=60.0)
    weights = result.advantages_BT / torch.tensor([[1.0], [-1.0]])
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights.mean(dim=1), torch.ones(2))
    assert weights[0, 3] > 0.99 and weights[1, 3] > 0.99  # the highest entropy wins a success, the lowest a failure


@pytest.mark.parametrize("missing", ["completion_ids_BT", "group_index_B"])
def test_gtpo_without_its_ids_or_groups_is_a_clear_error(missing):
    named = dict(
        rollout_entropy=torch.ones(2, 2),
        completion_ids_BT=torch.tensor([[1, 2], [1, 3]]),
        group_index_B=torch.tensor([0, 0]),
        pad_token_id=0,
    )
    named[missing] = None
    message = "credit method 'gtpo' reads the completion ids and the prompt groups; the batch has none"
    with pytest.raises(ValueError, match=f"^{message}$"):
        apply_credit_method("gtpo", torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool), **named)


@pytest.mark.parametrize("missing", ["completion_ids_BT", "token_texts"])
def test_hicra_without_its_ids_or_texts_is_a_clear_error(missing):
    named = dict(completion_ids_BT=torch.tensor([[1, 2]]), token_texts=lambda ids: [f" w{i}" for i in ids])
    named[missing] = None
    message = "credit method 'hicra' reads the completion ids and their decoded texts; the batch has none"
    with pytest.raises(ValueError, match=f"^{message}$"):
        apply_credit_method("hicra", torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), **named)


def test_taco_puts_a_token_with_zero_tail_risk_outside_the_tail():
    # alpha = 1: r = -log p - H, exactly 0 for (log p, H) = (-1, 1) in float32, 1 for (-2, 1): the tail is r > 0.
    result = apply_credit_method(
        "taco",
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        policy_logps=torch.tensor([[-1.0, -2.0]]),
        policy_entropy=torch.tensor([[1.0, 1.0]]),
        taco_alpha=1.0,
    )
    assert result.statistic_BT.tolist() == [[0.0, 1.0]]
    assert result.metrics["tail_fraction"].tolist() == [[0.0, 1.0]]


def test_minp_support_puts_a_token_with_zero_margin_inside_the_set():
    # A logit gap of exactly log(min_p) (in float32) is on the edge of the min-p set, and inside it: m >= 0.
    min_p = 0.1
    gap = torch.tensor([[math.log(min_p), math.log(min_p) - 1.0]])
    result = apply_credit_method(
        "minp_support",
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        policy_logit_gap=gap,
        minp_support_min_p=min_p,
    )
    inside, positive = result.metrics["in_support_fraction_pos"]
    assert result.statistic_BT[0, 0] == 0.0 and inside.tolist() == [[True, False]] and positive.all()


def test_stare_gate_is_off_at_an_entropy_equal_to_the_target():
    # The official controller: gate_on = H_bar < target (hp-luo/STARE's core_algos.py), strictly.
    def advantages(target):
        return apply_credit_method(
            "stare",
            torch.tensor([1.0]),
            torch.ones(1, 2, dtype=torch.bool),
            policy_logps=torch.tensor([[-2.0, -1.0]]),
            rollout_mean_entropy=torch.full((1, 2), 0.5),
            stare_target_entropy=target,
            stare_reweight_w=1.5,
            stare_top_p_ratio=0.5,
        ).advantages_BT.tolist()

    assert advantages(0.5) == [[1.0, 1.0]]
    assert advantages(_next_float32_above(0.5)) == [[1.5, 1.0]]


def test_tide_accepts_a_vocabulary_of_two_and_refuses_one():
    named = dict(reference_deviation=torch.tensor([[0.1, 0.2]]), rollout_entropy=torch.tensor([[0.3, 0.6]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    result = tide_advantages(torch.tensor([1.0]), mask, vocab_size=2, **named)
    torch.testing.assert_close(
        result.advantages_BT, tide_loop(torch.tensor([1.0]), *named.values(), mask, 2, 0.5, 1.0)
    )
    with pytest.raises(ValueError, match=r"tide needs the vocabulary size \|V\| >= 2 for its entropy gate, got 1"):
        tide_advantages(torch.tensor([1.0]), mask, vocab_size=1, **named)


def test_high_entropy_keeps_the_earliest_of_tied_tokens():
    # 40 valid tokens of one entropy, k = max(1, int(0.2 * 40 + 0.9999)) = 8: the official stable sort keeps the first
    # 8 in row-major order (an unstable sort of more than 16 equal keys need not).
    mask = torch.ones(2, 20, dtype=torch.bool)
    result = apply_credit_method(
        "high_entropy",
        torch.tensor([1.0, 1.0]),
        mask,
        policy_entropy=torch.full((2, 20), 0.7),
        high_entropy_top_ratio=0.2,
    )
    kept = torch.zeros(2, 20)
    kept[0, :8] = 1.0
    assert result.loss_mask_BT.tolist() == kept.tolist()

"""What each registered method returns besides its advantages: the per-token statistic of the token-credit view (the
"Token statistic:" of its docstring), against the definition the docstring gives, worked from the batch's statistics
and the reference rules of `reference_credit.py`, on `random_reference_batch` under `MOVING_SETTINGS`.

The registry drives the test: a method that declares a token statistic and has no reference here fails, and one that
declares none must return none."""

import math

import pytest
import torch
from accelerate import Accelerator
from conftest import PACKAGE_METHODS
from reference_credit import (
    MOVING_SETTINGS,
    REFERENCE_RULES,
    ReferenceBatch,
    _quantile,
    random_reference_batch,
    resolved_hyperparameters,
)
from reference_formulas import gtpo_loop

from trl_credit.methods import CREDIT_METHODS, CreditBatch, StackCredit, apply_credit_method
from trl_credit.trainer.diagnostics import credit_metrics


def _with_advantages(batch: ReferenceBatch, advantages_B: torch.Tensor) -> ReferenceBatch:
    """`batch` started again from the sequence advantages `advantages_B` (every other field kept)."""
    return ReferenceBatch.start(
        advantages_B,
        batch.mask_BT,
        statistics=batch.statistics,
        vocab_size=batch.vocab_size,
        group_index_B=batch.group_index_B,
        rewards_B=batch.rewards_B,
        completion_ids_BT=batch.completion_ids_BT,
        pad_token_id=batch.pad_token_id,
        token_texts=batch.token_texts,
    )


def _eapo_normalized_entropy(b, hp):
    entropy_BT = b["rollout_entropy"]
    valid = entropy_BT[b.mask_BT].tolist()
    low, high = (_quantile(valid, q) for q in hp["eapo_quantiles"])
    return ((entropy_BT - low) / (high - low)).clamp(0.0, 1.0)


def _clip_cov_covariance(b, hp):
    weights_BT = b.loss_weights_BT
    logps_BT = b["policy_logps"]
    mean_a = (b.advantages_BT * weights_BT).sum() / weights_BT.sum()
    mean_logp = (logps_BT * weights_BT).sum() / weights_BT.sum()
    return (b.advantages_BT - mean_a) * (logps_BT - mean_logp)


def _gtpo_conflict_factor(b, hp):
    """d: GTPO's loop without normalisation, entropy filter or shaping, over `A_i` (1 where `A_i = 0`)."""
    pad_id = hp["gtpo_pad_id"] if hp["gtpo_pad_id"] is not None else b.pad_token_id
    unshaped_BT = gtpo_loop(
        b.sequence_advantages_B,
        b.completion_ids_BT,
        b.mask_BT,
        b["rollout_entropy"],
        b.group_index_B.tolist(),
        pad_id,
        weight=hp["gtpo_conflict_weight"],
        threshold=math.inf,
        scale=0.0,
        normalize=False,
    )
    a_B = b.sequence_advantages_B.view(-1, 1)
    return torch.where(a_B != 0, unshaped_BT / torch.where(a_B != 0, a_B, 1.0), 1.0)


def _otb_baseline(b, hp):
    advantages_BT, _ = REFERENCE_RULES["otb"](b, hp)
    return b.rewards_B.view(-1, 1) - advantages_BT


def _hicra_planning(b, hp):
    """1 where a unit advantage grows under HICRA's rule."""
    grown_BT, _ = REFERENCE_RULES["hicra"](_with_advantages(b, torch.ones_like(b.sequence_advantages_B)), hp)
    return (grown_BT > 1.0).double()


# method: its token statistic at the valid positions of a batch, by the definition its docstring gives.
TOKEN_STATISTICS = {
    "ar_lopti": lambda b, hp: b["rollout_logps"].exp(),
    "clip_cov": _clip_cov_covariance,
    "eapo": _eapo_normalized_entropy,
    "entropy_adv": lambda b, hp: torch.minimum(
        hp["entropy_adv_alpha"] * b["policy_entropy"], b.advantages_BT.abs() / hp["entropy_adv_kappa"]
    ),
    "gtpo": _gtpo_conflict_factor,
    "hicra": _hicra_planning,
    "high_entropy": lambda b, hp: b["policy_entropy"],
    "minp_support": lambda b, hp: b["policy_logit_gap"] - math.log(hp["minp_support_min_p"]),
    "otb": _otb_baseline,
    "stapo": lambda b, hp: b["policy_entropy"],
    "stare": lambda b, hp: -b["policy_logps"],
    "taco": lambda b, hp: -b["policy_logps"] - b["policy_entropy"] + math.log(hp["taco_alpha"]),
    "tampo": lambda b, hp: b["policy_entropy"],
    "tide": lambda b, hp: b["reference_deviation"],
}


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
        f"{name!r} declares the token statistic {method.token_statistic}: add its definition"
    )
    assert result.statistic_BT is not None and result.statistic_BT.shape == mask_BT.shape
    want_BT = TOKEN_STATISTICS[name](batch, resolved_hyperparameters(name, settings))
    torch.testing.assert_close(result.statistic_BT.double()[mask_BT], want_BT[mask_BT], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------- the logged metrics


def _share(selected_BT, among_BT) -> float:
    return float((selected_BT & among_BT).sum()) / float(among_BT.sum())


def _mean(values_BT, mask_BT) -> float:
    return float(values_BT[mask_BT].mean())


def _reference(name, b, hp):
    """The reference rule's advantages and loss weights (the incoming weights where it drops nothing)."""
    advantages_BT, loss_mask_BT = REFERENCE_RULES[name](b, hp)
    return advantages_BT, b.loss_weights_BT if loss_mask_BT is None else loss_mask_BT


def _positive(b):
    return b.mask_BT & (b.advantages_BT > 0)


def _dropped_metrics(name, b, hp):
    _, weights_BT = _reference(name, b, hp)
    dropped_BT = b.mask_BT & (weights_BT == 0)
    return {
        "dropped_fraction": _share(dropped_BT, b.mask_BT),
        "dropped_fraction_pos": _share(dropped_BT, _positive(b)),
    }


def _stapo_metrics(b, hp):
    source = _positive(b) if hp["stapo_only_positive_advantage"] else b.mask_BT
    threshold = _quantile(b["policy_entropy"][source].tolist(), hp["stapo_entropy_quantile"])
    return {**_dropped_metrics("stapo", b, hp), "entropy_threshold": threshold}


def _clip_cov_metrics(b, hp):
    """verl draws max(int(ratio x the loss weights' sum), 1) of the candidates (all of them if fewer) and zeroes them."""
    ratio_BT = (b["policy_logps"] - b["rollout_logps"]).exp()
    low, high = b.clip_range
    clipped_BT = -b.advantages_BT * ratio_BT.clamp(1 - low, 1 + high) > -b.advantages_BT * ratio_BT
    covariance_BT = _clip_cov_covariance(b, hp)
    candidates_BT = b.mask_BT & ~clipped_BT & (covariance_BT > hp["clip_cov_lb"]) & (covariance_BT < hp["clip_cov_ub"])
    drawn = min(max(int(hp["clip_cov_ratio"] * float(b.loss_weights_BT.sum())), 1), int(candidates_BT.sum()))
    return {
        "detached_fraction": drawn / float(b.mask_BT.sum()),
        "candidate_fraction": _share(candidates_BT, b.mask_BT),
    }


def _entropy_adv_metrics(b, hp):
    bonus_BT = hp["entropy_adv_alpha"] * b["policy_entropy"]
    bound_BT = b.advantages_BT.abs() / hp["entropy_adv_kappa"]
    return {
        "mean_bonus": _mean(torch.minimum(bonus_BT, bound_BT), b.mask_BT),
        "bounded_fraction": _share(bound_BT < bonus_BT, b.mask_BT),
    }


def _gtpo_metrics(b, hp):
    d_BT = _gtpo_conflict_factor(b, hp)
    a_B = b.sequence_advantages_B.view(-1, 1)
    positive_BT, negative_BT = (a_B > 0).expand_as(d_BT), (a_B < 0).expand_as(d_BT)
    # d is W (W^2 where both runs meet) on a positive conflict and 0 on a negative one: W = 2 here, never 1.
    assert hp["gtpo_conflict_weight"] != 1.0
    conflict_BT = (positive_BT & (d_BT != 1)) | (negative_BT & (d_BT == 0))
    row_entropy_B = torch.stack(
        [b["rollout_entropy"][i][b.mask_BT[i]].mean() for i in range(b.mask_BT.size(0))]
    ).nan_to_num(0.0)
    row_entropy_BT = row_entropy_B.view(-1, 1).expand_as(d_BT)
    return {
        "conflict_fraction": _share(conflict_BT, b.mask_BT),
        "skipped_fraction": _share(conflict_BT & ~positive_BT, b.mask_BT),
        "amplified_fraction": _share(conflict_BT & positive_BT, b.mask_BT),
        "filtered_fraction": _share(row_entropy_BT > hp["gtpo_entropy_threshold"], b.mask_BT),
        "mean_entropy": _mean(row_entropy_BT, b.mask_BT),
    }


def _hicra_metrics(b, hp):
    planning_BT = _hicra_planning(b, hp).bool()
    rows = [i for i in range(b.mask_BT.size(0)) if b.mask_BT[i].any()]
    return {
        "planning_fraction": _share(planning_BT, b.mask_BT),
        "planning_fraction_pos": _share(planning_BT, _positive(b)),
        "completions_with_planning": sum(bool((planning_BT[i] & b.mask_BT[i]).any()) for i in rows) / len(rows),
    }


def _high_entropy_metrics(b, hp):
    _, weights_BT = _reference("high_entropy", b, hp)
    return {"entropy_threshold": float(b["policy_entropy"][b.mask_BT & (weights_BT > 0)].min())}


def _minp_metrics(b, hp):
    _, weights_BT = _reference("minp_support", b, hp)
    margin_BT = b["policy_logit_gap"] - math.log(hp["minp_support_min_p"])
    return {
        "support_weight": _mean(weights_BT, b.mask_BT),
        "in_support_fraction_pos": _share(margin_BT >= 0, _positive(b)),
        "margin_mean_pos": _mean(margin_BT, _positive(b)),
    }


def _otb_metrics(b, hp):
    w_BT = (b["rollout_unsampled_mass"] ** 2 + b["rollout_unsampled_sum_sq_probs"]) * b.mask_BT
    lengths = b.mask_BT.sum(dim=1).tolist()
    zero_tail_BT = torch.zeros_like(b.mask_BT)
    for group in b.group_index_B.unique().tolist():
        rows = [i for i in range(len(lengths)) if b.group_index_B[i] == group]
        ranked = sorted(lengths[i] for i in rows)
        if len(rows) > 1 and hp["otb_handle_zero_tail"] and ranked[-1] > ranked[-2]:
            longest = next(i for i in rows if lengths[i] == ranked[-1])
            zero_tail_BT[longest, ranked[-2] :] = True
    return {
        "mean_baseline": _mean(_otb_baseline(b, hp), b.mask_BT),
        "mean_path_variance": _mean(w_BT.cumsum(dim=1), b.mask_BT),
        "zero_tail_fraction": _share(zero_tail_BT, b.mask_BT),
    }


def _stare_metrics(b, hp):
    advantages_BT, _ = _reference("stare", b, hp)
    batch_entropy = float(b["rollout_mean_entropy"][b.mask_BT][0])
    gate_on = batch_entropy < hp["stare_target_entropy"]
    surprisal_BT = -b["policy_logps"]

    def highest(sign_BT):
        """The ceil(ratio x count) highest surprisals among `sign_BT` (STARE's top-p of each sign)."""
        values = sorted(surprisal_BT[sign_BT].tolist(), reverse=True)
        count = math.ceil(hp["stare_top_p_ratio"] * len(values))
        return sign_BT & (surprisal_BT >= values[count - 1]) if count else torch.zeros_like(sign_BT)

    l_plus_BT = highest(_positive(b))
    l_minus_BT = (
        highest(b.mask_BT & (b.advantages_BT < 0)) if hp["stare_variant"] == "C2" else torch.zeros_like(l_plus_BT)
    )
    reweighted_BT = (advantages_BT != b.advantages_BT) & b.mask_BT
    return {
        "gate_on": float(gate_on),
        "batch_entropy": batch_entropy,
        "target_entropy": hp["stare_target_entropy"],
        "reweighted_fraction": _share(reweighted_BT, b.mask_BT),
        "positive_selected_fraction": _share(l_plus_BT, b.mask_BT),
        "negative_selected_fraction": _share(l_minus_BT, b.mask_BT),
    }


def _taco_metrics(b, hp):
    risk_BT = TOKEN_STATISTICS["taco"](b, hp)
    return {
        "tail_fraction": _share(risk_BT > 0, b.mask_BT),
        "tail_fraction_pos": _share(risk_BT > 0, _positive(b)),
        "mean_tail_risk": _mean(risk_BT, b.mask_BT),
        "pos_adv_fraction": _share(_positive(b), b.mask_BT),
    }


def _tide_metrics(b, hp):
    deviation_BT = b["reference_deviation"]
    gate_BT = (b["rollout_entropy"] / math.log(b.vocab_size)).clamp(0, 1)
    return {
        "mean_deviation": _mean(deviation_BT, b.mask_BT),
        "mean_gate": _mean(gate_BT, b.mask_BT),
        "mean_score": _mean(deviation_BT * gate_BT ** hp["tide_kappa"], b.mask_BT),
    }


# method: the value of each metric it logs, by the definition its docstring gives.
METRICS = {
    "ar_lopti": lambda b, hp: {"prob_mean": _mean(b["rollout_logps"].exp(), b.mask_BT)},
    "clip_cov": _clip_cov_metrics,
    "eapo": lambda b, hp: {
        "q_lo": _quantile(b["rollout_entropy"][b.mask_BT].tolist(), hp["eapo_quantiles"][0]),
        "q_hi": _quantile(b["rollout_entropy"][b.mask_BT].tolist(), hp["eapo_quantiles"][1]),
        "kappa": hp["eapo_kappa"],  # step 0: no decay yet
    },
    "entropy_adv": _entropy_adv_metrics,
    "gtpo": _gtpo_metrics,
    "hicra": _hicra_metrics,
    "high_entropy": _high_entropy_metrics,
    "minp_support": _minp_metrics,
    "otb": _otb_metrics,
    "stapo": _stapo_metrics,
    "stare": _stare_metrics,
    "taco": _taco_metrics,
    "tampo": lambda b, hp: _dropped_metrics("tampo", b, hp),
    "tide": _tide_metrics,
}


@pytest.fixture(scope="module")
def accelerator():
    return Accelerator(cpu=True)


def _with_tied_group_0(batch: ReferenceBatch) -> ReferenceBatch:
    """`batch` with the advantages of prompt group 0 set to 0 (equal rewards): no token there is positive."""
    return _with_advantages(batch, batch.sequence_advantages_B.masked_fill(batch.group_index_B == 0, 0.0))


@pytest.mark.parametrize("case", ["seed 0", "seed 1", "a tied group"])
@pytest.mark.parametrize("name", list(PACKAGE_METHODS))
def test_the_logged_metrics_are_the_ones_the_docstring_defines(accelerator, name, case):
    """`name/metric` as the trainer logs it (`credit_metrics`, one process), for every metric the method declares."""
    method = CREDIT_METHODS[name]
    if not method.diagnostics:
        return
    assert name in METRICS, f"{name!r} logs {sorted(method.diagnostics)}: add their definitions to METRICS"
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

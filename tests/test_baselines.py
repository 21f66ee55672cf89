"""The papers' baselines: hand-worked cases from the official formulas, edge cases, the trainer and the CLI.

Every expected value below is derived in the comments from the rule in the official code named in each method's
file (xiuyilou/TACO `dp_actor.py` for STAPO, TAMPO, the min-p weight and AR-Lopti; verl `core_algos.py` for
Clip-Cov; Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR for 80/20; the paper for EntropyAdv).
"""

import dataclasses
import math

import pytest
import torch
from conftest import naive_logprobs, sampled, tiny_recipe, train_changing_every_parameter
from reference_credit import ReferenceBatch, assert_credit_moved, reference_stack
from trainer_helpers import LossRecorder
from trl import GRPOTrainer

from trl_credit import CreditGRPOConfig, CreditGRPOTrainer
from trl_credit.methods import CREDIT_METHODS
from trl_credit.methods.ar_lopti import ar_lopti_advantages
from trl_credit.methods.clip_cov import clip_cov_advantages
from trl_credit.methods.entropy_adv import entropy_adv_advantages
from trl_credit.methods.high_entropy import high_entropy_advantages, high_entropy_count
from trl_credit.methods.minp_support import minp_support_advantages
from trl_credit.methods.stapo import stapo_advantages
from trl_credit.methods.tampo import tampo_advantages
from trl_credit.trainer.lm_head_statistics import token_statistics

BASELINES = ["stapo", "tampo", "minp_support", "ar_lopti", "clip_cov", "high_entropy", "entropy_adv"]
PAPERS = {
    "stapo": "2602.15620",
    "tampo": "2607.07976",
    "minp_support": "2607.07976",
    "ar_lopti": "2505.12929",
    "clip_cov": "2505.22617",
    "high_entropy": "2506.01939",
    "entropy_adv": "2506.14758",
}
L = math.log


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def _threshold(result):
    """The entropy threshold a method logged for its one micro-batch."""
    return result.metrics["entropy_threshold"][0].item()


# ------------------------------------------------------------------------------------------------ STAPO


def test_stapo_hand_worked():
    # Row 0 has A = +1 (4 valid tokens), row 1 has A = -1 (3 valid tokens, the last position is padding).
    advantages = _t([1, -1])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    probs = _t([[0.001, 0.5, 0.001, 0.0015], [0.001, 0.001, 0.5, 1.0]])
    entropy = _t([[0.1, 0.2, 3.0, 0.05], [0.01, 0.01, 0.01, 9.0]])
    # Candidates: the 4 positive tokens; their entropies sorted: [0.05, 0.1, 0.2, 3.0].
    # q = 0.1: position 0.1 * 3 = 0.3 -> 0.05 + 0.3 * (0.1 - 0.05) = 0.065. Spurious: p < 0.002 and H < 0.065 ->
    # only token (0, 3) (p 0.0015, H 0.05); token (0, 0) has H 0.1. Row 1 is negative: never a candidate.
    statistics = dict(policy_logps=probs.log(), policy_entropy=entropy)
    result = stapo_advantages(advantages, mask, **statistics)
    assert _threshold(result) == pytest.approx(0.065)
    torch.testing.assert_close(result.advantages_BT, _t([[1, 1, 1, 0], [-1, -1, -1, 0]]))
    torch.testing.assert_close(result.loss_mask_BT, _t([[1, 1, 1, 0], [1, 1, 1, 1]]))
    # q = 0.5: position 1.5 -> 0.1 + 0.5 * (0.2 - 0.1) = 0.15: tokens (0, 0) and (0, 3) are spurious.
    result = stapo_advantages(advantages, mask, **statistics, stapo_entropy_quantile=0.5)
    assert _threshold(result) == pytest.approx(0.15)
    torch.testing.assert_close(result.loss_mask_BT, _t([[0, 1, 1, 0], [1, 1, 1, 1]]))
    # Every valid token a candidate (stapo_only_positive_advantage=False): 7 entropies sorted
    # [0.01, 0.01, 0.01, 0.05, 0.1, 0.2, 3.0], q = 0.5 -> position 3 -> 0.05. H < 0.05 and p < 0.002: (1, 0), (1, 1).
    result = stapo_advantages(
        advantages, mask, **statistics, stapo_entropy_quantile=0.5, stapo_only_positive_advantage=False
    )
    assert _threshold(result) == pytest.approx(0.05)
    torch.testing.assert_close(result.loss_mask_BT, _t([[1, 1, 1, 1], [0, 0, 1, 1]]))
    torch.testing.assert_close(result.advantages_BT, _t([[1, 1, 1, 1], [0, 0, -1, 0]]))


def test_stapo_edge_cases():
    probs, entropy = _t([[0.001, 0.001, 0.001]]), _t([[0.1, 0.2, 0.3]])
    # No positive token: the quantile falls back to every valid token (0.1 + 0.2 * (0.2 - 0.1) = 0.12 at q = 0.1),
    # but there is no candidate, so nothing is dropped.
    result = stapo_advantages(_t([-1]), torch.ones(1, 3), policy_logps=probs.log(), policy_entropy=entropy)
    assert _threshold(result) == pytest.approx(0.12)
    assert result.loss_mask_BT.eq(1).all() and result.advantages_BT.eq(-1).all()
    # Ties: every candidate has the same entropy, so the quantile equals it and `H < quantile` holds for none.
    result = stapo_advantages(_t([1]), torch.ones(1, 3), policy_logps=probs.log(), policy_entropy=_t([[0.3] * 3]))
    assert _threshold(result) == pytest.approx(0.3) and result.loss_mask_BT.eq(1).all()
    # Every token masked (NaN padding included): threshold 0, nothing dropped, zeros out.
    result = stapo_advantages(
        _t([1]), torch.zeros(1, 2), policy_logps=_t([[math.nan, 0]]), policy_entropy=_t([[0, 0]])
    )
    assert _threshold(result) == 0.0 and result.advantages_BT.eq(0).all() and result.loss_mask_BT.eq(1).all()
    with pytest.raises(ValueError, match="stapo_entropy_quantile must be in"):
        stapo_advantages(
            _t([1]), torch.ones(1, 1), policy_logps=_t([[0]]), policy_entropy=_t([[0]]), stapo_entropy_quantile=1.0
        )


# ------------------------------------------------------------------------------------------------ TAMPO


def test_tampo_hand_worked_and_edges():
    advantages = _t([2, -2])
    mask = torch.ones(2, 4)
    probs = _t([[0.001, 0.001, 0.5, 0.001], [0.001, 0.001, 0.001, 0.001]])
    entropy = _t([[0.5, 0.6, 0.1, 0.0], [0.1, 0.1, 0.1, 0.1]])
    # Truncated: A > 0, p <= 0.002, H <= 0.5. Token (0, 0) has H == 0.5 exactly: truncated (the rule is <=, unlike
    # STAPO's strict <). (0, 1): H 0.6 > 0.5 kept. (0, 2): p 0.5 kept. (0, 3): truncated. Row 1 negative: kept.
    result = tampo_advantages(advantages, mask, policy_logps=probs.log(), policy_entropy=entropy)
    torch.testing.assert_close(result.loss_mask_BT, _t([[0, 1, 1, 0], [1, 1, 1, 1]]))
    torch.testing.assert_close(result.advantages_BT, _t([[0, 2, 2, 0], [-2, -2, -2, -2]]))
    # No positive token: nothing dropped.
    result = tampo_advantages(-advantages.abs(), mask, policy_logps=probs.log(), policy_entropy=entropy)
    assert result.loss_mask_BT.eq(1).all()
    # All tokens dropped: every token positive, improbable and confident.
    result = tampo_advantages(
        advantages.abs(), mask, policy_logps=probs.log(), policy_entropy=torch.zeros(2, 4), tampo_prob_threshold=1.0
    )
    assert result.loss_mask_BT.eq(0).all() and result.advantages_BT.eq(0).all()


# ------------------------------------------------------------------------------------------------ min-p support


def test_minp_support_hand_worked():
    advantages = _t([[1, 1, 1, -1]])
    mask = torch.ones(1, 4)
    # Most likely token p = 0.8 everywhere. Sampled p: 0.5 (ratio 0.625 >= 0.1: inside the min-p set, w = 1),
    # 0.05 (margin m = log(0.05 / 0.8) - log(0.1) = log(0.625) = -0.4700, w = 0.2 + 0.8 * exp(-0.4700 / 0.2)),
    # 0.08 (ratio exactly 0.1: m = 0, w = 1), and 0.0008 on a negative token (not weighted: w = 1).
    probs, max_probs = _t([[0.5, 0.05, 0.08, 0.0008]]), torch.full((1, 4), 0.8)
    logit_gap = (probs / max_probs).log()  # z_y - max z = log p_y - log max p
    weights = minp_support_advantages(_t([1]), mask, advantages_BT=advantages, policy_logit_gap=logit_gap).loss_mask_BT
    expected_outside = 0.2 + 0.8 * math.exp(math.log(0.625) / 0.2)  # 0.2763
    torch.testing.assert_close(weights, _t([[1, expected_outside, 1, 1]]), atol=1e-5, rtol=1e-5)
    # Every token weighted (only_positive=False): the negative token's m = log(0.001) - log(0.1) = log(0.01),
    # w = 0.2 + 0.8 * 0.01 ** 5 (= 0.2 up to 1e-10).
    weights = minp_support_advantages(
        _t([1]),
        mask,
        advantages_BT=advantages,
        policy_logit_gap=logit_gap,
        minp_support_only_positive_advantage=False,
    ).loss_mask_BT
    assert weights[0, 3].item() == pytest.approx(0.2 + 0.8 * 0.01**5, abs=1e-6)
    # No positive token: every weight 1. Masked positions: 1 (the loss mask already removes them).
    weights = minp_support_advantages(_t([-1]), torch.tensor([[1, 1, 0, 0]]), policy_logit_gap=logit_gap).loss_mask_BT
    assert weights.eq(1).all()


def test_streamed_logit_gap_equals_full_logits():
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(13, 8), torch.randn(40, 8), torch.randn(40)
    ids = torch.randint(40, (13,))
    for temperature in (1.0, 0.6):
        logits = (hidden @ weight.T + bias) / temperature
        full = logits.gather(1, ids.unsqueeze(1)).squeeze(1) - logits.amax(-1)
        streamed = token_statistics(
            hidden, weight, ids, bias, temperature=temperature, token_chunk_size=4, vocab_chunk_size=7
        ).logit_gap
        torch.testing.assert_close(streamed, full, atol=1e-5, rtol=1e-5)


def test_minp_reads_the_raw_logit_gap_as_the_official_code():
    """The official weight from float32 logits at a sharp tau: the gap read from the logits gives it to float32
    rounding; a difference of two float32 log-probs (the same number in exact arithmetic) departs by far more."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 32000, generator=g)  # a flat distribution: log-probs near -10
    min_p, tau, w_min = 0.1, 0.001, 0.2
    # In each row a token just outside the min-p set (margin in (-3 tau, 0)), where the weight is steep.
    ids = torch.randint(1, 32000, (64,), generator=g)
    logits[:, 0] = logits.amax(-1) + 0.5
    margin_wanted = -3 * tau * torch.rand(64, generator=g)
    logits[torch.arange(64), ids] = logits[:, 0] + math.log(min_p) + margin_wanted
    gap = logits.gather(1, ids.unsqueeze(1)).squeeze(1) - logits.amax(-1)
    # Official: margin = gap - log(min_p) (a float32 tensor), w = w_min + (1 - w_min) exp(min(margin, 0) / tau).
    margin = gap - torch.log(torch.tensor(min_p))
    official = w_min + (1 - w_min) * torch.exp(torch.clamp(margin, max=0.0) / tau)
    assert ((official > w_min + 0.01) & (official < 0.99)).sum() > 10
    settings = dict(minp_support_min_p=min_p, minp_support_tau=tau, minp_support_min_weight=w_min)

    def weights(logit_gap):
        return minp_support_advantages(
            torch.ones(64), torch.ones(64, 1), policy_logit_gap=logit_gap.unsqueeze(1), **settings
        ).loss_mask_BT.squeeze(1)

    assert (weights(gap) - official).abs().max().item() <= 1e-6
    logp = torch.log_softmax(logits, -1)
    from_logps = logp.gather(1, ids.unsqueeze(1)).squeeze(1) - logp.amax(-1)
    assert (weights(from_logps) - official).abs().max().item() > 1e-6


# ------------------------------------------------------------------------------------------------ AR-Lopti


def test_ar_lopti_hand_worked():
    # w = (1 - 0.1) + 0.1 * p_old, on both signs: A = 2, p = 0.5 -> 2 * 0.95 = 1.9; A = -1, p = 0.1 -> -0.91;
    # A = -1, p = 1 -> -1; the masked position stays 0.
    advantages = _t([2, -1])
    probs = _t([[0.5, 0.5], [0.1, 1.0]])
    out = ar_lopti_advantages(advantages, torch.tensor([[1, 0], [1, 1]]), rollout_logps=probs.log()).advantages_BT
    torch.testing.assert_close(out, _t([[1.9, 0], [-0.91, -1]]))
    grpo = ar_lopti_advantages(advantages, torch.ones(2, 2), rollout_logps=probs.log(), ar_lopti_alpha=0.0)
    torch.testing.assert_close(grpo.advantages_BT, _t([[2, 2], [-1, -1]]))


# ------------------------------------------------------------------------------------------------ Clip-Cov


def test_clip_cov_hand_worked():
    # One micro-batch: A = [2, 2, -2, -2] (mean 0), log p = [0, -1, -3, -5] (mean -2.25), and a padded position
    # holding NaN, which no mean may see. cov = A * (log p + 2.25) = [4.5, 2.5, 1.5, 5.5]; (lb, ub) = (1, 5) keeps
    # tokens 0, 1, 2 (5.5 >= ub).
    advantages = _t([[2, 2, -2, -2, 0]])
    logps = _t([[0, -1, -3, -5, math.nan]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])

    # Old log-probs equal: ratio 1, nothing PPO-clipped. ratio 1.0 -> n = max(int(1.0 * 4), 1) = 4 >= 3 candidates:
    # all three are detached.
    def clip_cov(old_logps, **settings):
        result = clip_cov_advantages(
            None, mask, advantages_BT=advantages, policy_logps=logps, rollout_logps=old_logps, **settings
        )
        return result.advantages_BT, result.metrics["detached_fraction"][0], result.metrics["candidate_fraction"][0]

    out, detached, candidates = clip_cov(logps, clip_cov_ratio=1.0)
    torch.testing.assert_close(out, _t([[0, 0, 0, -2, 0]]))
    assert candidates.tolist() == [[True, True, True, False, False]]
    # Token 0: A > 0 with r = e > 1 + 0.28; token 2: A < 0 with r = 1/e < 1 - 0.2: PPO clips both, so they are no
    # candidates; token 1 (r = 1) is the only one. The default ratio 2e-4 gives n = max(int(0.0008), 1) = 1.
    old = _t([[-1, -1, -2, -5, 0]])
    out, detached, candidates = clip_cov(old, clip_range=(0.2, 0.28))
    torch.testing.assert_close(out, _t([[2, 0, -2, -2, 0]]))
    assert detached.tolist() == [[False, True, False, False, False]]
    # No candidate (bounds above every covariance): nothing changes.
    out, detached, _ = clip_cov(logps, clip_cov_lb=10.0, clip_cov_ub=20.0)
    torch.testing.assert_close(out, torch.where(mask.bool(), advantages, 0.0))
    assert not detached.any()


def test_clip_cov_draw_is_seeded():
    torch.manual_seed(1)
    advantages = torch.randn(4, 50).sign() * 3
    logps = -torch.rand(4, 50) * 4
    mask = torch.ones(4, 50)

    def draw(seed, step):
        result = clip_cov_advantages(
            None,
            mask,
            advantages_BT=advantages,
            policy_logps=logps,
            rollout_logps=logps,
            step=step,
            clip_cov_ratio=0.02,
            clip_cov_lb=0.0,
            clip_cov_ub=100.0,
            clip_cov_seed=seed,
        )
        return result.metrics["detached_fraction"][0]

    first = draw(0, 3)
    assert first.sum() == 4  # max(int(0.02 * 200), 1)
    assert torch.equal(first, draw(0, 3))  # a rerun draws the same tokens
    assert not torch.equal(first, draw(0, 4)) or not torch.equal(first, draw(1, 3))


# ------------------------------------------------------------------------------------------------ 80/20


def test_high_entropy_hand_worked():
    entropy = _t([[0.5, 2.0, 1.0, 2.0, 0.1, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # the 9.0 is padding
    advantages = _t([1])

    def high_entropy(mask, **settings):
        result = high_entropy_advantages(advantages, mask, policy_entropy=entropy, **settings)
        return result.advantages_BT, result.loss_mask_BT

    # rho = 0.2, N = 5: k = max(1, int(5 * 0.2 + 0.9999)) = 1. The top entropy 2.0 is tied between positions 1 and
    # 3: the earlier one is kept.
    out, loss_mask = high_entropy(mask)
    torch.testing.assert_close(loss_mask, _t([[0, 1, 0, 0, 0, 0]]))
    torch.testing.assert_close(out, loss_mask)
    # rho = 0.5: k = int(2.5 + 0.9999) = 3 -> entropies 2.0, 2.0, 1.0.
    _, loss_mask = high_entropy(mask, high_entropy_top_ratio=0.5)
    torch.testing.assert_close(loss_mask, _t([[0, 1, 1, 1, 0, 0]]))
    # rho = 0 keeps one token; rho = 1 keeps every valid token; no valid token keeps none.
    assert [high_entropy_count(5, r) for r in (0.0, 1.0)] == [1, 5]
    assert high_entropy(mask, high_entropy_top_ratio=1.0)[1].sum() == 5
    assert high_entropy(torch.zeros(1, 6))[1].sum() == 0


def test_high_entropy_equals_trl_quantile_mask_without_ties():
    # TRL's top_entropy_quantile keeps H >= quantile(H, 1 - rho); with distinct entropies and rho * N an integer it
    # keeps the same k tokens (on one process; TRL gathers the quantile over processes, the official code does not).
    torch.manual_seed(0)
    entropy, mask = torch.rand(2, 5) * 3, torch.ones(2, 5)
    trl_mask = entropy >= torch.quantile(entropy.flatten(), 0.8)
    result = high_entropy_advantages(torch.ones(2), mask, policy_entropy=entropy, high_entropy_top_ratio=0.2)
    assert torch.equal(result.loss_mask_BT.bool(), trl_mask) and trl_mask.sum() == 2


# ------------------------------------------------------------------------------------------------ EntropyAdv


def test_entropy_adv_hand_worked():
    # psi = min(0.4 * H, |A| / 2): A = 1, H = 0.5 -> min(0.2, 0.5) = 0.2 -> 1.2; A = 1, H = 3 -> min(1.2, 0.5) -> 1.5;
    # A = -1, H = 3 -> -1 + 0.5 = -0.5; A = -1, H = 0.1 -> -1 + 0.04 = -0.96; A = 0 -> 0; masked -> 0.
    advantages = _t([[1, 1, -1, -1, 0, 1]])
    entropy = _t([[0.5, 3.0, 3.0, 0.1, 2.0, 5.0]])

    def entropy_adv(advantages, entropy, mask, **settings):
        return entropy_adv_advantages(
            None, mask, advantages_BT=advantages, policy_entropy=entropy, **settings
        ).advantages_BT

    out = entropy_adv(advantages, entropy, torch.tensor([[1, 1, 1, 1, 1, 0]]))
    torch.testing.assert_close(out, _t([[1.2, 1.5, -0.5, -0.96, 0, 0]]))
    # kappa > 1 keeps every sign, whatever the entropy.
    advantages, entropy = torch.randn(8, 16), torch.rand(8, 16) * 50
    out = entropy_adv(advantages, entropy, torch.ones(8, 16), entropy_adv_alpha=10.0, entropy_adv_kappa=1.01)
    assert torch.equal(out.sign(), advantages.sign())
    with pytest.raises(ValueError, match="entropy_adv_kappa must be finite and > 1"):
        entropy_adv(advantages, entropy, torch.ones(8, 16), entropy_adv_kappa=1.0)


# ------------------------------------------------------------------------------------------------ registry and config


@pytest.mark.parametrize("name", BASELINES)
def test_registered_with_paper_arguments_and_checks(name):
    method = CREDIT_METHODS[name]
    assert method.paper["id"] == PAPERS[name] and "author" in method.paper["citation"]
    for f in dataclasses.fields(method.arguments):
        assert f.name.startswith(f"{name}_") and f.metadata["help"]
    config = CreditGRPOConfig(output_dir="/tmp/unused", credit_method=name, use_cpu=True, report_to="none")
    assert set(method.argument_names) <= set(config.credit_hyperparameters())
    first_check = method.argument_names[0]  # each baseline checks its first hyperparameter, refusing -1
    with pytest.raises(ValueError, match=first_check):
        CreditGRPOConfig(
            output_dir="/tmp/unused",
            credit_method=name,
            use_cpu=True,
            report_to="none",
            credit_kwargs={first_check: -1},
        )


def test_generation_baseline_must_precede_training_forward_ones():
    with pytest.raises(ValueError, match="must come before"):
        CreditGRPOConfig(output_dir="/tmp/unused", credit_method="stapo+ar_lopti", use_cpu=True, report_to="none")


# ------------------------------------------------------------------------------------------------ training


def _naive_statistics(model, inputs, temperature):
    """Sampled-token log-probs, entropies and logit gaps (log p_y - max log p) from the full logits."""
    logp_all = naive_logprobs(model, inputs, temperature)
    logps = sampled(logp_all, inputs["completion_ids"])
    return logps, -(logp_all.exp() * logp_all).sum(-1), logps - logp_all.amax(-1)


def _expected(method, args, inputs, logps, entropy, logit_gap, step):
    """The token advantages and loss weights of the registered method or stack on this micro-batch, from the
    independent reference (`reference_credit.reference_stack`) on statistics of the full logits: one micro-batch per
    generation batch, so the policy is still the rollout policy. The trainer splits a stack between the generation
    batch and the training forward, and must hand each method what the methods before it produced."""
    values = args.credit_hyperparameters()
    names = method.split("+")
    settings = {
        name: {key: value for key, value in values.items() if key in CREDIT_METHODS[name].argument_names}
        for name in names
    }
    statistics = {
        "policy_logps": logps,
        "policy_entropy": entropy,
        "policy_logit_gap": logit_gap,
        "rollout_logps": logps,
        "rollout_entropy": entropy,
    }
    mask = inputs["completion_mask"].bool()
    batch = ReferenceBatch.start(
        inputs["credit_sequence_advantages"],
        mask,
        statistics={name: torch.where(mask, values_BT, 0.0) for name, values_BT in statistics.items()},
        step=step,
        clip_range=(args.epsilon, args.epsilon_high or args.epsilon),
    )
    want = reference_stack(names, batch, settings)
    return want.advantages_BT.float(), want.loss_weights_BT.float()


class ToolMasked(CreditGRPOTrainer):
    """Adds an all-ones tool mask to the generation batch, as TRL's tool loop does: TRL then builds its loss mask
    before its forward, so a method that drops tokens gets its own no-grad forward first."""

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
        return batch


@pytest.mark.parametrize(
    "method,options",
    [
        ("stapo", {"stapo_prob_threshold": 0.05, "stapo_entropy_quantile": 0.5}),  # looser: drops on the tiny model
        ("tampo", {"tampo_prob_threshold": 0.05, "tampo_entropy_threshold": 3.0}),
        ("minp_support", {"temperature": 0.7}),
        ("stapo", {"stapo_prob_threshold": 0.05, "stapo_entropy_quantile": 0.5, "tool_mask": True}),
        ("minp_support", {"temperature": 0.7, "tool_mask": True}),  # soft weights through TRL's tool mask
        ("ar_lopti", {}),
        ("clip_cov", {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.0, "clip_cov_ub": 10.0}),
        ("high_entropy", {"loss_type": "bnpo"}),
        ("entropy_adv", {}),
        ("eapo+stapo", {}),
        ("ar_lopti+taco+stapo", {}),  # the official code's order: reweighting, TACO, then STAPO's mask
        # ... then Clip-Cov over the mask min-p's soft weights leave (candidates everywhere, all detached)
        (
            "ar_lopti+taco+minp_support+clip_cov",
            {"temperature": 0.7, "clip_cov_ratio": 1.0, "clip_cov_lb": -1e6, "clip_cov_ub": 1e6},
        ),
        (
            "ar_lopti+taco+stapo+clip_cov",
            {"stapo_prob_threshold": 0.05, "stapo_entropy_quantile": 0.5, "clip_cov_ratio": 0.3, "clip_cov_lb": 0.0},
        ),
    ],
)
def test_baseline_trains_and_trl_consumes_its_credit(monkeypatch, make_trainer, method, options):
    options = dict(options)
    trainer_class = ToolMasked if options.pop("tool_mask", False) else CreditGRPOTrainer
    trainer = make_trainer(method, trainer_class, max_steps=2, **options)

    def expected(trainer, batch):
        statistics = _naive_statistics(trainer.model, batch, trainer.temperature)
        return _expected(method, trainer.args, batch, *statistics, trainer.state.global_step)

    recorder = LossRecorder(monkeypatch, expected, atol=1e-4)
    train_changing_every_parameter(trainer)
    assert recorder.checked == 2
    assert_credit_moved(method, recorder.moved_share)  # the comparison above counts only where credit moved
    logged = trainer.state.log_history[0]
    last = method.split("+")[-1]
    assert any(key.startswith(f"{last}/") for key in logged)
    if CREDIT_METHODS[last].drops_tokens:
        assert 0.0 < logged[f"{last}/kept_fraction"] <= 1.0


@pytest.mark.parametrize("tool_mask", [True, False], ids=["no-grad forward", "loss forward"])
def test_logit_gap_statistic_equals_full_logits(monkeypatch, make_trainer, tool_mask):
    # Both ways a method that drops tokens gets its statistics: TRL's own loss forward, handed over by the trainer's
    # `_get_per_token_logps_and_entropies`, and, with a tool mask, the no-grad forward of the micro-batch.
    trainer_class = ToolMasked if tool_mask else CreditGRPOTrainer
    trainer = make_trainer("minp_support", trainer_class, max_steps=1, temperature=0.7)
    forwards = []  # the trainer's own no-grad forwards of the micro-batch
    scoring = trainer.policy_logps_and_entropy
    monkeypatch.setattr(trainer, "policy_logps_and_entropy", lambda *a, **k: forwards.append(1) or scoring(*a, **k))
    checked = []
    original = trainer._policy_logit_gap

    def recording(batch, hidden_BLH):
        logit_gap_BT = original(batch, hidden_BLH)
        with torch.no_grad():
            _, _, logit_gap = _naive_statistics(trainer.model, batch, trainer.temperature)
        mask = batch["completion_mask"].bool()
        torch.testing.assert_close(logit_gap_BT, torch.where(mask, logit_gap, 0.0), atol=1e-4, rtol=1e-4)
        checked.append(1)
        return logit_gap_BT

    monkeypatch.setattr(trainer, "_policy_logit_gap", recording)
    trainer.train()
    assert checked and len(forwards) == (1 if tool_mask else 0)


def test_cli_trains_stapo(tmp_path, tiny_model_dir):
    from trl_credit.cli import main as cli_main

    recipe = tiny_recipe(tmp_path, tiny_model_dir, max_steps=2)
    assert cli_main(["grpo", "--config", str(recipe), "--method", "stapo", "--stapo_prob_threshold", "0.01"]) == 0
    card = (tmp_path / "run" / "README.md").read_text()
    assert "stapo_prob_threshold" in card and "0.01" in card and "2602.15620" in card


@pytest.mark.parametrize("loss_type", ["bnpo", "dapo"])
def test_effective_coefficient_of_a_dropped_token_is_the_official_rule_under_bnpo(
    monkeypatch, make_trainer, loss_type
):
    """d loss / d log p of each token, taken through TRL's own `_compute_loss`, against verl's per-micro-batch token
    mean over the kept tokens (STAPO's rule written out here from the official code): equal under `bnpo`; under
    `dapo` the dropped tokens still count in the normaliser, so it differs (and the trainer warns)."""
    trainer = make_trainer(
        "stapo", max_steps=1, loss_type=loss_type, stapo_prob_threshold=0.05, stapo_entropy_quantile=0.5
    )
    compared = []
    original_scoring = trainer._get_per_token_logps_and_entropies
    original_loss = GRPOTrainer._compute_loss

    def inner_loss(trainer_self, model, inputs):
        leaves = []

        def scoring_with_a_leaf(*scoring_args, **scoring_kwargs):
            logps, entropy, aux = original_scoring(*scoring_args, **scoring_kwargs)
            leaves.append(logps.detach().requires_grad_(True))
            return leaves[-1], entropy, aux

        logps, entropy, mask = before_the_loss.pop()
        monkeypatch.setattr(trainer_self, "_get_per_token_logps_and_entropies", scoring_with_a_leaf)
        loss = original_loss(trainer_self, model, inputs)
        monkeypatch.setattr(trainer_self, "_get_per_token_logps_and_entropies", original_scoring)
        (coefficient,) = torch.autograd.grad(loss, leaves[-1], retain_graph=True)
        advantage = inputs["credit_sequence_advantages"].float().unsqueeze(1).expand_as(logps)
        candidates = mask & (advantage > 0)
        pool = entropy[candidates] if candidates.any() else entropy[mask]
        spurious = candidates & (logps.exp() < 0.05) & (entropy < torch.quantile(pool, 0.5))
        kept = mask & ~spurious
        official = -advantage * kept / kept.sum() / trainer_self.current_gradient_accumulation_steps
        compared.append((spurious.any().item(), torch.allclose(coefficient, official, atol=1e-6, rtol=1e-5)))
        if loss_type == "bnpo":
            torch.testing.assert_close(coefficient, official, atol=1e-6, rtol=1e-5)
        return loss

    original_compute_loss, before_the_loss = GRPOTrainer.compute_loss, []

    def compute_loss(trainer_self, model, inputs, *args, **kwargs):
        # Before the trainer's `_compute_loss` (whose loss forward drops tokens from TRL's mask in place).
        with torch.no_grad():
            logps, entropy, _ = _naive_statistics(trainer_self.model, inputs, trainer_self.temperature)
        before_the_loss.append((logps, entropy, inputs["completion_mask"].bool()))
        return original_compute_loss(trainer_self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", inner_loss)
    trainer.train()
    assert compared and any(dropped for dropped, _ in compared), "no token was dropped: the test proves nothing"
    if loss_type == "dapo":
        assert not all(equal for dropped, equal in compared if dropped)

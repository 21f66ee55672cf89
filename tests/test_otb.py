"""OTB against the official rule (verl-project/verl: `compute_optimal_token_baseline_advantage` in
`verl/trainer/ppo/core_algos.py`), worked out by loops over groups, rows and positions (`otb_loop` in
`reference_formulas.py`), on fixed tensors and in training.

The official rule: the return at every valid position is the response's reward (one reward per response, at its last
token); `w = 1 - 2 exp(old_log_prob) + sum_pi_squared` on valid tokens, `W` its cumulative sum along the response;
per prompt group of at least 2 responses and per position `t`, `B_t = sum_i G_i W_it m_it / (sum_i W_it m_it + 1e-8)`;
with `handle_zero_tail` the single longest response of a group (if strictly longer than the second) gets `B = 0` from
column `second-longest length` on; a group of one response gets `B = 0`; `Â = (G - B) * mask`.
"""

import pytest
import torch
from conftest import naive_logprobs, on_threads_as_processes, sampled, train_changing_every_parameter
from reference_formulas import otb_batch, otb_loop
from trl import GRPOTrainer

from trl_credit import CreditGRPOConfig, CreditGRPOTrainer
from trl_credit.methods import CREDIT_METHODS, CreditBatch, apply_credit_method
from trl_credit.methods.otb import otb_advantages, otb_baselines, otb_path_variance

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]


def otb(rewards, groups, logps, sum_sq, mask, handle_zero_tail=True):
    """The registered method's token advantages, every row of every group passed in."""
    return otb_advantages(
        None,
        mask,
        rewards_B=rewards,
        group_index_B=groups,
        rollout_logps=logps,
        rollout_sum_sq_probs=sum_sq,
        otb_handle_zero_tail=handle_zero_tail,
    ).advantages_BT


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("handle_zero_tail", [True, False])
def test_random_batches_match_the_official_rule(seed, handle_zero_tail):
    rewards, groups, logps, sum_sq, mask = otb_batch(seed, groups=1 + seed % 4, size=1 + seed % 5)
    got = otb(rewards, groups, logps, sum_sq, mask, handle_zero_tail)
    want = otb_loop(rewards, groups, logps, sum_sq, mask, handle_zero_tail)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_edge_cases():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    nan = float("nan")
    logps = torch.tensor(
        [[-0.5, -1.0, -2.0, nan], [-0.1, -0.3, nan, nan], [-1.0, nan, nan, nan], [nan] * 4, [0.0, 0.0, nan, nan]]
    )
    sum_sq = torch.where(mask, torch.tensor(0.4), torch.tensor(nan))
    sum_sq[4] = torch.tensor([1.0, 1.0, nan, nan])  # a deterministic policy: w = 0, no baseline from it
    rewards = torch.tensor([1.0, 0.0, 1.0, 3.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1])  # group 0 holds an all-masked row; group 1 is a single response
    for tail in (True, False):
        got = otb(rewards, groups, logps, sum_sq, mask, tail)
        want = otb_loop(rewards, groups, torch.nan_to_num(logps), torch.nan_to_num(sum_sq), mask, tail)
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)
        assert torch.isfinite(got).all() and (got[~mask] == 0).all()
        torch.testing.assert_close(got[4], torch.tensor([2.0, 2.0, 0.0, 0.0]))  # a group of one: Â = G
    # The single longest response keeps its reward as advantage beyond the second-longest one's length.
    assert otb(rewards, groups, logps, sum_sq, mask, True)[0, 2] == 1.0
    # Equal rewards in a group and equal lengths: the baseline is the reward, the advantage 0.
    equal = otb(
        torch.ones(3), torch.zeros(3), torch.full((3, 4), -0.7), torch.full((3, 4), 0.3), torch.ones(3, 4).bool()
    )
    torch.testing.assert_close(equal, torch.zeros(3, 4), atol=1e-6, rtol=0)


def test_path_variance_is_a_cumulative_sum_over_valid_tokens():
    mask = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    got = otb_path_variance(torch.log(torch.tensor([[0.5, 0.9, 0.25]])), torch.tensor([[0.5, 0.9, 0.25]]), mask)
    torch.testing.assert_close(
        got, torch.tensor([[0.5, 0.5, 0.5 + 0.75]])
    )  # 1 - 1 + 0.5; masked adds 0; 1 - 0.5 + 0.25


@pytest.mark.parametrize("seed", range(3))
def test_groups_split_over_processes_give_the_same_advantages(seed):
    rewards, groups, logps, sum_sq, mask = otb_batch(seed, groups=3, size=4)
    path_variance = otb_path_variance(logps, sum_sq, mask)
    whole, _ = otb_baselines(rewards, groups, path_variance, mask)
    cut = [slice(0, 5), slice(5, 12)]  # groups straddle the cut

    def run(rank, gather):
        rows = cut[rank]
        return otb_baselines(rewards[rows], groups[rows], path_variance[rows], mask[rows], True, gather)[0]

    halves = on_threads_as_processes(run)
    torch.testing.assert_close(torch.cat(halves), whole, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("narrow_rank", [0, 1])
def test_processes_padded_to_their_own_longest_completion_give_the_same_advantages(narrow_rank):
    """TRL pads each process's completions to that process's longest one: a group straddling two processes meets
    tensors of two widths."""
    rewards, groups, logps, sum_sq, mask = otb_batch(7, groups=3, size=4)
    cut = [slice(0, 5), slice(5, 12)]
    mask[cut[1 - narrow_rank]] = True  # the wide process: completions as long as the tensor
    mask[cut[narrow_rank], mask.size(1) // 2 :] = False  # the narrow one: all shorter than half of it
    path_variance = otb_path_variance(logps, sum_sq, mask)
    whole, _ = otb_baselines(rewards, groups, path_variance, mask)
    widths = [int(mask[rows].sum(dim=1).max()) for rows in cut]
    assert widths[narrow_rank] < widths[1 - narrow_rank] == mask.size(1)

    def run(rank, gather):
        rows, width = cut[rank], widths[rank]
        return otb_baselines(
            rewards[rows], groups[rows], path_variance[rows, :width], mask[rows, :width], True, gather
        )[0]

    for rows, width, got in zip(cut, widths, on_threads_as_processes(run)):
        assert got.shape == (rows.stop - rows.start, width)
        torch.testing.assert_close(got, whole[rows, :width], atol=1e-6, rtol=1e-6)


def test_registration_and_stack_position():
    method = CREDIT_METHODS["otb"]
    assert method.estimates_advantages and method.hyperparameters() == {"otb_handle_zero_tail": True}
    assert method.paper["id"] == "2602.07078"
    assert [
        step.method.name
        for step in CreditGRPOConfig(output_dir="/tmp/u", credit_method="otb+taco", use_cpu=True).credit_stack
    ] == ["otb", "taco"]
    for stack in ("taco+otb", "eapo+otb"):
        with pytest.raises(ValueError, match="must come first"):
            CreditGRPOConfig(output_dir="/tmp/u", credit_method=stack, use_cpu=True)
    with pytest.raises(ValueError, match="group_index_B"):
        apply_credit_method(
            "otb", None, torch.ones(1, 2), rollout_logps=torch.zeros(1, 2), rollout_sum_sq_probs=torch.ones(1, 2)
        )


def test_incoming_advantages_are_replaced_and_later_methods_reshape():
    rewards, groups, logps, sum_sq, mask = otb_batch(4)
    statistics = {"rollout_logps": logps, "rollout_sum_sq_probs": sum_sq}
    common = dict(group_index_B=groups, rewards_B=rewards)
    first = apply_credit_method("otb", torch.randn(len(rewards)), mask, **statistics, **common).advantages_BT
    other = apply_credit_method(
        "otb", torch.randn(len(rewards)), mask, **statistics, advantages_BT=torch.randn(mask.shape), **common
    )
    torch.testing.assert_close(first, other.advantages_BT)
    # AR-Lopti after OTB multiplies OTB's token advantages by its rollout-probability weights.
    reshaped = apply_credit_method("ar_lopti", None, mask, **statistics, advantages_BT=first).advantages_BT
    torch.testing.assert_close(reshaped, first * (0.9 + 0.1 * logps.exp()) * mask)


# ------------------------------------------------------------------------------------------------ training


class OTBRecorder:
    """At generation, checks the advantages the trainer wrote against the loop on the model's own float64 logits,
    and the raw rewards and groups against TRL's own GRPO advantages of the same batch."""

    def __init__(self, monkeypatch, trainer):
        self.checked, self.consumed = 0, 0
        original_generate, original_loss = CreditGRPOTrainer._generate_and_score_completions, GRPOTrainer._compute_loss
        hp = trainer.args.credit_hyperparameters()

        def generate(trainer_self, inputs):
            batch = original_generate(trainer_self, inputs)
            mask = batch["completion_mask"].bool()
            with torch.no_grad():
                logp = naive_logprobs(trainer_self.model, batch, trainer_self.temperature, torch.float64)
            logps, sum_sq = sampled(logp, batch["completion_ids"]), (2 * logp).exp().sum(-1)
            rewards, groups = batch["credit_rewards"], batch["credit_group_index"]
            want = otb_loop(rewards, groups, logps, sum_sq, mask, hp["otb_handle_zero_tail"])
            torch.testing.assert_close(batch["advantages"].double(), want, atol=1e-4, rtol=1e-4)
            # TRL's GRPO advantage of each row, (r - group mean) / (group std + 1e-4), from the same rewards and groups.
            for g in groups.unique():
                rows = groups == g
                r = rewards[rows]
                grpo = (r - r.mean()) / (r.std() + 1e-4)
                torch.testing.assert_close(batch["credit_sequence_advantages"][rows], grpo, atol=1e-5, rtol=1e-5)
            self.checked += 1
            return batch

        def inner_loss(trainer_self, model, inputs):
            assert inputs["advantages"].dim() == 2
            self.consumed += 1
            return original_loss(trainer_self, model, inputs)

        monkeypatch.setattr(CreditGRPOTrainer, "_generate_and_score_completions", generate)
        monkeypatch.setattr(GRPOTrainer, "_compute_loss", inner_loss)


def _train(monkeypatch, make_trainer, method="otb", **overrides):
    trainer = make_trainer(method, **overrides)
    recorder = OTBRecorder(monkeypatch, trainer)
    return train_changing_every_parameter(trainer), recorder


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_trains_under_every_loss_type_with_the_official_advantages(monkeypatch, make_trainer, loss_type):
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer, recorder = _train(monkeypatch, make_trainer, loss_type=loss_type, max_steps=2, **extra)
    assert recorder.checked == 2 and recorder.consumed == 2
    logged = trainer.state.log_history[0]
    assert "otb/mean_baseline" in logged and 0.0 <= logged["otb/zero_tail_fraction"] <= 1.0


@pytest.mark.parametrize(
    "options",
    [
        {"steps_per_generation": 2},
        {"per_device_train_batch_size": 2, "num_generations": 4, "gradient_accumulation_steps": 2},
    ],
    ids=["trl-scoring-forward", "groups-over-micro-batches"],
)
def test_batching_options(monkeypatch, make_trainer, options):
    _, recorder = _train(monkeypatch, make_trainer, max_steps=2, **options)
    assert recorder.checked >= 1


def test_stack_with_a_training_forward_method(monkeypatch, make_trainer):
    trainer, recorder = _train(monkeypatch, make_trainer, method="otb+taco", max_steps=1)
    assert recorder.checked == 1 and "taco/mean_weight" in trainer.state.log_history[0]


def test_the_registered_method_sums_each_group_over_every_process():
    """OTB as the trainer calls it, with the batch's `gather` spanning two processes whose rows split the groups."""
    rewards, groups, logps, sum_sq, mask = otb_batch(3, groups=3, size=4)
    whole = otb(rewards, groups, logps, sum_sq, mask)
    cut = [slice(0, 5), slice(5, 12)]

    def run(rank, gather):
        rows = cut[rank]
        batch = CreditBatch.from_sequence_advantages(
            torch.zeros(rows.stop - rows.start),
            mask[rows],
            statistics={"rollout_logps": logps[rows], "rollout_sum_sq_probs": sum_sq[rows]},
            group_index_B=groups[rows],
            rewards_B=rewards[rows],
            gather=gather,
        )
        return CREDIT_METHODS["otb"].function(batch, otb_handle_zero_tail=True).advantages_BT

    torch.testing.assert_close(torch.cat(on_threads_as_processes(run)), whole, atol=1e-6, rtol=1e-6)


def test_the_baseline_of_nearly_deterministic_tokens_keeps_verls_epsilon():
    """Where every token is nearly certain, the weights W are ~1e-7 and verl's 1e-8 in the denominator shows:
    B = sum G W / (sum W + 1e-8)."""
    logps = torch.log(torch.tensor([[0.75], [0.75]]))
    sum_sq = torch.tensor([[0.5 + 2**-24], [0.5 + 2**-23]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    weights = otb_path_variance(logps, sum_sq, mask).double().flatten()
    assert 0 < weights.max() < 1e-6
    baseline = float(weights[0] / (weights.sum() + 1e-8))
    got = otb(rewards, groups, logps, sum_sq, mask, handle_zero_tail=False)
    torch.testing.assert_close(got.double(), torch.tensor([[1 - baseline], [-baseline]], dtype=torch.float64))

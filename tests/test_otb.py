"""OTB against the official rule (verl-project/verl: `compute_optimal_token_baseline_advantage` in
`verl/trainer/ppo/core_algos.py`), worked out by loops over groups, rows and positions (`otb_loop` in
`reference_formulas.py`), on fixed tensors and in training.

The official rule: the return at every valid position is the response's reward (one reward per response, at its last
token); `w = 1 - 2 exp(old_log_prob) + sum_pi_squared` on valid tokens, `W` its cumulative sum along the response;
per prompt group of at least 2 responses and per position `t`, `B_t = sum_i G_i W_it m_it / (sum_i W_it m_it + 1e-8)`;
with `handle_zero_tail` the single longest response of a group (if strictly longer than the second) gets `B = 0` from
column `second-longest length` on; a group of one response gets `B = 0`; `Â = (G - B) * mask`.

The package computes `w` as `(1 - pi_t)^2 + sum_{v != t} pi_v^2`, equal in exact arithmetic and free of verl's float32
cancellation on near-certain tokens: it matches verl where verl's `w` is well-conditioned, and the exact `w` (float64,
mpmath) everywhere.
"""

import mpmath
import pytest
import torch
from conftest import naive_logprobs, on_threads_as_processes, train_changing_every_parameter
from reference_credit import ReferenceBatch
from reference_formulas import otb_batch, otb_loop, unsampled_statistics
from trainer_helpers import float32_slack
from trl import GRPOTrainer

from trl_credit import CreditGRPOConfig, CreditGRPOTrainer
from trl_credit.methods import CREDIT_METHODS, CreditBatch, apply_credit_method
from trl_credit.methods.otb import otb_advantages, otb_baselines, otb_path_variance
from trl_credit.trainer.lm_head_statistics import token_statistics

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]


def otb(batch, handle_zero_tail=True, **overrides):
    """The registered method's token advantages on an `otb_batch`, every row of every group passed in."""
    inputs = dict(rewards_B=batch.rewards, group_index_B=batch.groups, **batch.statistics) | overrides
    return otb_advantages(None, batch.mask, **inputs, otb_handle_zero_tail=handle_zero_tail).advantages_BT


def official(batch, handle_zero_tail=True):
    return otb_loop(batch.rewards, batch.groups, batch.weights, batch.mask, handle_zero_tail)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("handle_zero_tail", [True, False])
def test_random_batches_match_the_official_rule(seed, handle_zero_tail):
    batch = otb_batch(seed, groups=1 + seed % 4, size=1 + seed % 5)
    torch.testing.assert_close(otb(batch, handle_zero_tail).double(), official(batch, handle_zero_tail), **EXACT)


EXACT = dict(atol=1e-5, rtol=1e-5)


def _verl_float32_weights(batch):
    """verl's `w`, as verl computes it: in float32 from the float32 log-prob and `sum_v p_v^2`."""
    return 1 - 2 * batch.logps.float().exp() + batch.sum_sq.float()


def test_verl_parity_where_its_weights_are_well_conditioned():
    """Distributions of logits with standard deviation 1 over 30 tokens: no token is near-certain, verl's float32 `w`
    is within 1e-4 (relative) of the exact one everywhere, and OTB equals verl's rule on verl's own weights."""
    for seed in range(6):
        batch = otb_batch(seed, sharpness=1.0)
        verl_BT = _verl_float32_weights(batch).double()
        assert ((verl_BT - batch.weights).abs() <= 1e-4 * batch.weights)[batch.mask].all()
        want = otb_loop(batch.rewards, batch.groups, verl_BT, batch.mask)
        torch.testing.assert_close(otb(batch).double(), want, **EXACT)


def test_near_certain_tokens_depart_from_verl_and_match_the_exact_weights():
    """Sharp distributions (logits x 40): most tokens have p > 0.9996, where verl's float32 `w` is rounding noise
    (0, a multiple of 2^-23, or negative) and the exact `w` is 1e-9 to 1e-7. OTB matches the exact rule; verl's own
    rule on its float32 weights moves the advantages by far more than the tolerance. The departure is recorded."""
    batch = otb_batch(1, groups=3, size=4, cols=12, sharpness=40.0)
    verl_BT = _verl_float32_weights(batch).double()
    mask = batch.mask
    near_certain = mask & (batch.weights < 1e-6)
    assert near_certain.sum() > mask.sum() // 2
    off = ((verl_BT - batch.weights).abs() > 0.5 * batch.weights) & near_certain
    assert off.sum() > near_certain.sum() // 2 and (verl_BT[mask] <= 0).any()  # verl's weights: noise, some <= 0
    got = otb(batch).double()
    torch.testing.assert_close(got, official(batch), **EXACT)
    verl_advantages = otb_loop(batch.rewards, batch.groups, verl_BT.clamp(min=0), mask)
    assert (verl_advantages - got).abs().max() > 1e-2  # the departure from verl is not within any tolerance


@pytest.mark.parametrize("token_chunk,vocab_chunk", [(2, 7), (64, 4096)])
def test_the_weight_of_a_near_certain_token_matches_mpmath(token_chunk, vocab_chunk):
    """`w = 1 - 2p + sum_v p_v^2` streamed in float32 from float32 logits, against the same formula at 50 digits on
    those logits, for p from below 0.999 to above 1 - 1e-9: relative error below 1e-5 (verl's float32 form is off by
    up to 100 % and more there)."""
    vocab, gaps = 40, torch.tensor([5.0, 8.0, 11.0, 14.0, 17.0, 20.0, 23.0])
    g = torch.Generator().manual_seed(0)
    n = gaps.numel() * 3
    ids_N = torch.randint(0, vocab, (n,), generator=g)
    z_NV = torch.randn(n, vocab, generator=g)
    z_NV[torch.arange(n), ids_N] = z_NV.max(dim=1).values + gaps.repeat(3)  # the sampled token leads by the gap
    # Logits = hidden @ weight.T with weight = identity: the stream reads exactly these float32 logits.
    streamed = token_statistics(
        z_NV, torch.eye(vocab), ids_N, token_chunk_size=token_chunk, vocab_chunk_size=vocab_chunk
    )
    got_N = streamed.unsampled_mass.double().square() + streamed.unsampled_sum_sq_probs.double()
    mpmath.mp.dps = 50
    tails = []
    for i in range(n):
        z = [mpmath.mpf(float(v)) for v in z_NV[i]]
        total = mpmath.fsum(mpmath.exp(v) for v in z)
        p = [mpmath.exp(v) / total for v in z]
        want = 1 - 2 * p[int(ids_N[i])] + mpmath.fsum(q**2 for q in p)
        tails.append(float(1 - p[int(ids_N[i])]))
        assert abs(got_N[i].item() - float(want)) <= 1e-5 * float(want), (i, float(want), got_N[i].item())
    assert min(tails) < 1e-9 and max(tails) > 1e-3  # p from below 0.999 to above 1 - 1e-9


def test_edge_cases():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    nan = float("nan")
    mass = torch.tensor(
        [[0.5, 0.3, 0.9, nan], [0.1, 0.2, nan, nan], [0.6, nan, nan, nan], [nan] * 4, [0.0, 0.0, nan, nan]]
    )
    others_sq = torch.where(mask, 0.2 * mass**2, torch.tensor(nan))  # row 4: a deterministic policy, w = 0
    rewards = torch.tensor([1.0, 0.0, 1.0, 3.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1])  # group 0 holds an all-masked row; group 1 is a single response
    statistics = {"rollout_unsampled_mass": mass, "rollout_unsampled_sum_sq_probs": others_sq}
    weights = torch.nan_to_num(mass.double() ** 2 + others_sq.double())

    def run(tail, rewards=rewards, groups=groups, mask=mask, statistics=statistics):
        inputs = dict(rewards_B=rewards, group_index_B=groups, **statistics)
        return otb_advantages(None, mask, **inputs, otb_handle_zero_tail=tail).advantages_BT

    for tail in (True, False):
        got = run(tail)
        torch.testing.assert_close(got.double(), otb_loop(rewards, groups, weights, mask, tail), atol=1e-6, rtol=1e-6)
        assert torch.isfinite(got).all() and (got[~mask] == 0).all()
        torch.testing.assert_close(got[4], torch.tensor([2.0, 2.0, 0.0, 0.0]))  # a group of one: Â = G
    # The single longest response keeps its reward as advantage beyond the second-longest one's length.
    assert run(True)[0, 2] == 1.0
    # Equal rewards in a group and equal lengths: the baseline is the reward, the advantage 0.
    uniform = {
        "rollout_unsampled_mass": torch.full((3, 4), 0.5),
        "rollout_unsampled_sum_sq_probs": torch.full((3, 4), 0.1),
    }
    equal = run(True, torch.ones(3), torch.zeros(3), torch.ones(3, 4).bool(), uniform)
    torch.testing.assert_close(equal, torch.zeros(3, 4), atol=1e-6, rtol=0)


def test_path_variance_is_a_cumulative_sum_over_valid_tokens():
    mask = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    # p = 0.5 with the rest on one token: w = 0.25 + 0.25; masked adds 0; p = 0.25, the rest on 3 tokens: 0.5625 + 0.1875
    got = otb_path_variance(torch.tensor([[0.5, 0.9, 0.75]]), torch.tensor([[0.25, 0.9, 0.1875]]), mask)
    torch.testing.assert_close(got, torch.tensor([[0.5, 0.5, 0.5 + 0.75]]))


@pytest.mark.parametrize("seed", range(3))
def test_groups_split_over_processes_give_the_same_advantages(seed):
    batch = otb_batch(seed, groups=3, size=4)
    rewards, groups, mask = batch.rewards, batch.groups, batch.mask
    path_variance = otb_path_variance(*batch.statistics.values(), mask)
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
    batch = otb_batch(7, groups=3, size=4)
    rewards, groups, mask = batch.rewards, batch.groups, batch.mask.clone()
    cut = [slice(0, 5), slice(5, 12)]
    mask[cut[1 - narrow_rank]] = True  # the wide process: completions as long as the tensor
    mask[cut[narrow_rank], mask.size(1) // 2 :] = False  # the narrow one: all shorter than half of it
    path_variance = otb_path_variance(*batch.statistics.values(), mask)
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
        statistics = {"rollout_unsampled_mass": torch.zeros(1, 2), "rollout_unsampled_sum_sq_probs": torch.zeros(1, 2)}
        apply_credit_method("otb", None, torch.ones(1, 2), **statistics)


def test_incoming_advantages_are_replaced_and_later_methods_reshape():
    batch = otb_batch(4)
    statistics = {**batch.statistics, "rollout_logps": batch.logps}
    common = dict(group_index_B=batch.groups, rewards_B=batch.rewards)
    mask = batch.mask
    first = apply_credit_method("otb", torch.randn(len(batch.rewards)), mask, **statistics, **common).advantages_BT
    other = apply_credit_method(
        "otb", torch.randn(len(batch.rewards)), mask, **statistics, advantages_BT=torch.randn(mask.shape), **common
    )
    torch.testing.assert_close(first, other.advantages_BT)
    # AR-Lopti after OTB multiplies OTB's token advantages by its rollout-probability weights.
    reshaped = apply_credit_method("ar_lopti", None, mask, **statistics, advantages_BT=first).advantages_BT
    torch.testing.assert_close(reshaped, first * (0.9 + 0.1 * batch.logps.exp()) * mask)


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
            mass, others_sq = unsampled_statistics(logp, batch["completion_ids"])
            rewards, groups = batch["credit_rewards"], batch["credit_group_index"]
            want = otb_loop(rewards, groups, mass**2 + others_sq, mask, hp["otb_handle_zero_tail"])
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
    batch = otb_batch(3, groups=3, size=4)
    whole = otb(batch)
    cut = [slice(0, 5), slice(5, 12)]

    def run(rank, gather):
        rows = cut[rank]
        part = CreditBatch.from_sequence_advantages(
            torch.zeros(rows.stop - rows.start),
            batch.mask[rows],
            statistics={name: values[rows] for name, values in batch.statistics.items()},
            group_index_B=batch.groups[rows],
            rewards_B=batch.rewards[rows],
            gather=gather,
        )
        return CREDIT_METHODS["otb"].function(part, otb_handle_zero_tail=True).advantages_BT

    torch.testing.assert_close(torch.cat(on_threads_as_processes(run)), whole, atol=1e-6, rtol=1e-6)


def test_the_baseline_of_nearly_deterministic_tokens_keeps_verls_epsilon():
    """Where every token is nearly certain, the weights W are ~1e-7 and verl's 1e-8 in the denominator shows:
    B = sum G W / (sum W + 1e-8)."""
    mass, others_sq = torch.tensor([[2e-4], [3e-4]]), torch.tensor([[1e-8], [2e-8]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    weights = mass.double().flatten() ** 2 + others_sq.double().flatten()
    assert 0 < weights.max() < 1e-6
    baseline = float(weights[0] / (weights.sum() + 1e-8))
    statistics = {"rollout_unsampled_mass": mass, "rollout_unsampled_sum_sq_probs": others_sq}
    got = otb_advantages(None, mask, rewards_B=rewards, group_index_B=groups, **statistics, otb_handle_zero_tail=False)
    want = torch.tensor([[1 - baseline], [-baseline]], dtype=torch.float64)
    torch.testing.assert_close(got.advantages_BT.double(), want, atol=1e-7, rtol=1e-6)


def test_the_recorders_give_near_certain_tokens_no_slack():
    """The path tests compare OTB's consumed advantages with the float64 reference at 1e-5 and widen the tolerance only
    where float32 rounding of the statistics moves the reference (`float32_slack`). With `w` summed from the other
    tokens, a batch of near-certain tokens gets no such allowance: nothing there is tolerated."""
    batch = otb_batch(1, groups=3, size=4, cols=12, sharpness=40.0)
    assert (batch.mask & (batch.weights < 1e-6)).sum() > batch.mask.sum() // 2
    credit = ReferenceBatch.start(
        torch.zeros(batch.rewards.numel()),
        batch.mask,
        statistics=batch.statistics,
        group_index_B=batch.groups,
        rewards_B=batch.rewards,
    )
    exact, slack_BT, _ = float32_slack(["otb"], credit, {"otb": {"otb_handle_zero_tail": True}})
    torch.testing.assert_close(exact.advantages_BT, official(batch), atol=1e-5, rtol=1e-5)
    assert slack_BT.max() < 1e-6

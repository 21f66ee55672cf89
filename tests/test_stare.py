"""STARE against the official rule (hp-luo/STARE: `compute_stare_token_weights` in `verl/trainer/ppo/core_algos.py`,
the gate of `STAREController` in the same file, fed by `recipe/STARE/stare_ray_trainer.py`), worked out here by a
per-token loop, on fixed tensors and in training.

The official rule, per micro-batch: tokens with `A > 0` (and, for C2, `A < 0`) are ranked by surprisal `-log p` of the
current policy; the top `k = max(1, int(n * P + 0.999999))` (at most `n`) of the `n` candidates get weight `W` (`M`),
the rest 1; the weights apply only while the generation batch's token-mean entropy (old-log-prob forward) is strictly
below the target; the weight multiplies the clipped surrogate.
"""

import math

import pytest
import torch
from conftest import naive_logprobs, sampled, train_changing_every_parameter
from reference_formulas import otb_batch, otb_loop, stare_loop, stare_token_loop
from trl import GRPOTrainer

from trl_credit import CreditGRPOConfig, CreditGRPOTrainer
from trl_credit.methods import CREDIT_METHODS, SettingError, apply_credit_method
from trl_credit.methods.stare import stare_advantages

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]


def stare(advantages_B, logps_BT, mask_BT, batch_entropy, **hyperparameters):
    """The registered method's token advantages on one micro-batch of a generation batch whose mean rollout entropy is
    `batch_entropy`."""
    return stare_advantages(
        advantages_B,
        mask_BT,
        policy_logps=logps_BT,
        rollout_mean_entropy=torch.full(mask_BT.shape, float(batch_entropy)),
        **hyperparameters,
    ).advantages_BT


def _random_batch(seed, rows=6, cols=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    advantages = torch.randn(rows, generator=g).round(decimals=1)
    advantages[torch.randint(0, rows, (1,), generator=g)] = 0.0
    logps = torch.log(torch.rand(rows, cols, generator=g).clamp(min=1e-6))
    return advantages, logps, mask


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_random_batches_match_the_official_rule(seed, variant):
    advantages, logps, mask = _random_batch(seed)
    for ratio, w, m, entropy in [
        (0.1, 1.1, 0.9, 0.2),
        (0.35, 1.5, 0.5, 0.1),
        (1.0, 1.05, 0.95, 0.0),
        (0.5, 2.0, 0.3, 0.3),
    ]:
        settings = dict(stare_top_p_ratio=ratio, stare_reweight_w=w, stare_reweight_m=m, stare_target_entropy=0.3)
        got = stare(advantages, logps, mask, entropy, stare_variant=variant, **settings)
        want = stare_loop(advantages, logps, mask, entropy, variant, ratio, w, m, 0.3)
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)


def test_defaults_are_the_papers():
    method = CREDIT_METHODS["stare"]
    assert method.hyperparameters() == {
        "stare_variant": "O1",
        "stare_top_p_ratio": 0.1,
        "stare_reweight_w": 1.1,
        "stare_reweight_m": 0.9,
        "stare_target_entropy": 0.3,
    }
    assert method.paper["id"] == "2606.19236" and "Luo, Haipeng" in method.paper["citation"]
    for name, bad in [
        ("stare_variant", "C3"),
        ("stare_top_p_ratio", 1.5),
        ("stare_reweight_w", 0.0),
        ("stare_reweight_m", -0.9),
        ("stare_target_entropy", -1.0),
    ]:
        with pytest.raises(SettingError, match=name):
            method.hyperparameters({name: bad})


def test_gate_is_strictly_below_the_target():
    advantages, logps, mask = torch.tensor([1.0]), torch.tensor([[-0.1, -3.0]]), torch.ones(1, 2, dtype=torch.bool)
    on = stare(advantages, logps, mask, 0.29, stare_top_p_ratio=0.5)
    torch.testing.assert_close(on, torch.tensor([[1.0, 1.1]]))
    for entropy in (0.3, 0.31):
        torch.testing.assert_close(stare(advantages, logps, mask, entropy), torch.ones(1, 2))


def test_gate_compares_the_batch_entropy_with_the_target_as_python_floats():
    # The official `STAREController.update` compares two Python floats: the batch entropy (a float32 mean, `.item()`)
    # and the target. float32(0.7) = 0.69999999 lies below 0.7, so the official gate is on; comparing the float32
    # tensor with the target would round the target to float32 too and find them equal (gate off).
    advantages, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3, dtype=torch.bool)
    logps = torch.tensor([[-0.1, -2.0, -0.5], [-0.3, -1.0, -0.2]])
    entropy = float(torch.tensor(0.7, dtype=torch.float32))
    assert entropy < 0.7
    got = stare(advantages, logps, mask, 0.7, stare_top_p_ratio=0.5, stare_target_entropy=0.7)
    want = stare_loop(advantages, logps, mask, entropy, "O1", 0.5, 1.1, 0.9, 0.7)
    torch.testing.assert_close(want, torch.tensor([[1.0, 1.1, 1.1], [-1.0, -1.0, -1.0]], dtype=torch.float64))
    torch.testing.assert_close(got.double(), want)


def test_edge_cases():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    logps = torch.tensor([[-1.0, -2.0, float("nan")], [float("nan")] * 3, [-0.5, float("inf"), 0.0]])
    # NaN/inf at masked positions are ignored; an all-masked row gets zeros; k = max(1, ceil(n * P)) = 1 of 3
    got = stare(torch.tensor([2.0, 5.0, 1.0]), logps, mask, 0.0)
    torch.testing.assert_close(got, torch.tensor([[2.0, 2.2, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    # P = 0 is GRPO; P = 1 reweights every candidate; no positive token: nothing to amplify; A = 0 is never selected
    torch.testing.assert_close(
        stare(torch.tensor([2.0, 0.0, 1.0]), logps, mask, 0.0, stare_top_p_ratio=0.0),
        torch.tensor([[2.0, 2.0, 0.0], [0.0] * 3, [1.0, 0.0, 0.0]]),
    )
    torch.testing.assert_close(
        stare(torch.tensor([2.0, 0.0, 1.0]), logps, mask, 0.0, stare_top_p_ratio=1.0),
        torch.tensor([[2.2, 2.2, 0.0], [0.0] * 3, [1.1, 0.0, 0.0]]),
    )
    negative = stare(torch.tensor([-2.0, 0.0, 0.0]), logps, mask, 0.0, stare_variant="C2")
    torch.testing.assert_close(negative, torch.tensor([[-2.0, -1.8, 0.0], [0.0] * 3, [0.0] * 3]))
    torch.testing.assert_close(
        stare(torch.tensor([-2.0, 0.0, 0.0]), logps, mask, 0.0, stare_variant="O1"),
        torch.tensor([[-2.0, -2.0, 0.0], [0.0] * 3, [0.0] * 3]),
    )


def test_ties_select_exactly_k_of_the_highest_surprisal():
    advantages = torch.ones(4)
    logps = torch.tensor([[-1.0, -2.0, -2.0], [-2.0, -2.0, -0.5], [-2.0, -1.0, -1.0], [-3.0, -0.1, -0.1]])
    mask = torch.ones(4, 3, dtype=torch.bool)
    got = stare(advantages, logps, mask, 0.0, stare_top_p_ratio=0.3)  # k = ceil(3.6) = 4 of 12
    selected = got == 1.1
    assert int(selected.sum()) == 4 and bool(selected[3, 0])  # the single highest surprisal, then 3 of the 6 tied
    assert (-logps[selected]).min() >= (-logps[~selected]).max()


def test_weights_are_positive_and_never_flip_a_sign():
    for seed in range(5):
        advantages, logps, mask = _random_batch(seed)
        got = stare(
            advantages,
            logps,
            mask,
            0.0,
            stare_variant="C2",
            stare_top_p_ratio=0.5,
            stare_reweight_w=1.5,
            stare_reweight_m=0.5,
        )
        incoming = advantages.unsqueeze(1) * mask
        assert (torch.sign(got) == torch.sign(incoming)).all()


def test_selection_is_per_micro_batch_with_no_gather():
    # The official loss takes the top-k over the micro-batch it is given on each process: splitting a batch changes
    # which tokens are selected, and the method never calls `gather`.
    advantages = torch.ones(2)
    logps = torch.tensor([[-5.0, -4.0], [-1.0, -0.5]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    whole = stare(advantages, logps, mask, 0.0, stare_top_p_ratio=0.5)
    torch.testing.assert_close(whole, torch.tensor([[1.1, 1.1], [1.0, 1.0]]))
    halves = torch.cat(
        [stare(advantages[i : i + 1], logps[i : i + 1], mask[i : i + 1], 0.0, stare_top_p_ratio=0.5) for i in (0, 1)]
    )
    torch.testing.assert_close(halves, torch.tensor([[1.1, 1.0], [1.1, 1.0]]))


def test_incoming_token_advantages_decide_the_sets():
    # In a stack the official loss reads its `advantages` tensor: the sign of each incoming token advantage.
    result = stare_advantages(
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        policy_logps=torch.tensor([[-3.0, -2.0]]),
        rollout_mean_entropy=torch.zeros(1, 2),
        advantages_BT=torch.tensor([[-1.0, 2.0]]),
        stare_variant="C2",
    )
    torch.testing.assert_close(result.advantages_BT, torch.tensor([[-0.9, 2.2]]))
    assert result.metrics["target_entropy"] == 0.3


@pytest.mark.parametrize("seed", range(4))
def test_after_otb_the_sets_follow_each_token_advantage(seed):
    # verl's composition: OTB estimates the token advantages, STARE's loss splits tokens by their sign.
    batch = otb_batch(seed)
    rewards, groups, logps, mask = batch.rewards, batch.groups, batch.logps, batch.mask
    statistics = {**batch.statistics, "policy_logps": logps, "rollout_mean_entropy": torch.zeros(mask.shape)}
    common = dict(group_index_B=groups, rewards_B=rewards)
    estimated = apply_credit_method("otb", None, mask, **statistics, **common).advantages_BT
    got = apply_credit_method(
        "stare", None, mask, **statistics, advantages_BT=estimated, stare_variant="C2"
    ).advantages_BT
    otb_BT = otb_loop(rewards, groups, batch.weights, mask).tolist()
    want = stare_token_loop(otb_BT, logps, mask, 0.0, "C2", 0.1, 1.1, 0.9, 0.3)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ training


class StareRecorder:
    """Checks the generation batch's mean entropy against the model's own logits, and, where TRL's loss consumes
    them, the advantages against the per-token loop on the current policy's full-logit log-probs."""

    def __init__(self, monkeypatch, trainer):
        self.checked, self.entropy, self.entropies = 0, None, []
        hp = trainer.args.credit_hyperparameters()
        original_generate, original_loss = CreditGRPOTrainer._generate_and_score_completions, GRPOTrainer._compute_loss
        original_compute_loss = GRPOTrainer.compute_loss

        def generate(trainer_self, inputs):
            batch = original_generate(trainer_self, inputs)
            mask = batch["completion_mask"].bool()
            with torch.no_grad():
                logp = naive_logprobs(trainer_self.model, batch, trainer_self.temperature, torch.float64)
            entropy = -(logp.exp() * logp).sum(-1)
            self.entropy = entropy[mask].mean().item()
            self.entropies.append(self.entropy)
            stored = batch["credit_rollout_mean_entropy"][mask]
            torch.testing.assert_close(
                stored.double(), torch.full_like(stored.double(), self.entropy), atol=1e-5, rtol=1e-5
            )
            return batch

        def compute_loss(trainer_self, model, inputs, *args, **kwargs):
            # Before the trainer's `_compute_loss` starts: its training forward is the only one TRL's loss sees.
            with torch.no_grad():
                logp = naive_logprobs(trainer_self.model, inputs, trainer_self.temperature)
            self.logps = sampled(logp, inputs["completion_ids"])
            return original_compute_loss(trainer_self, model, inputs, *args, **kwargs)

        def inner_loss(trainer_self, model, inputs):
            logps = self.logps
            loss = original_loss(trainer_self, model, inputs)  # the training forward fills inputs["advantages"]
            mask = inputs["completion_mask"].bool()
            want = stare_loop(
                inputs["credit_sequence_advantages"],
                logps,
                mask,
                self.entropy,
                hp["stare_variant"],
                hp["stare_top_p_ratio"],
                hp["stare_reweight_w"],
                hp["stare_reweight_m"],
                hp["stare_target_entropy"],
            )
            torch.testing.assert_close(inputs["advantages"].double(), want, atol=1e-5, rtol=1e-5)
            self.checked += 1
            return loss

        monkeypatch.setattr(CreditGRPOTrainer, "_generate_and_score_completions", generate)
        monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
        monkeypatch.setattr(GRPOTrainer, "_compute_loss", inner_loss)


def _train(monkeypatch, make_trainer, **overrides):
    trainer = make_trainer("stare", **overrides)
    recorder = StareRecorder(monkeypatch, trainer)
    return train_changing_every_parameter(trainer), recorder


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_trains_under_every_loss_type_with_the_official_weights(monkeypatch, make_trainer, loss_type):
    # The tiny model's entropy is far above 0.3 nats: a high target turns the gate on.
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer, recorder = _train(
        monkeypatch,
        make_trainer,
        loss_type=loss_type,
        stare_target_entropy=100.0,
        stare_variant="C2",
        max_steps=2,
        **extra,
    )
    assert recorder.checked == 2
    logged = trainer.state.log_history[0]
    assert logged["stare/gate_on"] == 1.0 and logged["stare/target_entropy"] == 100.0
    assert 0.0 < logged["stare/reweighted_fraction"] <= 0.2 + 1e-6
    assert math.isclose(logged["stare/batch_entropy"], recorder.entropies[0], rel_tol=1e-4)


def test_gate_off_at_the_papers_target_is_grpo(monkeypatch, make_trainer):
    trainer, recorder = _train(monkeypatch, make_trainer, max_steps=1)
    logged = trainer.state.log_history[0]
    assert recorder.checked == 1 and logged["stare/gate_on"] == 0.0 and logged["stare/reweighted_fraction"] == 0.0
    assert logged["stare/positive_selected_fraction"] > 0.0 and logged["stare/mean_weight"] == 1.0


def test_stare_runs_after_a_generation_method():
    config = CreditGRPOConfig(output_dir="/tmp/unused", credit_method="eapo+stare", use_cpu=True, report_to="none")
    assert [step.method.name for step in config.credit_stack] == ["eapo", "stare"]

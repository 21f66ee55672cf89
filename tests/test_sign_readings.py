"""TRL's sign-reading options with token advantages (docs/methods.md, "TRL's sign-reading options").

TRL's loss reads the sign of the advantage it is handed in three places: the off-policy sequence mask
(`off_policy_mask_threshold`, kept where `A >= 0`), VESPO's gamma weights (`loss_type="vespo"`, the shape `k, lambda`
of `A >= 0` or of `A < 0`) and SAPO's temperatures (`loss_type="sapo"`, `tau_pos` where `A > 0`). Handed `(B, T)`
advantages, each reads every token's own sign: the trainer hands TRL its token advantages and nothing else.

- Each package method is held to its registration's `keeps_signs`: a method that declares it never returns a token
  advantage of the other sign than the incoming one (0 aside), on batches whose incoming token advantages have both
  signs within a completion; a method that does not declare it flips a sign on one of those batches.
- For each option, one training run of OTB (whose token advantages take both signs within a completion) on the tiny
  model: at every loss, TRL's loss equals the option's formula worked here from the inputs TRL consumed and the
  policy's log-probs recomputed from its logits, each token read at its own sign; and the same formula read at the sign
  of GRPO's sequence advantage gives another loss on at least one of them (the run tells the readings apart).
"""

import math

import pytest
import torch
from conftest import (
    PACKAGE_METHODS,
    make_tiny_tokenizer,
    naive_logprobs,
    sampled,
    tiny_config,
    tiny_trainer,
)
from reference_credit import MOVING_SETTINGS, random_reference_batch
from trainer_helpers import make_rollout_func
from trl import GRPOTrainer

from trl_credit.methods import CREDIT_METHODS, apply_credit_method

SEEDS = range(6)


def mixed_sign_advantages(batch, seed):
    """Incoming token advantages of both signs within every completion (what OTB hands the next method of a stack)."""
    generator = torch.Generator().manual_seed(seed)
    noise_BT = torch.randn(batch.mask_BT.shape, generator=generator, dtype=torch.float64)
    return torch.where(batch.mask_BT, batch.sequence_advantages_B.view(-1, 1) + noise_BT, 0.0)


def flipped_tokens(name, settings, seed, token_incoming):
    """Valid tokens where method `name` returned an advantage of the other sign than the one it was handed."""
    batch = random_reference_batch(seed)
    advantages_B, mask_BT, named = batch.package_inputs()
    if token_incoming:
        named["advantages_BT"] = mixed_sign_advantages(batch, seed).float()
    incoming_BT = named["advantages_BT"]
    out_BT = apply_credit_method(name, advantages_B, mask_BT, **named, **settings).advantages_BT
    return int((mask_BT & (out_BT != 0) & (out_BT.sign() != incoming_BT.sign())).sum())


@pytest.mark.parametrize("name", PACKAGE_METHODS)
def test_a_method_keeps_signs_exactly_when_its_registration_says_so(name):
    flips = [
        flipped_tokens(name, settings, seed, token_incoming)
        for settings in ({}, MOVING_SETTINGS[name])
        for seed in SEEDS
        for token_incoming in (False, True)
    ]
    if CREDIT_METHODS[name].keeps_signs:
        assert sum(flips) == 0, f"{name} declares keeps_signs but flipped {flips}"
    else:
        assert sum(flips) > 0, f"{name} flipped no sign on these batches: declare keeps_signs=True, or show a flip"


# ------------------------------------------------------------------------------------------ TRL's loss by hand

OPTIONS = {
    # TRL expects a positive threshold; one this small splits the run's sequences by the sign of their KL, as 0 would.
    "off_policy_mask_threshold": {"loss_type": "grpo", "off_policy_mask_threshold": 1e-9},
    "vespo": {"loss_type": "vespo"},
    "sapo": {"loss_type": "sapo"},
}


def sequence_kl(inputs, logps_BT):
    """`(B, 1)`: each completion's mean of `log pi_sampling - log pi_theta` over its valid tokens (TRL's OPSM reads the
    sampling log-probs where the batch has them, else the old ones)."""
    mask_BT = inputs["completion_mask"].double()
    sampling_BT = inputs.get("sampling_per_token_logps", inputs["old_per_token_logps"]).double()
    return ((sampling_BT - logps_BT) * mask_BT).sum(-1, keepdim=True) / mask_BT.sum(-1, keepdim=True)


def loss_by_hand(option, trainer, inputs, logps_BT, signs_BT):
    """TRL's loss of one micro-batch under `option` (one process, no gradient accumulation, `beta = 0`), from the
    formulas of TRL's docs and papers, reading the advantage's sign from `signs_BT`."""
    args = trainer.args
    advantages_BT = inputs["advantages"].double()
    mask_BT = inputs["completion_mask"].double()
    old_BT = inputs["old_per_token_logps"].double()  # num_iterations = 2: TRL's scoring forward at generation
    ratio_BT = torch.exp(logps_BT - old_BT)
    if option == "sapo":  # SAPO: a soft gate sigmoid(tau (r - 1)) * 4 / tau, tau by the sign
        tau_BT = torch.where(signs_BT > 0, args.sapo_temperature_pos, args.sapo_temperature_neg)
        per_token_BT = -torch.sigmoid(tau_BT * (ratio_BT - 1)) * 4 / tau_BT * advantages_BT
    elif option == "vespo":  # VESPO: phi(w) = exp(lambda + k log w - lambda w) of the sequence's weight w
        log_w_B1 = ((logps_BT - old_BT).clamp(-20, 20) * mask_BT).sum(-1, keepdim=True).clamp(math.log(1e-8), 20)
        nonnegative_BT = signs_BT >= 0
        k_BT = torch.where(nonnegative_BT, args.vespo_k_pos, args.vespo_k_neg)
        lambda_BT = torch.where(nonnegative_BT, args.vespo_lambda_pos, args.vespo_lambda_neg)
        phi_BT = torch.exp(lambda_BT + k_BT * log_w_B1 - lambda_BT * log_w_B1.exp())
        per_token_BT = -phi_BT * advantages_BT * logps_BT
        return (per_token_BT * mask_BT).sum() / inputs["num_items_in_batch"].double()
    else:  # DeepSeek-V3.2's mask on the clipped surrogate: keep where A >= 0 or the sequence's mean KL <= delta
        clipped_BT = ratio_BT.clamp(1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
        per_token_BT = -torch.minimum(ratio_BT * advantages_BT, clipped_BT * advantages_BT)
        low_kl_B1 = sequence_kl(inputs, logps_BT) <= args.off_policy_mask_threshold
        per_token_BT = per_token_BT * ((signs_BT >= 0) | low_kl_B1)
    return ((per_token_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)).mean()


def shorter_is_better(completion_ids, **kwargs):
    """`7 - length`: with `make_rollout_func(vary_lengths=True)`'s lengths (6, 5, 4, 6 and 5, 4, 6, 5 tokens in the two
    groups of 8 rows), the second group's longest completion earns 1 and the others 2 or 3, so OTB gives it
    `1 - B_t < 0` where the others are valid and `+1` on its last token, past them (OTB's zero tail): tokens of both
    signs in one completion, by construction."""
    return [7.0 - len(ids) for ids in completion_ids]


def otb_trainer(tmp_path, **settings):
    tokenizer = make_tiny_tokenizer()
    args = tiny_config("otb", tmp_path, num_iterations=2, max_steps=4, per_device_train_batch_size=8, **settings)
    return tiny_trainer(
        args, tokenizer=tokenizer, reward_funcs=shorter_is_better, rollout_func=make_rollout_func(vary_lengths=True)
    )


@pytest.mark.parametrize("option", OPTIONS)
def test_trls_loss_reads_each_tokens_sign(tmp_path, monkeypatch, option):
    trainer = otb_trainer(tmp_path, **OPTIONS[option])
    calls, original = [], GRPOTrainer._compute_loss

    def recorded(trainer_self, model, inputs):
        logp_BTV = naive_logprobs(model, inputs, trainer_self.temperature, torch.float64)
        logps_BT = sampled(logp_BTV, inputs["completion_ids"])
        loss = original(trainer_self, model, inputs)
        calls.append((dict(inputs), logps_BT, loss.detach().double()))
        return loss

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", recorded)
    trainer.train()

    assert len(calls) == 4  # two generation batches, each over two iterations
    mixed = parted = 0
    masked = set()  # OPSM: whether negative tokens were dropped (KL above the threshold), and kept (below it)
    for inputs, logps_BT, loss in calls:
        advantages_BT, mask_BT = inputs["advantages"].double(), inputs["completion_mask"].bool()
        if option == "off_policy_mask_threshold":
            high_kl_B1 = sequence_kl(inputs, logps_BT) > trainer.args.off_policy_mask_threshold
            masked |= {bool(off) for off in high_kl_B1[((advantages_BT < 0) & mask_BT).any(-1, keepdim=True)]}
        positive_B, negative_B = ((advantages_BT > 0) & mask_BT).any(-1), ((advantages_BT < 0) & mask_BT).any(-1)
        mixed += int((positive_B & negative_B).sum())
        by_token = loss_by_hand(option, trainer, inputs, logps_BT, advantages_BT)
        torch.testing.assert_close(loss, by_token, rtol=1e-5, atol=1e-6)  # TRL computes in float32
        sequence_BT = inputs["credit_sequence_advantages"].double().view(-1, 1).expand_as(advantages_BT)
        by_sequence = loss_by_hand(option, trainer, inputs, logps_BT, sequence_BT)
        parted += abs(by_sequence - loss).item() > 100 * (1e-6 + 1e-5 * abs(loss).item())  # 100 x the tolerance
    assert mixed > 0, "no completion had token advantages of both signs"
    assert parted > 0, "reading the sequence advantage's sign gave TRL's loss at every step: the run tells nothing"
    if option == "off_policy_mask_threshold":
        assert masked == {True, False}, "the threshold decided nothing: every negative token was dropped, or none"

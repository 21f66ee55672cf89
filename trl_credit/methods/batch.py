"""What a credit method reads and returns: the per-token statistics by name, [`CreditBatch`] and [`CreditResult`].

Nothing here imports TRL: a method is a pure function of these records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

# Per-token statistics a method can ask for. Each is `(B, T)` float32, aligned with the completion tokens, zero
# at masked positions. The trainer computes each requested statistic once per batch from TRL's own forward
# (the model's full output transform, the sampling temperature, multimodal inputs).
POLICY_LOGPS = "policy_logps"  # log p of the sampled token under the current policy, from the training forward
POLICY_ENTROPY = "policy_entropy"  # full-vocabulary entropy (nats) of the current policy, from the training forward
# `z_y - max_v z_v` (<= 0): the sampled token's logit minus the largest logit of the current policy, logits at the
# sampling temperature, from the LM head streamed over the training forward's final hidden states
POLICY_LOGIT_GAP = "policy_logit_gap"
ROLLOUT_LOGPS = "rollout_logps"  # the same for the policy that generated the batch, once per generation batch
ROLLOUT_ENTROPY = "rollout_entropy"
# The rollout policy's probability of every token but the sampled one, `1 - pi_y` (in [0, 1]), and the sum of their
# squares, `sum_{v != y} pi_v^2` (in [0, 1]), from the same source as `rollout_entropy`. Each is a sum over the other
# tokens, so it keeps its relative precision as pi_y -> 1, where `1 - exp(rollout_logps)` is rounding noise.
ROLLOUT_UNSAMPLED_MASS = "rollout_unsampled_mass"
ROLLOUT_UNSAMPLED_SUM_SQ_PROBS = "rollout_unsampled_sum_sq_probs"
ROLLOUT_UNSAMPLED = (ROLLOUT_UNSAMPLED_MASS, ROLLOUT_UNSAMPLED_SUM_SQ_PROBS)
# The token mean of `rollout_entropy` over every valid token of the generation batch (all processes), the same value at
# every valid position: a batch-level entropy that a method in the training forward can read from any micro-batch
ROLLOUT_MEAN_ENTROPY = "rollout_mean_entropy"
REFERENCE_DEVIATION = "reference_deviation"  # squared Hellinger distance to the frozen initial model
PREVIOUS_POLICY_DEVIATION = "previous_policy_deviation"  # ... to the policy of the previous generation batch

LOSS_FORWARD_STATISTICS = (POLICY_LOGPS, POLICY_ENTROPY, POLICY_LOGIT_GAP)
GENERATION_STATISTICS = (
    ROLLOUT_LOGPS,
    ROLLOUT_ENTROPY,
    ROLLOUT_UNSAMPLED_MASS,
    ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,
    ROLLOUT_MEAN_ENTROPY,
    REFERENCE_DEVIATION,
    PREVIOUS_POLICY_DEVIATION,
)
# What `CreditGRPOTrainer` supplies. A trainer that knows more (the credit lab's ground truth) adds its own names.
STATISTICS = LOSS_FORWARD_STATISTICS + GENERATION_STATISTICS


# Statistics with a bounded range: a streamed computation may round slightly outside it, anything further is a bug
# upstream. The rest need only be finite.
STATISTIC_RANGES = {
    REFERENCE_DEVIATION: (0.0, 1.0),
    PREVIOUS_POLICY_DEVIATION: (0.0, 1.0),
    ROLLOUT_UNSAMPLED_MASS: (0.0, 1.0),
    ROLLOUT_UNSAMPLED_SUM_SQ_PROBS: (0.0, 1.0),
}


def _local(values_N: torch.Tensor) -> torch.Tensor:
    return values_N


@dataclass(frozen=True)
class CreditBatch:
    """What a credit method sees of a batch.

    Args:
        advantages_BT: incoming token advantages: `A_i` on every valid token for the first method of a stack,
            else the previous method's output. Zero at masked positions. "Positive token" means `advantages_BT > 0`.
        sequence_advantages_B: GRPO's sequence advantages `A_i`, whatever ran before.
        mask_BT: bool, the positions still in the loss: valid completion positions (completion mask x tool mask)
            with a positive `loss_weights_BT`. Tokens an earlier method of the stack dropped are masked.
        statistics: the statistics the method asked for, by name.
        vocab_size: rows of the policy's LM head.
        step: the optimizer step (`trainer.state.global_step`), for schedules.
        gather: returns the values of every process, concatenated (a collective: call it on every process). At
            generation it spans the whole generation batch; in the training forward, the micro-batches of one step.
        clip_range: `(epsilon_low, epsilon_high)` of the loss's PPO clip, for methods that must know which tokens
            the clipped objective already silences (Clip-Cov).
        loss_weights_BT: float, each token's weight in the loss: the product of the loss masks the earlier methods
            of the stack returned (soft for min-p), as the official code multiplies verl's `response_mask` step by
            step. None stands for `mask_BT` as float; the batch a method is handed always has it.
        group_index_B: long, the prompt group of each row, the same number on every process for the completions of
            one prompt (a group may span processes), for advantage estimators; None outside a trainer unless given.
        rewards_B: the raw reward of each row (TRL's weighted sum over reward functions, before any normalisation),
            for advantage estimators; None outside a trainer unless given.
        completion_ids_BT: long, the sampled completion token ids, `pad_token_id` at padding (GTPO's conflict tokens,
            HICRA's planning tokens); None outside a trainer unless given.
        pad_token_id: the tokenizer's padding id, which fills `completion_ids_BT` past each completion's end.
        token_texts: maps a list of token ids to the decoded text of each token, in order (HICRA matches its grams in
            their concatenation); None outside a trainer unless given.
    """

    advantages_BT: torch.Tensor
    sequence_advantages_B: torch.Tensor
    mask_BT: torch.Tensor
    statistics: Mapping[str, torch.Tensor] = field(default_factory=dict)
    vocab_size: int | None = None
    step: int = 0
    gather: Callable[[torch.Tensor], torch.Tensor] = _local
    clip_range: tuple[float, float] = (0.2, 0.2)
    loss_weights_BT: torch.Tensor | None = None
    group_index_B: torch.Tensor | None = None
    rewards_B: torch.Tensor | None = None
    completion_ids_BT: torch.Tensor | None = None
    pad_token_id: int | None = None
    token_texts: Callable[[list[int]], list[str]] | None = None

    def followed_by(self, result: CreditResult) -> CreditBatch:
        """The batch the next method of a stack sees, from `result` as `run_stack` checked it (its advantages zero
        wherever `mask_BT` is false): `result`'s advantages, and its loss mask multiplied into the loss weights; a
        token whose weight reaches 0 leaves `mask_BT`, and its advantage and statistics become 0."""
        if result.loss_mask_BT is None:  # the same tokens at the same weights
            return dataclasses.replace(self, advantages_BT=result.advantages_BT.float())
        weights_BT = self.mask_BT.float() if self.loss_weights_BT is None else self.loss_weights_BT
        weights_BT = weights_BT * result.loss_mask_BT.float()
        mask_BT = self.mask_BT & (weights_BT > 0)
        return dataclasses.replace(
            self,
            advantages_BT=torch.where(mask_BT, result.advantages_BT.float(), 0.0),
            mask_BT=mask_BT,
            loss_weights_BT=torch.where(mask_BT, weights_BT, 0.0),
            statistics={name: torch.where(mask_BT, values, 0.0) for name, values in self.statistics.items()},
        )

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.statistics:
            raise KeyError(f"statistic {name!r} was not requested; the method's `statistics` must list it")
        return self.statistics[name]

    @classmethod
    def from_sequence_advantages(cls, advantages_B: torch.Tensor, mask_BT: torch.Tensor, **kwargs) -> CreditBatch:
        """The batch a stack starts from: every valid token carries its response's advantage, as in GRPO."""
        mask_BT = mask_BT.bool()
        advantages_B = advantages_B.float()
        return cls(token_advantages(advantages_B, mask_BT), advantages_B, mask_BT, **kwargs)


def token_advantages(advantages: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """`(B, T)` token advantages: `advantages` as they are when already per token, else each row's `(B,)` advantage on
    every token of `mask_BT` (zero elsewhere), as GRPO spreads it."""
    return advantages if advantages.dim() == 2 else advantages.unsqueeze(1) * mask_BT


# A per-token metric: a `(B, T)` tensor averaged over valid tokens, a `(numerator_BT, denominator_BT)` pair of
# masks whose sums give a ratio, or a float that is already the same on every process.
Metric = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | float


@dataclass
class CreditResult:
    """What a credit method returns.

    Args:
        advantages_BT: the new `(B, T)` token advantages.
        loss_mask_BT: optional `(B, T)` weights in `[0, 1]` that multiply the loss mask, as the official code of
            some baselines multiplies verl's `response_mask`: a dropped token also leaves the loss normaliser.
        metrics: diagnostics, logged as `<method>/<name>` and reduced over every process.
        statistic_BT: the per-token statistic shown in the token-credit view.
    """

    advantages_BT: torch.Tensor
    loss_mask_BT: torch.Tensor | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    statistic_BT: torch.Tensor | None = None

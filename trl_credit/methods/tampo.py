"""TAMPO-style hard truncation of implausible positive tokens (a baseline of TACO's paper).

Rule and defaults as in the TACO repository's verl actor (https://github.com/xiuyilou/TACO,
`verl/workers/actor/dp_actor.py`, block "TAMPO-style hard truncation", keys `tampo_*`); no separate TAMPO paper or
code was found, so the model card cites the TACO paper, whose comparison this reproduces:

    truncated = valid token with A > 0 and p <= tampo_prob_threshold and H <= tampo_entropy_threshold
    loss mask = 0 on truncated tokens                  (the official code multiplies verl's response_mask)

Statistics: the current policy (log-prob and entropy of the training forward). Both thresholds are fixed, so unlike
STAPO nothing depends on how the batch is split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ._checks import FINITE_NON_NEGATIVE, check_range, check_token_inputs, in_range
from .registry import POLICY_ENTROPY, POLICY_LOGPS, CreditBatch, CreditResult, register_credit_method
from .taco import TACO_PAPER


@dataclass
class TAMPOArguments:
    """TAMPO-style truncation's hyperparameters (defaults of the TACO repository's `tampo_*` options)."""

    tampo_prob_threshold: float = field(
        default=0.002,
        metadata={
            "help": "TAMPO: truncate positive-advantage tokens whose current-policy probability is <= this. In (0, 1]."
        },
    )
    tampo_entropy_threshold: float = field(
        default=0.5,
        metadata={"help": "TAMPO: ... and whose current-policy entropy (nats) is <= this. >= 0."},
    )


@torch.no_grad()
def tampo_advantages(
    advantages_BT: torch.Tensor,
    logps_BT: torch.Tensor,
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    prob_threshold: float = 0.002,
    entropy_threshold: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop positive-advantage tokens that are both improbable and confidently predicted otherwise.

    Args:
        advantages_BT: `(B, T)` token advantages.
        logps_BT: `(B, T)` log-probabilities of the sampled tokens under the current policy.
        entropy_BT: `(B, T)` entropies (nats) of the current policy.
        mask_BT: `(B, T)` valid completion positions.
        prob_threshold: truncate when `p <= prob_threshold`, in `(0, 1]`.
        entropy_threshold: ... and `H <= entropy_threshold`, `>= 0`.

    Returns:
        `(advantages_BT, loss_mask_BT)`: advantages with truncated tokens set to 0, and the `(B, T)` float loss mask
        (0 on truncated tokens, 1 elsewhere).
    """
    check_range("prob_threshold", prob_threshold, 0.0, 1.0, low_open=True)
    check_range("entropy_threshold", entropy_threshold, 0.0, math.inf, high_open=True)
    valid_BT, (advantages_BT, logps_BT, entropy_BT) = check_token_inputs(
        advantages_BT, mask_BT, logps_BT=logps_BT, entropy_BT=entropy_BT
    )
    truncated_BT = (
        valid_BT & (advantages_BT > 0) & (logps_BT.exp() <= prob_threshold) & (entropy_BT <= entropy_threshold)
    )
    return advantages_BT.masked_fill(truncated_BT, 0.0), (~truncated_BT).float()


@register_credit_method(
    "tampo",
    statistics=(POLICY_LOGPS, POLICY_ENTROPY),
    arguments=TAMPOArguments,
    checks={
        "tampo_prob_threshold": in_range(0.0, 1.0, low_open=True),
        "tampo_entropy_threshold": FINITE_NON_NEGATIVE,
    },
    paper=TACO_PAPER,
    drops_tokens=True,
    display_name="TAMPO",
    summary="Drops from the loss positive-advantage tokens with p <= 0.002 and entropy <= 0.5.",
    diagnostics={
        "dropped_fraction": "fraction of valid tokens dropped from the loss",
        "dropped_fraction_pos": "fraction of positive-advantage tokens dropped",
    },
    token_statistic=("entropy", "current-policy entropy H (nats)"),
)
def tampo(batch: CreditBatch, tampo_prob_threshold: float, tampo_entropy_threshold: float) -> CreditResult:
    entropy_BT = batch[POLICY_ENTROPY]
    advantages_BT, loss_mask_BT = tampo_advantages(
        batch.advantages_BT,
        batch[POLICY_LOGPS],
        entropy_BT,
        batch.mask_BT,
        tampo_prob_threshold,
        tampo_entropy_threshold,
    )
    dropped_BT = batch.mask_BT & (loss_mask_BT == 0)
    positive_BT = batch.mask_BT & (batch.advantages_BT > 0)
    return CreditResult(
        advantages_BT=advantages_BT,
        loss_mask_BT=loss_mask_BT,
        metrics={
            "dropped_fraction": (dropped_BT, batch.mask_BT),
            "dropped_fraction_pos": (dropped_BT & positive_BT, positive_BT),
        },
        statistic_BT=entropy_BT,
    )

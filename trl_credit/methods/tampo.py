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

from dataclasses import dataclass

from .batch import POLICY_ENTROPY, POLICY_LOGPS, CreditBatch, CreditResult
from .registry import get_credit_method, register_credit_method
from .settings import FINITE_NON_NEGATIVE, check_fields, hyperparameter, in_range
from .taco import TACO_PAPER


@dataclass
class TAMPOArguments:
    """TAMPO-style truncation's hyperparameters (defaults of the TACO repository's `tampo_*` options)."""

    tampo_prob_threshold: float = hyperparameter(
        0.002, "TAMPO: truncate positive-advantage tokens whose current-policy probability is <= this. In (0, 1]."
    )
    tampo_entropy_threshold: float = hyperparameter(
        0.5, "TAMPO: ... and whose current-policy entropy (nats) is <= this. >= 0."
    )

    def __post_init__(self):
        check_fields(
            self,
            tampo_prob_threshold=in_range(0.0, 1.0, low_open=True),
            tampo_entropy_threshold=FINITE_NON_NEGATIVE,
        )


@register_credit_method(
    "tampo",
    display_name="TAMPO",
    statistics=(POLICY_LOGPS, POLICY_ENTROPY),
    arguments=TAMPOArguments,
    paper=TACO_PAPER,
    drops_tokens=True,
    keeps_signs=True,
)
def tampo(batch: CreditBatch, tampo_prob_threshold: float, tampo_entropy_threshold: float) -> CreditResult:
    """Drops from the loss positive-advantage tokens with p <= 0.002 and entropy <= 0.5.

    Metrics:
        dropped_fraction: fraction of valid tokens dropped from the loss
        dropped_fraction_pos: fraction of positive-advantage tokens dropped

    Token statistic:
        entropy: current-policy entropy H (nats)
    """
    logps_BT, entropy_BT, valid_BT = batch[POLICY_LOGPS], batch[POLICY_ENTROPY], batch.mask_BT
    positive_BT = valid_BT & (batch.advantages_BT > 0)
    truncated_BT = positive_BT & (logps_BT.exp() <= tampo_prob_threshold) & (entropy_BT <= tampo_entropy_threshold)
    return CreditResult(
        advantages_BT=batch.advantages_BT.masked_fill(truncated_BT, 0.0),
        loss_mask_BT=(~truncated_BT).float(),
        metrics={
            "dropped_fraction": (truncated_BT, valid_BT),
            "dropped_fraction_pos": (truncated_BT & positive_BT, positive_BT),
        },
        statistic_BT=entropy_BT,
    )


# TAMPO on plain tensors: `tampo_advantages(advantages_B, mask_BT, policy_logps=..., policy_entropy=...,
# tampo_prob_threshold=...)`.
tampo_advantages = get_credit_method("tampo").on_tensors

"""Min-p support weighting of positive tokens (a baseline of TACO's paper).

Rule and defaults as in the TACO repository's verl actor (https://github.com/xiuyilou/TACO,
`verl/workers/actor/dp_actor.py`, block "Min-p inspired support weighting", keys `support_set_*`). A token is inside
the min-p sampling set (https://huggingface.co/papers/2407.01082) when `p_y >= min_p * max_v p_v`; positive tokens
outside it lose weight smoothly:

    m  = (z_y - max_v z_v) - log(min_p)       logits z divided by the sampling temperature, as the official code does;
                                                           m >= 0 <=> inside the min-p set
    w  = w_min + (1 - w_min) * exp(min(m, 0) / tau)        in (w_min, 1]; 1 inside the set
    w  = 1 where A <= 0                                    (minp_support_only_positive_advantage; A the incoming
                                                            token advantage, as the official code reads it)
    loss mask = w                                          (the official code multiplies verl's response_mask)

The weight is a soft loss mask: it scales each token's loss term and the token-mean normaliser counts `w`, as in the
official code; the advantages are left unchanged (multiplying them by `w` as well would apply it twice).

Statistics: the current policy's logit gap `z_y - max_v z_v` (`policy_logit_gap`), read as the official code reads
it (the raw gap, not a difference of two float32 log-probs, whose rounding `exp(m / tau)` magnifies at small `tau`:
4e-4 in the weight at tau = 0.001): the LM head streamed over the training forward's final hidden states, no
`(B, T, V)` logits.

The official option has no default (`support_set_min_p: null` turns the weighting off); `min_p = 0.1` here is the
usual min-p sampling value, our choice. Pass the value of the run you reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import POLICY_LOGIT_GAP, CreditBatch, CreditResult
from .registry import get_credit_method, register_credit_method
from .settings import FINITE_POSITIVE, check_fields, hyperparameter, in_range
from .taco import TACO_PAPER


@dataclass
class MinPSupportArguments:
    """Min-p support weighting's hyperparameters (the TACO repository's `support_set_*` options)."""

    minp_support_min_p: float = hyperparameter(
        0.1,
        "Min-p support: a token is in the support set when p >= min_p * max p. In (0, 1). No official "
        "default (the option is off unless set); 0.1 is the usual min-p value.",
    )
    minp_support_tau: float = hyperparameter(
        0.2, "Min-p support: decay temperature of the weight outside the set, in logit margin. > 0."
    )
    minp_support_min_weight: float = hyperparameter(
        0.2, "Min-p support: lower bound of the weight far outside the set. In [0, 1]."
    )
    minp_support_only_positive_advantage: bool = hyperparameter(
        True, "Min-p support: weight only positive-advantage tokens (others keep weight 1)."
    )

    def __post_init__(self):
        check_fields(
            self,
            minp_support_min_p=in_range(0.0, 1.0, low_open=True, high_open=True),
            minp_support_tau=FINITE_POSITIVE,
            minp_support_min_weight=in_range(0.0, 1.0),
        )


def minp_support_margin(logit_gap_BT: torch.Tensor, min_p: float) -> torch.Tensor:
    """`m = (z_y - max_v z_v) - log(min_p)`: `m >= 0` exactly when the token is in the min-p set."""
    # log(min_p) rounded to float32 before the subtraction, as the official code takes it (a float32 tensor).
    return logit_gap_BT - torch.tensor(min_p, dtype=torch.float32).log().item()


@register_credit_method(
    "minp_support",
    display_name="min-p support",
    statistics=(POLICY_LOGIT_GAP,),
    arguments=MinPSupportArguments,
    paper=TACO_PAPER,
    drops_tokens=True,
    keeps_signs=True,
)
def minp_support(
    batch: CreditBatch,
    minp_support_min_p: float,
    minp_support_tau: float,
    minp_support_min_weight: float,
    minp_support_only_positive_advantage: bool,
) -> CreditResult:
    """Down-weights in the loss positive-advantage tokens outside the min-p support set, smoothly in
    their logit margin.

    Metrics:
        support_weight: mean loss weight over valid tokens
        in_support_fraction_pos: fraction of positive-advantage tokens inside the min-p set
        margin_mean_pos: mean min-p margin m over positive-advantage tokens

    Token statistic:
        margin: m = z_y - max_v z_v - log min_p (logits z); the token is in the set when m >= 0
    """
    valid_BT = batch.mask_BT
    margin_BT = minp_support_margin(batch[POLICY_LOGIT_GAP], minp_support_min_p)
    support_BT = minp_support_min_weight + (1.0 - minp_support_min_weight) * torch.exp(
        margin_BT.clamp(max=0.0) / minp_support_tau
    )
    positive_BT = valid_BT & (batch.advantages_BT > 0)
    weighted_BT = positive_BT if minp_support_only_positive_advantage else valid_BT
    weights_BT = torch.where(weighted_BT, support_BT, 1.0)  # 1 at masked positions: the loss mask removes them
    return CreditResult(
        advantages_BT=batch.advantages_BT,
        loss_mask_BT=weights_BT,
        metrics={
            "support_weight": weights_BT,
            "in_support_fraction_pos": (positive_BT & (margin_BT >= 0), positive_BT),
            "margin_mean_pos": (torch.where(positive_BT, margin_BT, 0.0), positive_BT),
        },
        statistic_BT=margin_BT,
    )


# Min-p support weighting on plain tensors: `minp_support_advantages(advantages_B, mask_BT, policy_logit_gap=...,
# minp_support_min_p=...)`; the weight is the result's `loss_mask_BT`.
minp_support_advantages = get_credit_method("minp_support").on_tensors

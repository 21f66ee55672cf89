"""STAPO: Spurious-Token-Aware Policy Optimization (a baseline of TACO's paper).

"STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens",
https://huggingface.co/papers/2602.15620. Rule and defaults as in the TACO repository's verl actor
(https://github.com/xiuyilou/TACO, `verl/workers/actor/dp_actor.py`, block "STAPO-style hard masking", keys `stapo_*`):

    candidates = valid tokens with A > 0              (all valid tokens when stapo_only_positive_advantage=False)
    H_q        = quantile_q(H over the candidates of the micro-batch)   (over all valid tokens when there is none)
    spurious   = candidate and p < stapo_prob_threshold and H < H_q
    loss mask  = 0 on spurious tokens                  (the official code multiplies verl's response_mask)

Statistics: the current policy (log-prob and entropy of the training forward). The entropy quantile is taken per
micro-batch and per process, as the official code does (`torch.quantile` over the micro-batch, no gather).
"""

from __future__ import annotations

from dataclasses import dataclass

from .batch import POLICY_ENTROPY, POLICY_LOGPS, CreditBatch, CreditResult
from .eapo import quantile_linear
from .registry import get_credit_method, paper, register_credit_method
from .settings import check_fields, hyperparameter, in_range

STAPO_PAPER = paper(
    "STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens",
    "2602.15620",
    "liu2026stapo",
    "Liu, Shiqi and He, Zeyu and Zhan, Guojian and Tao, Letian and Zheng, Zhilong and Wu, Jiang and Wang, Yinuo and "
    "Guan, Yang and Sheng, Kehua and Zhang, Bo and Li, Keqiang and Duan, Jingliang and Li, Shengbo Eben",
)


@dataclass
class STAPOArguments:
    """STAPO's hyperparameters (defaults of the TACO repository's `stapo_*` options)."""

    stapo_prob_threshold: float = hyperparameter(
        0.002, "STAPO: a candidate token is spurious when its current-policy probability is below this. In (0, 1)."
    )
    stapo_entropy_quantile: float = hyperparameter(
        0.1,
        "STAPO: ... and its entropy is below this quantile of the candidates' entropies in the micro-batch. "
        "In (0, 1).",
    )
    stapo_only_positive_advantage: bool = hyperparameter(
        True, "STAPO: only positive-advantage tokens are candidates (else every valid token)."
    )

    def __post_init__(self):
        check_fields(
            self,
            stapo_prob_threshold=in_range(0.0, 1.0, low_open=True, high_open=True),
            stapo_entropy_quantile=in_range(0.0, 1.0, low_open=True, high_open=True),
        )


@register_credit_method(
    "stapo",
    display_name="STAPO",
    statistics=(POLICY_LOGPS, POLICY_ENTROPY),
    arguments=STAPOArguments,
    paper=STAPO_PAPER,
    drops_tokens=True,
    keeps_signs=True,
)
def stapo(
    batch: CreditBatch, stapo_prob_threshold: float, stapo_entropy_quantile: float, stapo_only_positive_advantage: bool
) -> CreditResult:
    """Drops from the loss positive-advantage tokens with p < 0.002 and entropy below the micro-batch's 10th
    percentile.

    Metrics:
        dropped_fraction: fraction of valid tokens dropped from the loss
        dropped_fraction_pos: fraction of positive-advantage tokens dropped
        entropy_threshold: entropy quantile below which a candidate is spurious (mean over micro-batches)

    Token statistic:
        entropy: current-policy entropy H (nats)
    """
    logps_BT, entropy_BT, valid_BT = batch[POLICY_LOGPS], batch[POLICY_ENTROPY], batch.mask_BT
    positive_BT = valid_BT & (batch.advantages_BT > 0)
    candidate_BT = positive_BT if stapo_only_positive_advantage else valid_BT
    # The quantile (linear interpolation, as `torch.quantile`) of the candidates' entropies in this micro-batch; over
    # every valid token when there is no candidate, as the official code falls back.
    source_N = entropy_BT[candidate_BT] if candidate_BT.any() else entropy_BT[valid_BT]
    threshold = quantile_linear(source_N, stapo_entropy_quantile).item() if source_N.numel() else 0.0
    spurious_BT = candidate_BT & (logps_BT.exp() < stapo_prob_threshold) & (entropy_BT < threshold)
    counted = valid_BT.any().float()  # a micro-batch without valid tokens has no threshold to average in
    return CreditResult(
        advantages_BT=batch.advantages_BT.masked_fill(spurious_BT, 0.0),
        loss_mask_BT=(~spurious_BT).float(),
        metrics={
            "dropped_fraction": (spurious_BT, valid_BT),
            "dropped_fraction_pos": (spurious_BT & positive_BT, positive_BT),
            # A per-micro-batch threshold: averaged over the micro-batches with valid tokens, on every process.
            "entropy_threshold": (counted * threshold, counted),
        },
        statistic_BT=entropy_BT,
    )


# STAPO on plain tensors (one micro-batch): `stapo_advantages(advantages_B, mask_BT, policy_logps=...,
# policy_entropy=..., stapo_prob_threshold=...)`; the threshold is `metrics["entropy_threshold"][0]`.
stapo_advantages = get_credit_method("stapo").on_tensors

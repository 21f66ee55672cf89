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

from dataclasses import dataclass, field

import torch

from ._checks import check_range, check_token_inputs, in_range, paper
from .eapo import quantile_linear
from .registry import POLICY_ENTROPY, POLICY_LOGPS, CreditBatch, CreditResult, register_credit_method

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

    stapo_prob_threshold: float = field(
        default=0.002,
        metadata={
            "help": "STAPO: a candidate token is spurious when its current-policy probability is below this. In (0, 1)."
        },
    )
    stapo_entropy_quantile: float = field(
        default=0.1,
        metadata={
            "help": "STAPO: ... and its entropy is below this quantile of the candidates' entropies in the micro-batch. "
            "In (0, 1)."
        },
    )
    stapo_only_positive_advantage: bool = field(
        default=True,
        metadata={"help": "STAPO: only positive-advantage tokens are candidates (else every valid token)."},
    )


@torch.no_grad()
def stapo_advantages(
    advantages_BT: torch.Tensor,
    logps_BT: torch.Tensor,
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    prob_threshold: float = 0.002,
    entropy_quantile: float = 0.1,
    only_positive: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Silence STAPO's spurious tokens: low probability, low entropy, positive advantage.

    Args:
        advantages_BT: `(B, T)` token advantages (GRPO's `A_i` on every valid token, or a previous method's output).
        logps_BT: `(B, T)` log-probabilities of the sampled tokens under the current policy.
        entropy_BT: `(B, T)` entropies (nats) of the current policy.
        mask_BT: `(B, T)` valid completion positions.
        prob_threshold: `p` below which a candidate can be spurious, in `(0, 1)`.
        entropy_quantile: quantile `q` of the candidates' entropies (linear interpolation, as `torch.quantile`) below
            which a candidate can be spurious, in `(0, 1)`. Taken over the tokens passed in: the official code passes
            one micro-batch.
        only_positive: candidates are the positive-advantage tokens (else every valid token).

    Returns:
        `(advantages_BT, loss_mask_BT, entropy_threshold)`: the advantages with spurious tokens set to 0, the `(B, T)`
        float loss mask (0 on spurious tokens, 1 elsewhere) and the entropy threshold (0 without valid tokens).
    """
    check_range("prob_threshold", prob_threshold, 0.0, 1.0, low_open=True, high_open=True)
    check_range("entropy_quantile", entropy_quantile, 0.0, 1.0, low_open=True, high_open=True)
    valid_BT, (advantages_BT, logps_BT, entropy_BT) = check_token_inputs(
        advantages_BT, mask_BT, logps_BT=logps_BT, entropy_BT=entropy_BT
    )
    candidate_BT = valid_BT & (advantages_BT > 0) if only_positive else valid_BT
    source_N = entropy_BT[candidate_BT] if candidate_BT.any() else entropy_BT[valid_BT]
    threshold = quantile_linear(source_N, entropy_quantile).item() if source_N.numel() else 0.0
    spurious_BT = candidate_BT & (logps_BT.exp() < prob_threshold) & (entropy_BT < threshold)
    return advantages_BT.masked_fill(spurious_BT, 0.0), (~spurious_BT).float(), threshold


@register_credit_method(
    "stapo",
    statistics=(POLICY_LOGPS, POLICY_ENTROPY),
    arguments=STAPOArguments,
    checks={
        "stapo_prob_threshold": in_range(0.0, 1.0, low_open=True, high_open=True),
        "stapo_entropy_quantile": in_range(0.0, 1.0, low_open=True, high_open=True),
    },
    paper=STAPO_PAPER,
    drops_tokens=True,
    display_name="STAPO",
    summary="Drops from the loss positive-advantage tokens with p < 0.002 and entropy below the micro-batch's 10th "
    "percentile.",
    diagnostics={
        "dropped_fraction": "fraction of valid tokens dropped from the loss",
        "dropped_fraction_pos": "fraction of positive-advantage tokens dropped",
        "entropy_threshold": "entropy quantile below which a candidate is spurious (mean over micro-batches)",
    },
    token_statistic=("entropy", "current-policy entropy H (nats)"),
)
def stapo(
    batch: CreditBatch, stapo_prob_threshold: float, stapo_entropy_quantile: float, stapo_only_positive_advantage: bool
) -> CreditResult:
    entropy_BT = batch[POLICY_ENTROPY]
    advantages_BT, loss_mask_BT, threshold = stapo_advantages(
        batch.advantages_BT,
        batch[POLICY_LOGPS],
        entropy_BT,
        batch.mask_BT,
        stapo_prob_threshold,
        stapo_entropy_quantile,
        stapo_only_positive_advantage,
    )
    dropped_BT = batch.mask_BT & (loss_mask_BT == 0)
    positive_BT = batch.mask_BT & (batch.advantages_BT > 0)
    return CreditResult(
        advantages_BT=advantages_BT,
        loss_mask_BT=loss_mask_BT,
        metrics={
            "dropped_fraction": (dropped_BT, batch.mask_BT),
            "dropped_fraction_pos": (dropped_BT & positive_BT, positive_BT),
            # A per-micro-batch threshold: averaged over micro-batches and processes.
            "entropy_threshold": (
                batch.mask_BT.new_tensor(threshold, dtype=torch.float32),
                batch.mask_BT.new_tensor(1.0),
            ),
        },
        statistic_BT=entropy_BT,
    )

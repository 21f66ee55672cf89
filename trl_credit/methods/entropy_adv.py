"""EntropyAdv: an entropy bonus added to the advantage, bounded by the advantage (EAPO's strongest baseline).

"Reasoning with Exploration: An Entropy Perspective", https://huggingface.co/papers/2506.14758:

    psi = min(alpha * H_detached, |A| / kappa)        kappa > 1, so A + psi keeps the sign of A
    Â   = A + psi

The entropy is the current policy's, detached (a shaping term, not an entropy gradient). No official code was found;
the formula is the paper's, and the defaults `alpha = 0.4` (its GRPO setting; 0.1 with PPO) and `kappa = 2` are the
paper's as quoted by an independent implementation (lucidrains' PPO/GRPO trainers), which we could not check against
the paper's text. `A = 0` gives `psi = 0`.

Statistics: the current policy's entropy from the training forward (no extra forward). `A` is the incoming token
advantage (GRPO's `A_i`, or a previous method's output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ._checks import FINITE_NON_NEGATIVE, check_range, check_token_inputs, paper
from .registry import POLICY_ENTROPY, CreditBatch, CreditResult, register_credit_method

ENTROPY_ADV_PAPER = paper(
    "Reasoning with Exploration: An Entropy Perspective",
    "2506.14758",
    "cheng2025reasoning",
    "Cheng, Daixuan and Huang, Shaohan and Zhu, Xuekai and Dai, Bo and Zhao, Wayne Xin and Zhang, Zhenliang and "
    "Wei, Furu",
    year=2025,
)


@dataclass
class EntropyAdvArguments:
    """EntropyAdv's hyperparameters (the paper's GRPO setting)."""

    entropy_adv_alpha: float = field(
        default=0.4,
        metadata={
            "help": "EntropyAdv: entropy coefficient alpha (>= 0; 0 is GRPO). The paper uses 0.4 with GRPO, 0.1 with PPO."
        },
    )
    entropy_adv_kappa: float = field(
        default=2.0,
        metadata={"help": "EntropyAdv: the bonus is at most |A| / kappa. > 1, so no advantage changes sign."},
    )


def entropy_adv_bonus(
    advantages_BT: torch.Tensor, entropy_BT: torch.Tensor, alpha: float, kappa: float
) -> torch.Tensor:
    """`psi = min(alpha * H, |A| / kappa)`."""
    return torch.minimum(alpha * entropy_BT, advantages_BT.abs() / kappa)


@torch.no_grad()
def entropy_adv_advantages(
    advantages_BT: torch.Tensor,
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    alpha: float = 0.4,
    kappa: float = 2.0,
) -> torch.Tensor:
    """Add the bounded entropy bonus to every valid token's advantage.

    Args:
        advantages_BT: `(B, T)` token advantages.
        entropy_BT: `(B, T)` entropies (nats) of the current policy.
        mask_BT: `(B, T)` valid completion positions.
        alpha: entropy coefficient, `>= 0`.
        kappa: the bonus is at most `|A| / kappa`, `> 1`.

    Returns:
        `(B, T)` float32 token advantages, 0 on masked positions.
    """
    check_range("alpha", alpha, 0.0, math.inf, high_open=True)
    check_range("kappa", kappa, 1.0, math.inf, low_open=True, high_open=True)
    valid_BT, (advantages_BT, entropy_BT) = check_token_inputs(advantages_BT, mask_BT, entropy_BT=entropy_BT)
    return torch.where(valid_BT, advantages_BT + entropy_adv_bonus(advantages_BT, entropy_BT, alpha, kappa), 0.0)


@register_credit_method(
    "entropy_adv",
    statistics=(POLICY_ENTROPY,),
    arguments=EntropyAdvArguments,
    checks={
        "entropy_adv_alpha": FINITE_NON_NEGATIVE,
        "entropy_adv_kappa": (lambda k: 1.0 < k < math.inf, "finite and > 1"),
    },
    paper=ENTROPY_ADV_PAPER,
    display_name="EntropyAdv",
    summary="Adds a bounded entropy bonus min(alpha * H, |A| / kappa) to every token's advantage.",
    diagnostics={
        "mean_bonus": "mean entropy bonus psi over valid tokens",
        "bounded_fraction": "fraction of valid tokens whose bonus hit the bound |A| / kappa",
    },
    token_statistic=("bonus", "entropy bonus psi = min(alpha * H, |A| / kappa)"),
)
def entropy_adv(batch: CreditBatch, entropy_adv_alpha: float, entropy_adv_kappa: float) -> CreditResult:
    entropy_BT = batch[POLICY_ENTROPY]
    bonus_BT = entropy_adv_bonus(batch.advantages_BT, entropy_BT, entropy_adv_alpha, entropy_adv_kappa)
    bounded_BT = batch.mask_BT & (batch.advantages_BT.abs() / entropy_adv_kappa < entropy_adv_alpha * entropy_BT)
    return CreditResult(
        advantages_BT=entropy_adv_advantages(
            batch.advantages_BT, entropy_BT, batch.mask_BT, entropy_adv_alpha, entropy_adv_kappa
        ),
        metrics={"mean_bonus": bonus_BT, "bounded_fraction": (bounded_BT, batch.mask_BT)},
        statistic_BT=bonus_BT,
    )

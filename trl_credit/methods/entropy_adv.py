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
from dataclasses import dataclass

import torch

from .batch import POLICY_ENTROPY, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import FINITE_NON_NEGATIVE, check_fields, hyperparameter

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

    entropy_adv_alpha: float = hyperparameter(
        0.4, "EntropyAdv: entropy coefficient alpha (>= 0; 0 is GRPO). The paper uses 0.4 with GRPO, 0.1 with PPO."
    )
    entropy_adv_kappa: float = hyperparameter(
        2.0, "EntropyAdv: the bonus is at most |A| / kappa. > 1, so no advantage changes sign."
    )

    def __post_init__(self):
        check_fields(
            self,
            entropy_adv_alpha=FINITE_NON_NEGATIVE,
            entropy_adv_kappa=(lambda k: 1.0 < k < math.inf, "finite and > 1"),
        )


@register_credit_method(
    "entropy_adv",
    display_name="EntropyAdv",
    statistics=(POLICY_ENTROPY,),
    arguments=EntropyAdvArguments,
    paper=ENTROPY_ADV_PAPER,
    keeps_signs=True,
)
def entropy_adv(batch: CreditBatch, entropy_adv_alpha: float, entropy_adv_kappa: float) -> CreditResult:
    """Adds a bounded entropy bonus min(alpha * H, |A| / kappa) to every token's advantage.

    Metrics:
        mean_bonus: mean entropy bonus psi over valid tokens
        bounded_fraction: fraction of valid tokens whose bonus hit the bound |A| / kappa

    Token statistic:
        bonus: entropy bonus psi = min(alpha * H, |A| / kappa)
    """
    advantages_BT, entropy_BT, valid_BT = batch.advantages_BT, batch[POLICY_ENTROPY], batch.mask_BT
    entropy_bonus_BT = entropy_adv_alpha * entropy_BT
    bound_BT = advantages_BT.abs() / entropy_adv_kappa
    psi_BT = torch.minimum(entropy_bonus_BT, bound_BT)
    return CreditResult(
        advantages_BT=torch.where(valid_BT, advantages_BT + psi_BT, 0.0),
        metrics={"mean_bonus": psi_BT, "bounded_fraction": (valid_BT & (bound_BT < entropy_bonus_BT), valid_BT)},
        statistic_BT=psi_BT,
    )


# EntropyAdv on plain tensors: `entropy_adv_advantages(advantages_B, mask_BT, policy_entropy=..., entropy_adv_alpha=...)`.
entropy_adv_advantages = get_credit_method("entropy_adv").on_tensors

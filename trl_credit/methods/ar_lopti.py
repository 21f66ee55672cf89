"""AR-Lopti's advantage reweighting (AR).

"Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs", https://huggingface.co/papers/2505.12929
(code: https://github.com/zhyang2226/AR-Lopti). Rule and default as in the TACO repository's verl actor
(https://github.com/xiuyilou/TACO, `verl/workers/actor/dp_actor.py`, block "AR-Lopti style advantage reweighting",
keys `adv_reweight_*`), which TACO's paper compares against:

    Â = A * ((1 - alpha) + alpha * p_old)              both signs; p_old = the rollout policy's probability

`alpha = 0.1` is the TACO repository's default; AR-Lopti's own K&K scripts use `alpha = 0.2` (`REWEIGHT_K`).
Lopti (low-probability token isolation: two optimizer passes per batch) changes the update schedule, not the
credit, and is not part of this method.

Statistics: the rollout (old) log-prob, once per generation batch: TRL's old-log-prob forward when it runs, else one
no-grad forward (verl's `old_log_prob` is the same quantity: the policy that generated the batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._checks import check_range, check_token_inputs, in_range, paper
from .registry import ROLLOUT_LOGPS, CreditBatch, CreditResult, register_credit_method

AR_LOPTI_PAPER = paper(
    "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs",
    "2505.12929",
    "yang2025arlopti",
    "Yang, Zhihe and Luo, Xufang and Wang, Zilong and Han, Dongqi and He, Zhiyuan and Li, Dongsheng and Xu, Yunjian",
    year=2025,
)


@dataclass
class ARLoptiArguments:
    """AR-Lopti advantage reweighting's hyperparameter (the TACO repository's default)."""

    ar_lopti_alpha: float = field(
        default=0.1,
        metadata={
            "help": "AR-Lopti: token weight (1 - alpha) + alpha * p_rollout on every advantage. In [0, 1]; 0 is GRPO. "
            "AR-Lopti's own scripts use 0.2."
        },
    )


def ar_lopti_weights(rollout_logps_BT: torch.Tensor, alpha: float) -> torch.Tensor:
    """`(1 - alpha) + alpha * p_old`, in `[1 - alpha, 1]`."""
    return (1.0 - alpha) + alpha * rollout_logps_BT.exp()


@torch.no_grad()
def ar_lopti_advantages(
    advantages_BT: torch.Tensor, rollout_logps_BT: torch.Tensor, mask_BT: torch.Tensor, alpha: float = 0.1
) -> torch.Tensor:
    """Shrink the advantage of tokens the rollout policy found improbable, on both signs.

    Args:
        advantages_BT: `(B, T)` token advantages.
        rollout_logps_BT: `(B, T)` log-probabilities of the sampled tokens under the policy that generated them.
        mask_BT: `(B, T)` valid completion positions.
        alpha: interpolation factor, in `[0, 1]`; `0` is GRPO.

    Returns:
        `(B, T)` float32 token advantages, 0 on masked positions.
    """
    check_range("alpha", alpha, 0.0, 1.0)
    _, (advantages_BT, rollout_logps_BT) = check_token_inputs(
        advantages_BT, mask_BT, rollout_logps_BT=rollout_logps_BT
    )
    return advantages_BT * ar_lopti_weights(rollout_logps_BT, alpha)


@register_credit_method(
    "ar_lopti",
    statistics=(ROLLOUT_LOGPS,),
    arguments=ARLoptiArguments,
    checks={"ar_lopti_alpha": in_range(0.0, 1.0)},
    paper=AR_LOPTI_PAPER,
    display_name="AR-Lopti",
    summary="Scales every advantage by (1 - alpha) + alpha * p under the rollout policy.",
    diagnostics={"prob_mean": "mean rollout probability p of the sampled tokens"},
    token_statistic=("rollout_prob", "probability p of the sampled token under the rollout policy"),
)
def ar_lopti(batch: CreditBatch, ar_lopti_alpha: float) -> CreditResult:
    rollout_logps_BT = batch[ROLLOUT_LOGPS]
    return CreditResult(
        advantages_BT=ar_lopti_advantages(batch.advantages_BT, rollout_logps_BT, batch.mask_BT, ar_lopti_alpha),
        metrics={"prob_mean": rollout_logps_BT.exp()},
        statistic_BT=rollout_logps_BT.exp(),
    )

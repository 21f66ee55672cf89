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

from dataclasses import dataclass

from .batch import ROLLOUT_LOGPS, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import check_fields, hyperparameter, in_range

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

    ar_lopti_alpha: float = hyperparameter(
        0.1,
        "AR-Lopti: token weight (1 - alpha) + alpha * p_rollout on every advantage. In [0, 1]; 0 is GRPO. "
        "AR-Lopti's own scripts use 0.2.",
    )

    def __post_init__(self):
        check_fields(self, ar_lopti_alpha=in_range(0.0, 1.0))


@register_credit_method(
    "ar_lopti",
    display_name="AR-Lopti",
    statistics=(ROLLOUT_LOGPS,),
    arguments=ARLoptiArguments,
    paper=AR_LOPTI_PAPER,
    keeps_signs=True,
)
def ar_lopti(batch: CreditBatch, ar_lopti_alpha: float) -> CreditResult:
    """Scales every advantage by (1 - alpha) + alpha * p under the rollout policy.

    Metrics:
        prob_mean: mean rollout probability p of the sampled tokens

    Token statistic:
        rollout_prob: probability p of the sampled token under the rollout policy
    """
    rollout_probs_BT = batch[ROLLOUT_LOGPS].exp()
    return CreditResult(
        advantages_BT=batch.advantages_BT * ((1.0 - ar_lopti_alpha) + ar_lopti_alpha * rollout_probs_BT),
        metrics={"prob_mean": rollout_probs_BT},
        statistic_BT=rollout_probs_BT,
    )


# AR-Lopti on plain tensors: `ar_lopti_advantages(advantages_B, mask_BT, rollout_logps=..., ar_lopti_alpha=...)`.
ar_lopti_advantages = get_credit_method("ar_lopti").on_tensors

"""TACO: Tail-Aware Credit calibratiOn.

"When Implausible Tokens Get Reinforced: Tail-Aware Credit Calibration for LLM Reinforcement Learning",
https://huggingface.co/papers/2607.07976 (official code: https://github.com/xiuyilou/TACO).

    r = -log p - H + log(alpha)                       tail risk: r > 0  <=>  p < alpha * exp(-H)
    w = 1 - lam * (1 - exp(-max(r, 0)))               in (1 - lam, 1]
    Â = w * A  if A > 0,  else  A                     positive credit only shrinks; no renormalisation

`A` is the incoming token advantage (GRPO's `A_i`, or the previous method's output in a stack), as the official code
reads the `advantages` tensor it is handed.

Statistics: the current policy, from the training forward that also gives the PPO ratio (no extra forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .batch import POLICY_ENTROPY, POLICY_LOGPS, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import check_fields, hyperparameter, in_range

TACO_PAPER = paper(
    "When Implausible Tokens Get Reinforced: Tail-Aware Credit Calibration for LLM Reinforcement Learning",
    "2607.07976",
    "lou2026taco",
    "Lou, Xiuyi and Xu, Zicheng and Chuang, Yu-Neng and Le, Hoang Anh Duy and Xu, Zhaozhuo and Wang, Guanchu and "
    "Braverman, Vladimir",
)


@dataclass
class TACOArguments:
    """TACO's hyperparameters (paper defaults)."""

    taco_alpha: float = hyperparameter(
        0.01, "TACO tail threshold alpha: a token is in the tail when p < alpha * exp(-H). In (0, 1]."
    )
    taco_lambda: float = hyperparameter(
        0.9, "TACO maximal shrinkage lambda of tail tokens' positive credit. In [0, 1]; 0 is GRPO."
    )

    def __post_init__(self):
        check_fields(self, taco_alpha=in_range(0.0, 1.0, low_open=True), taco_lambda=in_range(0.0, 1.0))


def taco_tail_risk(logps_BT: torch.Tensor, entropy_BT: torch.Tensor, alpha: float = 0.01) -> torch.Tensor:
    """Tail risk `r = -log p - H + log(alpha)`; `r > 0` exactly when `p < alpha * exp(-H)`."""
    return -logps_BT - entropy_BT + math.log(alpha)


@register_credit_method(
    "taco",
    display_name="TACO",
    statistics=(POLICY_LOGPS, POLICY_ENTROPY),
    arguments=TACOArguments,
    paper=TACO_PAPER,
    keeps_signs=True,
)
def taco(batch: CreditBatch, taco_alpha: float, taco_lambda: float) -> CreditResult:
    """Shrinks the positive credit of implausible tail tokens (p < alpha * exp(-H)) by a factor in (1 - lambda,
    1].

    Metrics:
        tail_fraction: fraction of valid tokens in the tail (r > 0)
        tail_fraction_pos: fraction of positive-advantage tokens in the tail (the paper reports about 1.9 %)
        mean_tail_risk: mean tail risk r = -log p - H + log alpha over valid tokens
        pos_adv_fraction: fraction of valid tokens with a positive advantage

    Token statistic:
        tail_risk: r = -log p - H + log alpha; the token is in the tail when r > 0
    """
    logps_BT, entropy_BT = batch[POLICY_LOGPS], batch[POLICY_ENTROPY]
    risk_BT = taco_tail_risk(logps_BT, entropy_BT, taco_alpha)
    weights_BT = 1.0 - taco_lambda * (1.0 - torch.exp(-risk_BT.clamp(min=0.0)))  # exactly 1 outside the tail
    positive_BT = batch.mask_BT & (batch.advantages_BT > 0)  # the incoming token advantage's sign, as officially
    in_tail_BT = batch.mask_BT & (risk_BT > 0)
    return CreditResult(
        advantages_BT=torch.where(positive_BT, weights_BT * batch.advantages_BT, batch.advantages_BT),
        metrics={
            "tail_fraction": in_tail_BT.float(),
            "tail_fraction_pos": (in_tail_BT & positive_BT, positive_BT),
            "mean_tail_risk": risk_BT,
            "pos_adv_fraction": positive_BT.float(),
        },
        statistic_BT=risk_BT,
    )


# TACO on plain tensors: `taco_advantages(advantages_B, mask_BT, policy_logps=..., policy_entropy=..., taco_alpha=...)`.
taco_advantages = get_credit_method("taco").on_tensors

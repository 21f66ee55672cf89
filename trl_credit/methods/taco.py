"""TACO: Tail-Aware Credit calibratiOn.

"When Implausible Tokens Get Reinforced: Tail-Aware Credit Calibration for LLM Reinforcement Learning",
https://huggingface.co/papers/2607.07976 (official code: https://github.com/xiuyilou/TACO).

    r = -log p - H + log(alpha)                       tail risk: r > 0  <=>  p < alpha * exp(-H)
    w = 1 - lam * (1 - exp(-max(r, 0)))               in (1 - lam, 1]
    Â = w * A  if A > 0,  else  A                     positive credit only shrinks; no renormalisation

Statistics: the current policy, from the training forward that also gives the PPO ratio (no extra forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ._checks import check_inputs, check_range, in_range, paper
from .registry import POLICY_ENTROPY, POLICY_LOGPS, CreditBatch, CreditResult, register_credit_method

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

    taco_alpha: float = field(
        default=0.01,
        metadata={"help": "TACO tail threshold alpha: a token is in the tail when p < alpha * exp(-H). In (0, 1]."},
    )
    taco_lambda: float = field(
        default=0.9,
        metadata={"help": "TACO maximal shrinkage lambda of tail tokens' positive credit. In [0, 1]; 0 is GRPO."},
    )


def taco_tail_risk(logps_BT: torch.Tensor, entropy_BT: torch.Tensor, alpha: float = 0.01) -> torch.Tensor:
    """Tail risk `r = -log p - H + log(alpha)`; `r > 0` exactly when `p < alpha * exp(-H)`."""
    return -logps_BT - entropy_BT + math.log(alpha)


def taco_weights(logps_BT: torch.Tensor, entropy_BT: torch.Tensor, alpha: float, lam: float) -> torch.Tensor:
    """`w = 1 - lam * (1 - exp(-r))` for tail tokens (`r > 0`), else exactly 1."""
    risk_BT = taco_tail_risk(logps_BT, entropy_BT, alpha).clamp(min=0.0)
    return 1.0 - lam * (1.0 - torch.exp(-risk_BT))


@torch.no_grad()
def taco_advantages(
    advantages_B: torch.Tensor,
    logps_BT: torch.Tensor,
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    alpha: float = 0.01,
    lam: float = 0.9,
) -> torch.Tensor:
    """Shrink the positive credit of implausible tail tokens.

    Args:
        advantages_B: `(B,)` sequence advantages `A_i`.
        logps_BT: `(B, T)` log-probabilities of the sampled tokens under the current policy.
        entropy_BT: `(B, T)` full-vocabulary entropies (nats) of the current policy.
        mask_BT: `(B, T)` valid completion positions (bool or 0/1).
        alpha: tail threshold, in `(0, 1]`.
        lam: maximal shrinkage, in `[0, 1]`; `lam = 0` is GRPO.

    Returns:
        `(B, T)` float32 token advantages, 0 on masked positions.
    """
    check_range("alpha", alpha, 0.0, 1.0, low_open=True)
    check_range("lam", lam, 0.0, 1.0)
    valid_BT, (logps_BT, entropy_BT) = check_inputs(advantages_B, mask_BT, logps_BT=logps_BT, entropy_BT=entropy_BT)
    batch = CreditBatch.from_sequence_advantages(advantages_B, valid_BT)
    weights_BT = taco_weights(logps_BT, entropy_BT, alpha, lam)
    return _shrink_positive(batch, weights_BT)


def _shrink_positive(batch: CreditBatch, weights_BT: torch.Tensor) -> torch.Tensor:
    positive_BT = batch.mask_BT & (batch.sequence_advantages_B > 0).unsqueeze(1)
    return torch.where(positive_BT, weights_BT * batch.advantages_BT, batch.advantages_BT)


@register_credit_method(
    "taco",
    statistics=(POLICY_LOGPS, POLICY_ENTROPY),
    arguments=TACOArguments,
    checks={"taco_alpha": in_range(0.0, 1.0, low_open=True), "taco_lambda": in_range(0.0, 1.0)},
    paper=TACO_PAPER,
)
def taco(batch: CreditBatch, taco_alpha: float, taco_lambda: float) -> CreditResult:
    logps_BT, entropy_BT = batch[POLICY_LOGPS], batch[POLICY_ENTROPY]
    risk_BT = taco_tail_risk(logps_BT, entropy_BT, taco_alpha)
    in_tail_BT = batch.mask_BT & (risk_BT > 0)
    positive_BT = batch.mask_BT & (batch.sequence_advantages_B > 0).unsqueeze(1)
    return CreditResult(
        advantages_BT=_shrink_positive(batch, taco_weights(logps_BT, entropy_BT, taco_alpha, taco_lambda)),
        metrics={
            "tail_fraction": in_tail_BT.float(),
            "tail_fraction_pos": (in_tail_BT & positive_BT, positive_BT),
            "mean_tail_risk": risk_BT,
            "pos_adv_fraction": positive_BT.float(),
        },
        statistic_BT=risk_BT,
    )

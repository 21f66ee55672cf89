"""TACO: Tail-Aware Credit calibratiOn.

"When Implausible Tokens Get Reinforced: Tail-Aware Credit Calibration for LLM Reinforcement Learning",
https://huggingface.co/papers/2607.07976 (official code: https://github.com/xiuyilou/TACO).
"""

from __future__ import annotations

import math

import torch

from ._checks import check_range, prepare_inputs

_LOG2E = 1.0 / math.log(2.0)


def taco_tail_risk(logps_BT: torch.Tensor, entropy_BT: torch.Tensor, alpha: float = 0.01) -> torch.Tensor:
    """Tail risk `r = -log p - H + log(alpha)`; `r > 0` exactly when `p < alpha * exp(-H)`."""
    return -logps_BT - entropy_BT + torch.log(torch.tensor(alpha, dtype=logps_BT.dtype))


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

    A sampled token is in the tail when it is much less likely than the policy's typical token
    (`p < alpha * exp(-H)`). On responses with a positive advantage its credit is scaled by
    `w = 1 - lam * (1 - exp(-r))`, which lies in `(1 - lam, 1]`; every other token, and every response
    with `A <= 0`, keeps GRPO's advantage. Nothing is renormalised: positive credit only shrinks.

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
    inputs = dict(logps_BT=logps_BT, entropy_BT=entropy_BT)
    valid_BT, (logps_BT, entropy_BT) = prepare_inputs(advantages_B, mask_BT, check_finite=False, **inputs)
    adv_B = advantages_B.float()
    # x = log p + H is non-finite wherever an input is: one finiteness check for both (exact check only if not).
    shrink_BT = torch.add(logps_BT, entropy_BT)
    if not bool(torch.isfinite(shrink_BT.sum() + adv_B.sum())):
        valid_BT, (logps_BT, entropy_BT) = prepare_inputs(advantages_B, mask_BT, **inputs)
        shrink_BT = torch.add(logps_BT, entropy_BT)
    if lam == 0.0:
        return adv_B.unsqueeze(1) * valid_BT

    # exp(-max(r, 0)) - 1 with r = log(alpha) - x: one transcendental per token (exp2, cheaper than exp on CPU),
    # in place. It is exactly 0 where r <= 0, so those tokens keep exactly A.
    shrink_BT.sub_(math.log(alpha)).mul_(_LOG2E).clamp_(max=0.0).exp2_().sub_(1.0)
    # w = 1 + lam * (exp(-max(r, 0)) - 1) when A > 0, else 1: A w = A + c_B * shrink with c_B = A lam or 0.
    coef_B = torch.where(adv_B > 0, adv_B * lam, torch.zeros_like(adv_B))
    return shrink_BT.mul_(coef_B.unsqueeze(1)).add_(adv_B.unsqueeze(1)).mul_(valid_BT)

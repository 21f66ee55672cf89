"""TACO: Tail-Aware Credit calibratiOn.

"When Implausible Tokens Get Reinforced: Tail-Aware Credit Calibration for LLM Reinforcement Learning",
https://huggingface.co/papers/2607.07976 (official code: https://github.com/xiuyilou/TACO).
"""

from __future__ import annotations

import torch

from ._checks import check_inputs, check_range


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
    valid_BT = check_inputs(advantages_B, mask_BT, logps_BT=logps_BT, entropy_BT=entropy_BT)
    logps_BT, entropy_BT = logps_BT.float(), entropy_BT.float()
    adv_B = advantages_B.float()

    risk_BT = taco_tail_risk(logps_BT, entropy_BT, alpha)
    # clamp(min=0) makes r <= 0 give exactly w = 1 and keeps exp() away from overflow on masked garbage.
    weight_BT = 1.0 - lam * (1.0 - torch.exp(-risk_BT.clamp(min=0.0)))
    weight_BT = torch.where((adv_B > 0).unsqueeze(1), weight_BT, torch.ones_like(weight_BT))
    token_adv_BT = adv_B.unsqueeze(1) * weight_BT
    return torch.where(valid_BT, token_adv_BT, torch.zeros_like(token_adv_BT))

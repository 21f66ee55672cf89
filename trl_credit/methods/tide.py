"""TIDE: Token-level Importance via Deviation and Entropy.

"TIDE: Token-Level Credit Assignment via Entropy-Gated Bounded Deviation",
https://huggingface.co/papers/2605.03327 (v1/v2: "DGPO: Distribution-Guided Policy Optimization").
No official code is public; the formulas follow the paper's earlier versions.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_inputs, check_range

DISTANCES = ("squared_hellinger", "hellinger")


def tide_scores(
    deviation_BT: torch.Tensor, entropy_BT: torch.Tensor, vocab_size: int, kappa: float = 1.0
) -> torch.Tensor:
    """Gated deviation score `s = d * (H / log|V|) ** kappa`, with the entropy gate clamped to [0, 1]."""
    gate_BT = (entropy_BT.float() / math.log(vocab_size)).clamp(0.0, 1.0)
    return deviation_BT.float() * gate_BT.pow(kappa)


@torch.no_grad()
def tide_advantages(
    advantages_B: torch.Tensor,
    deviation_BT: torch.Tensor,
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    vocab_size: int,
    tau: float = 0.5,
    kappa: float = 1.0,
    distance: str = "squared_hellinger",
) -> torch.Tensor:
    """Give more credit to uncertain tokens where the policy moved away from the reference.

    `w = T_i * softmax_t(s / tau)` over the `T_i` valid tokens of response `i`, so the weights have
    mean 1 within each response and the response's mean token advantage stays `A_i` (both signs).

    Args:
        advantages_B: `(B,)` sequence advantages.
        deviation_BT: `(B, T)` squared Hellinger distance `1 - sum_v sqrt(pi * pi_ref)`, in `[0, 1]`.
        entropy_BT: `(B, T)` policy entropies (nats).
        mask_BT: `(B, T)` valid completion positions.
        vocab_size: `|V|`, normalises the entropy gate; `>= 2`.
        tau: softmax temperature, `> 0`.
        kappa: entropy-gate exponent, `>= 0` (`0` turns the gate off).
        distance: `"squared_hellinger"` uses `d` as given, `"hellinger"` uses `sqrt(d)`.

    Returns:
        `(B, T)` float32 token advantages, 0 on masked positions.
    """
    check_range("tau", tau, 0.0, math.inf, low_open=True, high_open=True)
    check_range("kappa", kappa, 0.0, math.inf, high_open=True)
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    if int(vocab_size) < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    valid_BT = check_inputs(advantages_B, mask_BT, deviation_BT=deviation_BT, entropy_BT=entropy_BT)
    # Rounding in a chunked computation can give d slightly outside [0, 1]; anything further is a bug upstream.
    deviation_BT = deviation_BT.float()
    if ((deviation_BT[valid_BT] < -1e-4) | (deviation_BT[valid_BT] > 1 + 1e-4)).any():
        raise ValueError("deviation_BT must be a squared Hellinger distance in [0, 1] at valid positions")
    deviation_BT = deviation_BT.clamp(0.0, 1.0)
    if distance == "hellinger":
        deviation_BT = deviation_BT.sqrt()

    score_BT = tide_scores(deviation_BT, entropy_BT, vocab_size, kappa)
    logits_BT = torch.where(valid_BT, score_BT / tau, torch.full_like(score_BT, -math.inf))
    # An all-masked row would softmax to NaN; give it zeros (its tokens are masked out anyway).
    has_valid_B = valid_BT.any(dim=1, keepdim=True)
    softmax_BT = torch.softmax(torch.where(has_valid_B, logits_BT, torch.zeros_like(logits_BT)), dim=1)
    weight_BT = valid_BT.sum(dim=1, keepdim=True).float() * softmax_BT
    token_adv_BT = advantages_B.float().unsqueeze(1) * weight_BT
    return torch.where(valid_BT, token_adv_BT, torch.zeros_like(token_adv_BT))

"""TIDE: Token-level Importance via Deviation and Entropy.

"TIDE: Token-Level Credit Assignment via Entropy-Gated Bounded Deviation",
https://huggingface.co/papers/2605.03327 (v1/v2: "DGPO: Distribution-Guided Policy Optimization").
No official code is public; the formulas follow the paper's earlier versions.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_range, prepare_inputs

_LOG2E = 1.0 / math.log(2.0)

DISTANCES = ("squared_hellinger", "hellinger")


def tide_entropy_gate(entropy_BT: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Normalised entropy `Hn = clamp(H / log|V|, 0, 1)`."""
    return (entropy_BT.float() / math.log(vocab_size)).clamp(0.0, 1.0)


def tide_scores(
    deviation_BT: torch.Tensor,
    entropy_BT: torch.Tensor,
    vocab_size: int,
    kappa: float = 1.0,
    distance: str = "squared_hellinger",
) -> torch.Tensor:
    """Gated deviation score `s = d * Hn ** kappa`, with `d` the squared Hellinger distance or its root.

    The reference formula (for diagnostics and tests); `tide_advantages` computes the same scores inline.
    """
    deviation_BT = deviation_BT.float().clamp(0.0, 1.0)
    if distance == "hellinger":
        deviation_BT = deviation_BT.sqrt()
    return deviation_BT * tide_entropy_gate(entropy_BT, vocab_size).pow(kappa)


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
    valid_BT, (deviation_BT, entropy_BT) = prepare_inputs(
        advantages_B, mask_BT, deviation_BT=deviation_BT, entropy_BT=entropy_BT
    )  # valid_BT: float 0/1 mask
    log_vocab = math.log(vocab_size)
    # One min/max pass each: the range check, and whether the clamps below can be skipped.
    d_min, d_max = (float(v) for v in torch.aminmax(deviation_BT))
    if d_min < -1e-4 or d_max > 1 + 1e-4:  # garbage under the mask may be out of range: check valid positions only
        deviation_BT = torch.where(valid_BT.bool(), deviation_BT, 0.0)
        d_min, d_max = (float(v) for v in torch.aminmax(deviation_BT))
        # Rounding in a chunked computation can give d slightly outside [0, 1]; anything further is a bug upstream.
        if d_min < -1e-4 or d_max > 1 + 1e-4:
            raise ValueError("deviation_BT must be a squared Hellinger distance in [0, 1] at valid positions")
    if d_min < 0.0 or d_max > 1.0:
        deviation_BT = deviation_BT.clamp(0.0, 1.0)
    if distance == "hellinger":
        deviation_BT = deviation_BT.sqrt()
    h_min, h_max = (float(v) for v in torch.aminmax(entropy_BT))

    # Scores s = d * gate in [0, 1], scaled by log2(e) / tau for exp2 (cheaper than exp on CPU).
    if kappa == 1.0 and 0.0 <= h_min and h_max <= log_vocab:  # the default: no clamp, no pow
        logits_BT = torch.mul(deviation_BT, entropy_BT).mul_(_LOG2E / (tau * log_vocab))
    else:
        logits_BT = torch.mul(entropy_BT, 1.0 / log_vocab).clamp_(0.0, 1.0).pow_(kappa).mul_(deviation_BT)
        logits_BT.mul_(_LOG2E / tau)
    # Softmax over the valid tokens of each row. Scores are bounded, so a constant shift replaces the row max:
    # none while a row sum cannot overflow, else the top score 1 / tau (exp2 then stays >= 2^-116, no underflow
    # to 0 of a whole row).
    max_log2 = _LOG2E / tau
    if max_log2 + math.log2(max(valid_BT.shape[1], 1)) > 120:
        if max_log2 > 120:  # tau < ~0.012: shift each row by its own largest valid score
            row_max_B = torch.where(valid_BT.bool(), logits_BT, -math.inf).amax(dim=1).clamp(min=0.0)
            logits_BT.sub_(row_max_B.unsqueeze(1)).clamp_(max=0.0)  # masked scores may exceed the valid max
        else:
            logits_BT.sub_(max_log2)
    exp_BT = logits_BT.exp2_().mul_(valid_BT)
    # w = count * softmax, so A w = exp * (A * count / sum); a row without valid tokens gets 0.
    count_B = valid_BT.sum(dim=1)
    # A row with valid tokens sums to >= 2^-120 (see the shift above); an empty one to 0, with count 0.
    scale_B = advantages_B.float() * count_B / exp_BT.sum(dim=1).clamp(min=torch.finfo(torch.float32).tiny)
    return exp_BT.mul_(scale_B.unsqueeze(1))

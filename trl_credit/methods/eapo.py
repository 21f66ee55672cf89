"""EAPO: Entropic Advantage Policy Optimization.

"Surprising Success, Repeated Failure: Entropy-Guided Credit Assignment for Exploration in LLM
Reasoning", https://huggingface.co/papers/2609.33781 (official code: https://github.com/wgcyeo/EAPO).
"""

from __future__ import annotations

import math

import torch

from ._checks import check_inputs, check_range, masked_mean_B

_EPS = 1e-8


def quantile_linear(values_N: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.quantile(values_N, q)` (linear interpolation) without its 16M-element input limit."""
    if values_N.numel() == 0:
        raise ValueError("cannot take a quantile of an empty set of valid tokens")
    sorted_N = torch.sort(values_N.float().flatten()).values
    position = q * (sorted_N.numel() - 1)
    below = math.floor(position)
    above = min(below + 1, sorted_N.numel() - 1)
    frac = position - below
    return sorted_N[below] + (sorted_N[above] - sorted_N[below]) * frac


def eapo_entropy_bounds(entropy_BT: torch.Tensor, mask_BT: torch.Tensor, quantiles=(0.1, 0.9)) -> tuple[float, float]:
    """Low and high entropy quantiles over the valid tokens; `(0, 0)` when there are none."""
    valid_N = entropy_BT[mask_BT.bool()]
    if valid_N.numel() == 0:
        return 0.0, 0.0
    return quantile_linear(valid_N, quantiles[0]).item(), quantile_linear(valid_N, quantiles[1]).item()


def eapo_kappa(kappa: float, step: int, decay_steps: int) -> float:
    """EAPO's optional linear decay of `kappa` to 0 over `decay_steps` optimizer steps (0 = constant)."""
    if decay_steps <= 0:
        return kappa
    return kappa * max(0.0, 1.0 - step / decay_steps)


def eapo_normalized_entropy(entropy_BT: torch.Tensor, q_lo: float, q_hi: float) -> torch.Tensor:
    """`h = clamp((H - q_lo) / (q_hi - q_lo + 1e-8), 0, 1)`: entropy min-max normalised between the bounds."""
    return ((entropy_BT - q_lo) / (q_hi - q_lo + _EPS)).clamp(0.0, 1.0)


@torch.no_grad()
def eapo_advantages(
    advantages_B: torch.Tensor,
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    kappa: float = math.log(4),
    quantiles: tuple[float, float] = (0.1, 0.9),
    entropy_bounds: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Move credit towards high-entropy tokens on success and towards low-entropy tokens on failure.

    Entropies are min-max normalised between two batch quantiles, `h in [0, 1]`; each token gets
    `r = exp(kappa * sign(A) * h)`, normalised to mean 1 over the response's valid tokens, so the mean
    token advantage of every response stays `A_i` and the ratio of its largest to smallest weight is at
    most `exp(kappa)`.

    Args:
        advantages_B: `(B,)` sequence advantages.
        entropy_BT: `(B, T)` entropies (nats) of the rollout policy.
        mask_BT: `(B, T)` valid completion positions.
        kappa: strength, `>= 0`; `kappa = 0` is GRPO. Paper default `log 4`.
        quantiles: `(lo, hi)` with `0 <= lo < hi <= 1`, taken over the valid tokens passed in.
        entropy_bounds: precomputed `(q_lo, q_hi)` entropy values, e.g. gathered over every process of
            the generation batch; when given, `quantiles` is not used.

    Returns:
        `(B, T)` float32 token advantages, 0 on masked positions. With `q_hi == q_lo` the normalised
        entropy is a step (0 at or below the bound, 1 above it), as the formula's `+1e-8` implies.
    """
    check_range("kappa", kappa, 0.0, math.inf, high_open=True)
    lo, hi = quantiles
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"quantiles must satisfy 0 <= lo < hi <= 1, got {tuple(quantiles)}")
    valid_BT = check_inputs(advantages_B, mask_BT, entropy_BT=entropy_BT)
    entropy_BT = entropy_BT.float()
    if entropy_bounds is None:
        entropy_bounds = eapo_entropy_bounds(entropy_BT, valid_BT, quantiles)
    q_lo, q_hi = (float(b) for b in entropy_bounds)
    if not (math.isfinite(q_lo) and math.isfinite(q_hi) and q_lo <= q_hi):
        raise ValueError(f"entropy_bounds must be finite with lo <= hi, got {tuple(entropy_bounds)}")
    adv_B = advantages_B.float()

    # Masked positions are zeroed before exp() so that garbage there cannot overflow.
    entropy_BT = torch.where(valid_BT, entropy_BT, torch.full_like(entropy_BT, q_lo))
    h_BT = eapo_normalized_entropy(entropy_BT, q_lo, q_hi)
    ratio_BT = torch.exp(kappa * torch.sign(adv_B).unsqueeze(1) * h_BT)
    weight_BT = ratio_BT / masked_mean_B(ratio_BT, valid_BT).clamp(min=_EPS).unsqueeze(1)
    token_adv_BT = adv_B.unsqueeze(1) * weight_BT
    return torch.where(valid_BT, token_adv_BT, torch.zeros_like(token_adv_BT))

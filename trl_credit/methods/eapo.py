"""EAPO: Entropic Advantage Policy Optimization.

"Surprising Success, Repeated Failure: Entropy-Guided Credit Assignment for Exploration in LLM
Reasoning", https://huggingface.co/papers/2609.33781 (official code: https://github.com/wgcyeo/EAPO).

    q_lo, q_hi = quantiles of H over every valid token of the generation batch (all processes)
    h = clamp((H - q_lo) / (q_hi - q_lo + 1e-8), 0, 1)
    r = exp(kappa * sign(A) * h)
    w = r / mean_{valid u in the response}(r)          mean weight 1 per response
    Â = A * w

Statistics: the rollout policy's entropy, once per generation batch, before TRL shuffles and splits it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ._checks import FINITE_NON_NEGATIVE, check_inputs, check_range, paper
from .registry import ROLLOUT_ENTROPY, CreditBatch, CreditResult, register_credit_method

_EPS = 1e-8

EAPO_PAPER = paper(
    "Surprising Success, Repeated Failure: Entropy-Guided Credit Assignment for Exploration in LLM Reasoning",
    "2609.33781",
    "yeo2026eapo",
    "Yeo, Woongyeong and Kang, Minki and Lee, Chanuk and Park, Sangwoo and Baek, Jinheon and Hwang, Sung Ju",
)


@dataclass
class EAPOArguments:
    """EAPO's hyperparameters (paper defaults)."""

    eapo_kappa: float = field(
        default=math.log(4),
        metadata={"help": "EAPO strength kappa (>= 0): max/min weight ratio in a response <= exp(kappa). 0 is GRPO."},
    )
    eapo_kappa_decay_steps: int = field(
        default=0,
        metadata={"help": "EAPO: decay kappa linearly to 0 over this many optimizer steps (0 = constant)."},
    )
    eapo_quantiles: list[float] = field(
        default_factory=lambda: [0.1, 0.9],
        metadata={"help": "EAPO entropy quantiles (lo, hi), batch-global over all processes, mapped to 0 and 1."},
    )


def _valid_quantiles(quantiles) -> bool:
    return len(quantiles) == 2 and 0.0 <= float(quantiles[0]) < float(quantiles[1]) <= 1.0


def quantile_linear(values_N: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.quantile(values_N, q)` (linear interpolation between order statistics) without its input-size limit."""
    if values_N.numel() == 0:
        raise ValueError("cannot take a quantile of an empty set of valid tokens")
    ordered_N = torch.sort(values_N.float().flatten()).values
    position = q * (ordered_N.numel() - 1)
    below = math.floor(position)
    above = min(below + 1, ordered_N.numel() - 1)
    return ordered_N[below] + (ordered_N[above] - ordered_N[below]) * (position - below)


def eapo_entropy_bounds(entropy_BT: torch.Tensor, mask_BT: torch.Tensor, quantiles=(0.1, 0.9)) -> tuple[float, float]:
    """Low and high entropy quantiles over the valid tokens; `(0, 0)` when there are none."""
    valid_N = entropy_BT[mask_BT.bool()]
    if valid_N.numel() == 0:
        return 0.0, 0.0
    return tuple(quantile_linear(valid_N, q).item() for q in quantiles)


def eapo_kappa_schedule(kappa: float, step: int, decay_steps: int) -> float:
    """EAPO's optional linear decay of `kappa` to 0 over `decay_steps` optimizer steps (0 = constant)."""
    if decay_steps <= 0:
        return kappa
    return kappa * max(0.0, 1.0 - step / decay_steps)


def eapo_normalized_entropy(entropy_BT: torch.Tensor, q_lo: float, q_hi: float) -> torch.Tensor:
    """`h = clamp((H - q_lo) / (q_hi - q_lo + 1e-8), 0, 1)`. With `q_hi == q_lo` it is a step at the bound."""
    return ((entropy_BT - q_lo) / (q_hi - q_lo + _EPS)).clamp(0.0, 1.0)


def eapo_weights(
    advantages_B: torch.Tensor, entropy_BT: torch.Tensor, valid_BT: torch.Tensor, kappa: float, q_lo: float, q_hi: float
) -> torch.Tensor:
    """`w = r / mean_valid(r)` with `r = exp(kappa * sign(A) * h)`; 0 at masked positions and in empty rows."""
    exponent_BT = kappa * torch.sign(advantages_B).unsqueeze(1) * eapo_normalized_entropy(entropy_BT, q_lo, q_hi)
    # Subtract each row's largest valid exponent before exp, as the official code does: w is unchanged, and a
    # large kappa can neither overflow to inf nor underflow a whole row to 0.
    exponent_BT = exponent_BT.masked_fill(~valid_BT, -math.inf)
    row_max_B = exponent_BT.amax(dim=1).nan_to_num(neginf=0.0)  # 0 for a row without valid tokens
    ratio_BT = torch.exp(exponent_BT - row_max_B.unsqueeze(1))  # exp(-inf) = 0 at masked positions
    mean_ratio_B = ratio_BT.sum(dim=1) / valid_BT.sum(dim=1).clamp(min=1)
    return ratio_BT / mean_ratio_B.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(1)


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

    Args:
        advantages_B: `(B,)` sequence advantages.
        entropy_BT: `(B, T)` entropies (nats) of the rollout policy.
        mask_BT: `(B, T)` valid completion positions.
        kappa: strength, `>= 0`; `kappa = 0` is GRPO. Paper default `log 4`.
        quantiles: `(lo, hi)` with `0 <= lo < hi <= 1`, taken over the valid tokens passed in.
        entropy_bounds: precomputed `(q_lo, q_hi)`, e.g. over every process of the generation batch; when given,
            `quantiles` is not used.

    Returns:
        `(B, T)` float32 token advantages, 0 on masked positions.
    """
    check_range("kappa", kappa, 0.0, math.inf, high_open=True)
    if not _valid_quantiles(quantiles):
        raise ValueError(f"quantiles must satisfy 0 <= lo < hi <= 1, got {tuple(quantiles)}")
    valid_BT, (entropy_BT,) = check_inputs(advantages_B, mask_BT, entropy_BT=entropy_BT)
    q_lo, q_hi = eapo_entropy_bounds(entropy_BT, valid_BT, quantiles) if entropy_bounds is None else entropy_bounds
    if not (math.isfinite(q_lo) and math.isfinite(q_hi) and q_lo <= q_hi):
        raise ValueError(f"entropy_bounds must be finite with lo <= hi, got {(q_lo, q_hi)}")
    weights_BT = eapo_weights(advantages_B.float(), entropy_BT, valid_BT, kappa, q_lo, q_hi)
    return advantages_B.float().unsqueeze(1) * weights_BT


@register_credit_method(
    "eapo",
    statistics=(ROLLOUT_ENTROPY,),
    arguments=EAPOArguments,
    checks={
        "eapo_kappa": FINITE_NON_NEGATIVE,
        "eapo_kappa_decay_steps": (lambda n: n >= 0, ">= 0"),
        "eapo_quantiles": (_valid_quantiles, "two values lo, hi with 0 <= lo < hi <= 1"),
    },
    paper=EAPO_PAPER,
)
def eapo(batch: CreditBatch, eapo_kappa: float, eapo_kappa_decay_steps: int, eapo_quantiles) -> CreditResult:
    entropy_BT = batch[ROLLOUT_ENTROPY]
    # Quantiles over every valid token of the generation batch, on every process.
    entropy_N = batch.gather(entropy_BT[batch.mask_BT])
    q_lo, q_hi = [quantile_linear(entropy_N, q).item() for q in eapo_quantiles] if entropy_N.numel() else [0.0, 0.0]
    kappa = eapo_kappa_schedule(eapo_kappa, batch.step, eapo_kappa_decay_steps)
    weights_BT = eapo_weights(batch.sequence_advantages_B, entropy_BT, batch.mask_BT, kappa, q_lo, q_hi)
    return CreditResult(
        advantages_BT=batch.advantages_BT * weights_BT,
        metrics={"q_lo": q_lo, "q_hi": q_hi, "kappa": kappa},
        statistic_BT=eapo_normalized_entropy(entropy_BT, q_lo, q_hi),
    )

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
from dataclasses import dataclass

import torch

from .batch import ROLLOUT_ENTROPY, CreditBatch, CreditResult
from .names import other_paper
from .registry import get_credit_method, paper, register_credit_method
from .settings import FINITE_NON_NEGATIVE, check_fields, hyperparameter

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

    eapo_kappa: float = hyperparameter(
        math.log(4), "EAPO strength kappa (>= 0): max/min weight ratio in a response <= exp(kappa). 0 is GRPO."
    )
    eapo_kappa_decay_steps: int = hyperparameter(
        0, "EAPO: decay kappa linearly to 0 over this many optimizer steps (0 = constant)."
    )
    eapo_quantiles: list[float] = hyperparameter(
        [0.1, 0.9], "EAPO entropy quantiles (lo, hi), batch-global over all processes, mapped to 0 and 1."
    )

    def __post_init__(self):
        check_fields(
            self,
            eapo_kappa=FINITE_NON_NEGATIVE,
            eapo_kappa_decay_steps=(lambda n: n >= 0, ">= 0"),
            eapo_quantiles=(_valid_quantiles, "two values lo, hi with 0 <= lo < hi <= 1"),
        )
        self.eapo_quantiles = [float(q) for q in self.eapo_quantiles]  # YAML and `--credit_kwargs` may give strings


def _valid_quantiles(quantiles) -> bool:
    return len(quantiles) == 2 and 0.0 <= float(quantiles[0]) < float(quantiles[1]) <= 1.0


def quantile_linear(values_N: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.quantile(values_N, q)` (linear interpolation between order statistics) without its input-size limit.

    The interpolation is `torch.lerp`, as `torch.quantile` and the official EAPO code take it; `a + (b - a) * w` rounds
    differently, which kappa magnifies (2e-6 relative in EAPO's advantages at kappa = 18)."""
    if values_N.numel() == 0:
        raise ValueError("cannot take a quantile of an empty set of valid tokens")
    values_N = values_N.float().flatten()
    position = q * (values_N.numel() - 1)
    below = math.floor(position)
    above = min(below + 1, values_N.numel() - 1)
    # Two selections (`kthvalue`, linear time) instead of a sort: the same order statistics, ~9x faster for 1M tokens.
    lower = values_N.kthvalue(below + 1).values
    upper = lower if above == below else values_N.kthvalue(above + 1).values
    return torch.lerp(lower, upper, position - below)


def eapo_kappa_schedule(kappa: float, step: int, decay_steps: int) -> float:
    """EAPO's optional linear decay of `kappa` to 0 over `decay_steps` optimizer steps (0 = constant)."""
    if decay_steps <= 0:
        return kappa
    return kappa * max(0.0, 1.0 - step / decay_steps)


def eapo_normalized_entropy(entropy_BT: torch.Tensor, q_lo: float, q_hi: float) -> torch.Tensor:
    """`h = clamp((H - q_lo) / (q_hi - q_lo + 1e-8), 0, 1)`. With `q_hi == q_lo` it is a step at the bound."""
    return ((entropy_BT - q_lo) / (q_hi - q_lo + _EPS)).clamp(0.0, 1.0)


@register_credit_method(
    "eapo",
    display_name="EAPO",
    statistics=(ROLLOUT_ENTROPY,),
    arguments=EAPOArguments,
    paper=EAPO_PAPER,
    keeps_signs=True,
    not_to_be_confused_with=(other_paper("EAPO", "Entropy-Aware Policy Optimization", "2604.11056"),),
)
def eapo(batch: CreditBatch, eapo_kappa: float, eapo_kappa_decay_steps: int, eapo_quantiles) -> CreditResult:
    """Moves credit towards high-entropy tokens in successes and low-entropy tokens in failures, mean weight 1
    per response.

    Metrics:
        q_lo: low entropy quantile of the generation batch (all processes)
        q_hi: high entropy quantile of the generation batch (all processes)
        kappa: strength kappa at this step (after the optional decay)

    Token statistic:
        normalized_entropy: h = clamp((H - q_lo) / (q_hi - q_lo), 0, 1) of the rollout policy
    """
    entropy_BT, valid_BT = batch[ROLLOUT_ENTROPY], batch.mask_BT
    # Quantiles over every valid token of the generation batch, on every process.
    entropy_N = batch.gather(entropy_BT[valid_BT])
    q_lo, q_hi = [quantile_linear(entropy_N, q).item() for q in eapo_quantiles] if entropy_N.numel() else [0.0, 0.0]
    kappa = eapo_kappa_schedule(eapo_kappa, batch.step, eapo_kappa_decay_steps)
    h_BT = eapo_normalized_entropy(entropy_BT, q_lo, q_hi)
    exponent_BT = (kappa * torch.sign(batch.sequence_advantages_B).unsqueeze(1) * h_BT).masked_fill(
        ~valid_BT, -math.inf
    )
    # r = exp(exponent), w = r / mean_valid(r). Shifting by each row's largest *valid* exponent leaves w unchanged and
    # keeps exp finite at any kappa. (The official code shifts by the maximum over all positions, padding included,
    # and floors the mean at 1e-8: from kappa ~ 18.4 on a padded row with A < 0 its weights stop averaging 1.)
    row_max_B = exponent_BT.amax(dim=1).nan_to_num(neginf=0.0)  # 0 for a row without valid tokens
    r_BT = torch.exp(exponent_BT - row_max_B.unsqueeze(1))  # 0 at masked positions
    mean_r_B = r_BT.sum(dim=1) / valid_BT.sum(dim=1).clamp(min=1)
    weights_BT = r_BT / mean_r_B.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(1)
    return CreditResult(
        advantages_BT=batch.advantages_BT * weights_BT,
        metrics={"q_lo": q_lo, "q_hi": q_hi, "kappa": kappa},
        statistic_BT=h_BT,
    )


# EAPO on plain tensors: `eapo_advantages(advantages_B, mask_BT, rollout_entropy=..., eapo_kappa=...)`; its quantiles
# span the rows passed in.
eapo_advantages = get_credit_method("eapo").on_tensors

"""TIDE: Token-level Importance via Deviation and Entropy.

"TIDE: Token-Level Credit Assignment via Entropy-Gated Bounded Deviation",
https://huggingface.co/papers/2605.03327 (v1/v2: "DGPO: Distribution-Guided Policy Optimization").
No official code is public; the formulas follow the paper's earlier versions.

    d  = 1 - sum_v sqrt(pi(v|s) * pi_ref(v|s))         squared Hellinger distance, in [0, 1]
    Hn = clamp(H(pi(.|s)) / log|V|, 0, 1)                entropy gate
    s  = d * Hn ** kappa
    w  = T_i * softmax_{valid t in the response}(s / tau)   mean weight 1 per response
    Â  = A * w

Statistics: the deviation of the policy from a frozen reference and the policy's entropy, once per generation batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .batch import PREVIOUS_POLICY_DEVIATION, REFERENCE_DEVIATION, ROLLOUT_ENTROPY, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import FINITE_NON_NEGATIVE, FINITE_POSITIVE, check_fields, hyperparameter

DISTANCES = ("squared_hellinger", "hellinger")
REFERENCES = ("ref", "old")

TIDE_PAPER = paper(
    "TIDE: Token-Level Credit Assignment via Entropy-Gated Bounded Deviation",
    "2605.03327",
    "jin2026tide",
    "Jin, Hongbo and Zhu, Rongpeng and Du, Zhongjing and Jiang, Xu and Tian, Jingqi and Zhang, Qiaoman and Ding, Jiayu",
)


@dataclass
class TIDEArguments:
    """TIDE's hyperparameters (paper defaults; `tide_distance` and `tide_reference` are the open choices)."""

    tide_tau: float = hyperparameter(
        0.5, "TIDE softmax temperature tau (> 0) over the gated deviation scores of a response."
    )
    tide_kappa: float = hyperparameter(
        1.0, "TIDE exponent kappa (>= 0) of the normalised-entropy gate; 0 turns the gate off."
    )
    tide_distance: str = hyperparameter("squared_hellinger", "TIDE deviation measure.", choices=DISTANCES)
    tide_reference: str = hyperparameter(
        "ref",
        "TIDE reference: 'ref' = frozen initial model (PEFT: adapter disabled), 'old' = the policy at the previous "
        "training generation batch.",
        choices=REFERENCES,
    )

    def __post_init__(self):
        check_fields(
            self,
            tide_tau=FINITE_POSITIVE,
            tide_kappa=FINITE_NON_NEGATIVE,
            tide_distance=(lambda d: d in DISTANCES, f"one of {DISTANCES}"),
            tide_reference=(lambda r: r in REFERENCES, f"one of {REFERENCES}"),
        )


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
    """Gated deviation score `s = d * Hn ** kappa`, with `d` the squared Hellinger distance or its root."""
    deviation_BT = deviation_BT.float().clamp(0.0, 1.0)
    if distance == "hellinger":
        deviation_BT = deviation_BT.sqrt()
    return deviation_BT * tide_entropy_gate(entropy_BT, vocab_size).pow(kappa)


def _tide_statistics(hyperparameters: dict) -> tuple[str, ...]:
    deviation = PREVIOUS_POLICY_DEVIATION if hyperparameters["tide_reference"] == "old" else REFERENCE_DEVIATION
    return (deviation, ROLLOUT_ENTROPY)


@register_credit_method(
    "tide",
    display_name="TIDE",
    statistics=_tide_statistics,
    arguments=TIDEArguments,
    paper=TIDE_PAPER,
    keeps_signs=True,
)
def tide(
    batch: CreditBatch, tide_tau: float, tide_kappa: float, tide_distance: str, tide_reference: str
) -> CreditResult:
    """Spreads each response's advantage by a softmax over the entropy-gated Hellinger deviation from a
    reference, mean weight 1 per response.

    Metrics:
        mean_deviation: mean squared Hellinger distance d to the reference over valid tokens
        mean_gate: mean entropy gate Hn = H / log|V| over valid tokens
        mean_score: mean gated deviation score s = d * Hn^kappa over valid tokens

    Token statistic:
        deviation: squared Hellinger distance d between the policy and the reference
    """
    if batch.vocab_size is None or batch.vocab_size < 2:
        raise ValueError(f"tide needs the vocabulary size |V| >= 2 for its entropy gate, got {batch.vocab_size}")
    deviation_BT = batch[_tide_statistics({"tide_reference": tide_reference})[0]]
    entropy_BT, valid_BT = batch[ROLLOUT_ENTROPY], batch.mask_BT
    scores_BT = tide_scores(deviation_BT, entropy_BT, batch.vocab_size, tide_kappa, tide_distance)
    # w = T_i * softmax over the valid tokens of each response; a row without valid tokens gets zeros, not NaN.
    logits_BT = (scores_BT / tide_tau).masked_fill(~valid_BT, -math.inf)
    softmax_BT = torch.softmax(logits_BT.masked_fill(~valid_BT.any(dim=1, keepdim=True), 0.0), dim=1) * valid_BT
    weights_BT = valid_BT.sum(dim=1, keepdim=True) * softmax_BT
    return CreditResult(
        advantages_BT=batch.advantages_BT * weights_BT,
        metrics={
            "mean_deviation": deviation_BT,
            "mean_gate": tide_entropy_gate(entropy_BT, batch.vocab_size),
            "mean_score": scores_BT,
        },
        statistic_BT=deviation_BT,
    )


# TIDE on plain tensors: `tide_advantages(advantages_B, mask_BT, reference_deviation=..., rollout_entropy=...,
# vocab_size=..., tide_tau=...)`.
tide_advantages = get_credit_method("tide").on_tensors

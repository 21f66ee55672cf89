"""High-entropy minority tokens ("80/20"): the policy gradient only on the highest-entropy tokens.

"Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning",
https://huggingface.co/papers/2506.01939. Rule and default as in the paper's code
(https://github.com/Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR, `verl/trainer/ppo/core_algos.py`,
`get_global_entropy_top_mask`, called from `verl/workers/actor/dp_actor.py`; the recipes set
`entropy_top_ratio=0.2`), over the tokens of one micro-batch:

    k         = max(1, ceil(rho * N))              N valid tokens (the code writes int(rho * N + 0.9999))
    kept      = the k valid tokens of highest current-policy entropy
    loss mask = kept                               (the code passes response_mask * mask to the policy-loss mean)

Statistics: the current policy's entropy from the training forward; like the official code, per micro-batch and
per process (no gather). Ties at the cut keep the earlier token (a stable sort; `torch.topk`'s order among equal
values is unspecified).

TRL's `top_entropy_quantile=rho` is the same idea but not the same rule: it keeps the tokens with `H >=` the
`(1 - rho)` quantile of the micro-batch's entropies gathered over every process (ties all kept, so the count can
differ from `ceil(rho * N)`), and it multiplies the per-token loss while the dropped tokens stay in the loss
normaliser. This method drops them from TRL's loss mask, so with `loss_type="bnpo"` (verl's per-micro-batch
token-mean, which the official code runs) the normaliser counts only the kept tokens, as there. The official mask
leaves the KL and entropy-bonus terms on every token; TRL's loss mask covers them too (the paper's recipes use
neither).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import POLICY_ENTROPY, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import check_fields, hyperparameter, in_range

HIGH_ENTROPY_PAPER = paper(
    "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning",
    "2506.01939",
    "wang2025beyond",
    "Wang, Shenzhi and Yu, Le and Gao, Chang and Zheng, Chujie and Liu, Shixuan and Lu, Rui and Dang, Kai and "
    "Chen, Xionghui and Yang, Jianxin and Zhang, Zhenru and Liu, Yuqiong and Yang, An and Zhao, Andrew and Yue, Yang "
    "and Song, Shiji and Yu, Bowen and Huang, Gao and Lin, Junyang",
    year=2025,
)


@dataclass
class HighEntropyArguments:
    """80/20's hyperparameter (the paper's recipes)."""

    high_entropy_top_ratio: float = hyperparameter(
        0.2,
        "80/20: fraction rho of a micro-batch's valid tokens, by highest entropy, that keep their policy "
        "gradient (at least one). In [0, 1]; 1 is GRPO.",
    )

    def __post_init__(self):
        check_fields(self, high_entropy_top_ratio=in_range(0.0, 1.0))


def high_entropy_count(num_valid: int, top_ratio: float) -> int:
    """`max(1, int(rho * N + 0.9999))`, the official code's ceiling of `rho * N`."""
    return max(1, int(num_valid * top_ratio + 0.9999))


@register_credit_method(
    "high_entropy",
    display_name="80/20",
    statistics=(POLICY_ENTROPY,),
    arguments=HighEntropyArguments,
    paper=HIGH_ENTROPY_PAPER,
    drops_tokens=True,
    keeps_signs=True,
)
def high_entropy(batch: CreditBatch, high_entropy_top_ratio: float) -> CreditResult:
    """Keeps in the loss only the 20 % highest-entropy tokens of each micro-batch.

    Metrics:
        entropy_threshold: lowest kept entropy (mean over micro-batches)

    Token statistic:
        entropy: current-policy entropy H (nats)
    """
    entropy_BT, valid_BT = batch[POLICY_ENTROPY], batch.mask_BT
    # The k valid tokens of highest entropy; a stable sort keeps the earlier of tied tokens.
    kept_BT = torch.zeros_like(valid_BT)
    positions_N = valid_BT.flatten().nonzero().squeeze(1)
    if positions_N.numel():
        order_N = torch.sort(entropy_BT.flatten()[positions_N], descending=True, stable=True).indices
        kept_BT.view(-1)[positions_N[order_N[: high_entropy_count(positions_N.numel(), high_entropy_top_ratio)]]] = (
            True
        )
    lowest_kept = entropy_BT[kept_BT].min() if kept_BT.any() else entropy_BT.new_tensor(0.0)
    counted = kept_BT.any().float()  # a micro-batch without valid tokens has no threshold to average in
    return CreditResult(
        advantages_BT=batch.advantages_BT.masked_fill(~kept_BT, 0.0),
        loss_mask_BT=kept_BT.float(),
        # The lowest kept entropy of each micro-batch, averaged over micro-batches and processes.
        metrics={"entropy_threshold": (lowest_kept.float() * counted, counted)},
        statistic_BT=entropy_BT,
    )


# 80/20 on plain tensors (one micro-batch): `high_entropy_advantages(advantages_B, mask_BT, policy_entropy=...,
# high_entropy_top_ratio=...)`.
high_entropy_advantages = get_credit_method("high_entropy").on_tensors

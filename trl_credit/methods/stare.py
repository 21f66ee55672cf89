"""STARE: Surprisal-guided Token-level Advantage Reweighting for policy Entropy stability.

"STARE: Surprisal-Guided Token-Level Advantage Reweighting for Policy Entropy Stability",
https://huggingface.co/papers/2606.19236. Rule and defaults as in the official code (https://github.com/hp-luo/STARE,
a verl 0.7 fork: `compute_stare_token_weights` in `verl/trainer/ppo/core_algos.py`, the gate of `STAREController`,
updated by `recipe/STARE/stare_ray_trainer.py`):

    gate  = mean entropy of the generation batch (old-log-prob forward, every valid token of every process) < H_tgt
    s     = -log p under the current policy                          surprisal, selects tokens only
    L+    = the ceil(P * |T+|) tokens of highest s among T+ = {valid, A > 0} of the micro-batch
    L-    = the same among T- = {valid, A < 0}                       variant C2 only
    w     = W on L+, M on L- (C2), 1 elsewhere, when the gate is on; 1 everywhere when it is off
    Â     = w * A

The official code multiplies verl's per-token clipped surrogate by `w`; for `w > 0` that equals scaling the advantage
(every TRL loss type is positively homogeneous in `A` per token), so the weight enters through the advantage.

Statistics: the current policy's log-probs, from the training forward (the selection runs per micro-batch and per
process, with no gather, as the official loss does); the gate reads `rollout_mean_entropy`, the token mean of the
rollout policy's entropy over the whole generation batch, as the official trainer computes it once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .batch import POLICY_LOGPS, ROLLOUT_MEAN_ENTROPY, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import check_fields, hyperparameter, in_range

STARE_PAPER = paper(
    "STARE: Surprisal-Guided Token-Level Advantage Reweighting for Policy Entropy Stability",
    "2606.19236",
    "luo2026stare",
    "Luo, Haipeng and Sun, Qingfeng and Wu, Songli and Xu, Can and Deng, Wenfeng and Hu, Han and Tang, Yansong",
)


@dataclass
class STAREArguments:
    """STARE's hyperparameters (the official recipe's defaults for 7B models)."""

    stare_variant: Literal["O1", "C2"] = hyperparameter(
        "O1",
        "STARE variant: O1 amplifies the high-surprisal positive-advantage tokens (W); C2 also attenuates "
        "the high-surprisal negative-advantage tokens (M).",
    )
    stare_top_p_ratio: float = hyperparameter(
        0.1,
        "STARE: share P of each advantage sign's tokens (highest surprisal -log p) that are reweighted, "
        "per micro-batch. In [0, 1]; 0 is GRPO.",
    )
    stare_reweight_w: float = hyperparameter(
        1.1, "STARE weight W of the selected positive-advantage tokens (> 0; the paper uses W > 1)."
    )
    stare_reweight_m: float = hyperparameter(
        0.9, "STARE weight M of the selected negative-advantage tokens, variant C2 (> 0; M < 1)."
    )
    stare_target_entropy: float = hyperparameter(
        0.3,
        "STARE target entropy (nats): reweighting is on only while the generation batch's mean rollout "
        "entropy is below it. >= 0; inf keeps it always on.",
    )

    def __post_init__(self):
        check_fields(
            self,
            stare_top_p_ratio=in_range(0.0, 1.0),
            stare_reweight_w=(_positive, "finite and > 0"),
            stare_reweight_m=(_positive, "finite and > 0"),
            stare_target_entropy=(lambda value: float(value) >= 0.0, ">= 0 (inf: always on)"),
        )


def stare_selection_size(candidate_count: int, top_p_ratio: float) -> int:
    """How many of `candidate_count` tokens are selected: `ceil(count * P)`, at least 1, as the official code rounds
    (`int(count * P + 0.999999)`); 0 without candidates or with `P = 0`."""
    if candidate_count == 0 or top_p_ratio <= 0.0:
        return 0
    return min(max(1, int(candidate_count * top_p_ratio + 0.999999)), candidate_count)


def _highest(surprisal_BT: torch.Tensor, candidates_BT: torch.Tensor, top_p_ratio: float) -> torch.Tensor:
    """The candidates of highest surprisal (`torch.topk` over the candidates in row-major order)."""
    selected_BT = torch.zeros_like(candidates_BT)
    k = stare_selection_size(int(candidates_BT.sum()), top_p_ratio)
    if k == 0:
        return selected_BT
    top_k = torch.topk(surprisal_BT[candidates_BT], k=k, largest=True).indices
    selected_BT.view(-1)[candidates_BT.view(-1).nonzero().squeeze(1)[top_k]] = True
    return selected_BT


def _positive(value) -> bool:
    return 0.0 < float(value) < float("inf")


@register_credit_method(
    "stare",
    display_name="STARE",
    statistics=(POLICY_LOGPS, ROLLOUT_MEAN_ENTROPY),
    arguments=STAREArguments,
    paper=STARE_PAPER,
    keeps_signs=True,
)
def stare(
    batch: CreditBatch,
    stare_variant: str,
    stare_top_p_ratio: float,
    stare_reweight_w: float,
    stare_reweight_m: float,
    stare_target_entropy: float,
) -> CreditResult:
    """While the batch's mean entropy is below a target, multiplies by W the advantage of the 10 %
    highest-surprisal positive-advantage tokens of each micro-batch (C2: and by M the negative ones).

    Metrics:
        gate_on: share of micro-batches whose reweighting was on (mean entropy below the target)
        batch_entropy: mean rollout entropy of the generation batch, which the gate compares with the target
        target_entropy: the target entropy of the gate
        reweighted_fraction: fraction of valid tokens whose advantage was reweighted (0 while the gate is off)
        positive_selected_fraction: fraction of valid tokens in L+ (selected whether or not the gate is on)
        negative_selected_fraction: fraction of valid tokens in L- (variant C2)

    Token statistic:
        surprisal: -log p under the current policy; the highest of each advantage sign are reweighted
    """
    advantages_BT, mask_BT = batch.advantages_BT, batch.mask_BT
    # The same value at every valid position of the generation batch; a micro-batch without one reweights nothing.
    has_valid = bool(mask_BT.any())
    batch_entropy = batch[ROLLOUT_MEAN_ENTROPY][mask_BT][0] if has_valid else mask_BT.new_zeros((), dtype=torch.float)
    # Two Python floats, as the official controller compares them: a tensor comparison would round the target to
    # the entropy's float32.
    gate_on = has_valid and float(batch_entropy) < float(stare_target_entropy)
    surprisal_BT = -batch[POLICY_LOGPS]
    # L+ and L- are selected whether or not the gate is on: the official code logs them either way.
    l_plus_BT = _highest(surprisal_BT, mask_BT & (advantages_BT > 0), stare_top_p_ratio)
    l_minus_BT = torch.zeros_like(mask_BT)
    if stare_variant == "C2":
        l_minus_BT = _highest(surprisal_BT, mask_BT & (advantages_BT < 0), stare_top_p_ratio)
    weights_BT = torch.ones_like(surprisal_BT)
    if gate_on:
        weights_BT = weights_BT.masked_fill(l_plus_BT, stare_reweight_w).masked_fill(l_minus_BT, stare_reweight_m)
    one = mask_BT.new_tensor(float(has_valid))
    reweighted_BT = (l_plus_BT | l_minus_BT) & gate_on
    return CreditResult(
        advantages_BT=weights_BT * advantages_BT,
        metrics={
            "gate_on": (one * gate_on, one),
            "batch_entropy": (batch_entropy.float() * one, one),
            "target_entropy": float(stare_target_entropy),
            "reweighted_fraction": (reweighted_BT, mask_BT),
            "positive_selected_fraction": (l_plus_BT, mask_BT),
            "negative_selected_fraction": (l_minus_BT, mask_BT),
        },
        statistic_BT=surprisal_BT,
    )


# STARE on plain tensors (one micro-batch): `stare_advantages(advantages_B, mask_BT, policy_logps=...,
# rollout_mean_entropy=..., stare_variant=...)`, the batch's mean entropy at every valid position.
stare_advantages = get_credit_method("stare").on_tensors

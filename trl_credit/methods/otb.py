"""OTB: the Optimal Token Baseline, an advantage estimator.

"The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL", https://huggingface.co/papers/2602.07078.
Rule and defaults as in verl (https://github.com/verl-project/verl, `compute_optimal_token_baseline_advantage` in
`verl/trainer/ppo/core_algos.py`, registered as the `optimal_token_baseline` advantage estimator):

    w_t  = 1 - 2 pi_t + sum_v pi_v^2           per valid token (pi_t: the sampled token's probability)
    W_t  = sum_{j <= t} w_j                     cumulative path variance, over the valid tokens of the response
    B_t  = sum_i G_i W_it / (sum_i W_it + 1e-8) over the responses i of one prompt's group valid at position t
    Â_t  = G_i - B_t                            G_i: the raw reward (its reward-to-go, 1 reward per response)

A group of one response has no baseline (`Â = G`). With `otb_handle_zero_tail` (verl's default), the part of a
group's single longest response beyond the second-longest one gets no baseline either.

It replaces GRPO's advantage instead of reshaping it: it reads the raw rewards and the group of each row, ignores the
incoming advantages, and must come first in a stack; the methods after it reshape its token advantages.

Statistics: the rollout policy's log-probs and `sum_v pi_v^2`, once per generation batch (verl reads the old-log-prob
forward). Groups may span processes: the sums over a group are taken over every process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch import ROLLOUT_LOGPS, ROLLOUT_SUM_SQ_PROBS, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method

_EPS = 1e-8  # verl's `epsilon` in the baseline's denominator

OTB_PAPER = paper(
    "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL",
    "2602.07078",
    "li2026otb",
    "Li, Yingru and Xu, Jiawei and Li, Ziniu and Liu, Jiacai and Liu, Wei and Tong, Yuxuan and Zheng, Longtao and "
    "Xue, Zhenghai and Zhang, Yaxiang and Cai, Tianle and Zhang, Ge and Liu, Qian and Wang, Baoxiang",
)


@dataclass
class OTBArguments:
    """OTB's options (verl's defaults)."""

    otb_handle_zero_tail: bool = field(
        default=True,
        metadata={
            "help": "OTB: give no baseline to the part of a group's single longest response beyond the second-longest "
            "(verl's default)."
        },
    )


def otb_path_variance(logps_BT: torch.Tensor, sum_sq_probs_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """`W_t`: the cumulative sum over the response of `1 - 2 pi_t + sum_v pi_v^2` on valid tokens, `(B, T)` float32."""
    return ((1.0 - 2.0 * logps_BT.float().exp() + sum_sq_probs_BT.float()) * mask_BT).cumsum(dim=1)


@torch.no_grad()
def otb_baselines(
    rewards_B: torch.Tensor,
    group_index_B: torch.Tensor,
    path_variance_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    handle_zero_tail: bool = True,
    gather=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token baselines `B_t` of this process's rows, `(B, T)` float32 (0 where masked), and the bool mask of
    the tokens whose baseline the zero-tail rule removed.

    `gather` concatenates every process's values (a collective): a group's sums run over all its rows, wherever they are.
    Without it, the rows passed in are the whole batch.
    """
    gather = gather or (lambda values_N: values_N)
    valid_BT = mask_BT.bool()
    num_tokens = valid_BT.size(1)
    flat_N = valid_BT.flatten().nonzero().squeeze(1)  # the valid tokens, found once
    rows_N, position_N = flat_N // num_tokens, flat_N % num_tokens
    weight_N = path_variance_BT.flatten()[flat_N].float()
    local_groups_B = group_index_B.float().double()
    # Every process's valid tokens, keyed by (group, position), in float64 sums.
    groups_N = gather(local_groups_B.float()[rows_N]).double()
    positions_N = gather(position_N.float()).double()
    weights_N = gather(weight_N).double()
    weighted_returns_N = gather(rewards_B.float()[rows_N] * weight_N).double()
    all_groups_R = gather(group_index_B.float())
    all_lengths_R = gather(valid_BT.sum(dim=1).float())
    # A dense (group, position) table: the groups are found among the rows (few), not among the tokens, so no sort of
    # the batch's tokens; each slot sums its tokens in the order of the tokens.
    group_ids = torch.unique(all_groups_R.double())
    stride = int(positions_N.max().item()) + 1 if positions_N.numel() else 1
    slot_N = torch.searchsorted(group_ids, groups_N) * stride + positions_N.long()
    numerator = torch.zeros(group_ids.numel() * stride, dtype=torch.float64, device=group_ids.device)
    numerator.index_add_(0, slot_N, weighted_returns_N)
    denominator = torch.zeros_like(numerator).index_add_(0, slot_N, weights_N)
    local_group_B = torch.searchsorted(group_ids, local_groups_B)
    local_slot_N = local_group_B[rows_N] * stride + position_N
    baselines_BT = torch.zeros(valid_BT.shape, dtype=torch.float32, device=valid_BT.device)
    baselines_BT.view(-1)[flat_N] = (numerator[local_slot_N] / (denominator[local_slot_N] + _EPS)).float()

    # Per group, over every process's rows: its size, its longest response (valid-token count), how many responses
    # have that length, and the longest of the others (the second longest when the longest is alone).
    group_R = torch.searchsorted(group_ids, all_groups_R.double())
    sizes_K = torch.bincount(group_R, minlength=group_ids.numel())
    longest_K = torch.full((group_ids.numel(),), -1.0, device=group_R.device)
    longest_K.scatter_reduce_(0, group_R, all_lengths_R, "amax")
    is_longest_R = all_lengths_R == longest_K[group_R]
    longest_count_K = torch.bincount(group_R, weights=is_longest_R.double(), minlength=group_ids.numel())
    second_K = torch.full_like(longest_K, -1.0).scatter_reduce_(
        0, group_R, all_lengths_R.masked_fill(is_longest_R, -1.0), "amax"
    )
    lengths_B = valid_BT.sum(dim=1).float()
    alone_B = sizes_K[local_group_B] < 2  # a group of one response: no baseline
    # The only longest response of its group loses its baseline past the second longest's length.
    tail_B = ~alone_B & (longest_count_K[local_group_B] == 1) & (lengths_B == longest_K[local_group_B])
    past_second_BT = torch.arange(num_tokens, device=valid_BT.device) >= second_K[local_group_B].view(-1, 1)
    zero_tail_BT = (tail_B.view(-1, 1) & past_second_BT & valid_BT) if handle_zero_tail else torch.zeros_like(valid_BT)
    baselines_BT = baselines_BT.masked_fill(zero_tail_BT | alone_B.view(-1, 1), 0.0)
    return baselines_BT, zero_tail_BT


@register_credit_method(
    "otb",
    statistics=(ROLLOUT_LOGPS, ROLLOUT_SUM_SQ_PROBS),
    arguments=OTBArguments,
    paper=OTB_PAPER,
    estimates_advantages=True,
)
def otb(batch: CreditBatch, otb_handle_zero_tail: bool) -> CreditResult:
    """OTB: Advantage estimator: each token gets its raw reward minus the group's per-position baseline, weighted by
    the cumulative path variance 1 - 2p + sum p^2 (must come first in a stack).

    Metrics:
        mean_baseline: mean baseline B_t over valid tokens
        mean_path_variance: mean cumulative path variance W_t over valid tokens
        zero_tail_fraction: fraction of valid tokens left without a baseline by the zero-tail rule

    Token statistic:
        baseline: the group's optimal token baseline B_t at the token's position
    """
    mask_BT = batch.mask_BT
    path_variance_BT = otb_path_variance(batch[ROLLOUT_LOGPS], batch[ROLLOUT_SUM_SQ_PROBS], mask_BT)
    baselines_BT, zero_tail_BT = otb_baselines(
        batch.rewards_B, batch.group_index_B, path_variance_BT, mask_BT, otb_handle_zero_tail, batch.gather
    )
    returns_BT = batch.rewards_B.float().view(-1, 1) * mask_BT
    return CreditResult(
        advantages_BT=(returns_BT - baselines_BT) * mask_BT,
        metrics={
            "mean_baseline": baselines_BT,
            "mean_path_variance": path_variance_BT,
            "zero_tail_fraction": (zero_tail_BT, mask_BT),
        },
        statistic_BT=baselines_BT,
    )


# OTB on plain tensors (every row of every group): `otb_advantages(None, mask_BT, rewards_B=..., group_index_B=...,
# rollout_logps=..., rollout_sum_sq_probs=...)`.
otb_advantages = get_credit_method("otb").on_tensors

"""OTB: the Optimal Token Baseline, an advantage estimator.

"The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL", https://huggingface.co/papers/2602.07078.
Rule and defaults as in verl (https://github.com/verl-project/verl, `compute_optimal_token_baseline_advantage` in
`verl/trainer/ppo/core_algos.py`, registered as the `optimal_token_baseline` advantage estimator):

    w_t  = 1 - 2 pi_t + sum_v pi_v^2           per valid token (pi_t: the sampled token's probability)
         = (1 - pi_t)^2 + sum_{v != t} pi_v^2  computed so (see below)
    W_t  = sum_{j <= t} w_j                     cumulative path variance, over the valid tokens of the response
    B_t  = sum_i G_i W_it / (sum_i W_it + 1e-8) over the responses i of one prompt's group valid at position t
    Â_t  = G_i - B_t                            G_i: the raw reward (its reward-to-go, 1 reward per response)

A group of one response has no baseline (`Â = G`). With `otb_handle_zero_tail` (verl's default), the part of a
group's single longest response beyond the second-longest one gets no baseline either.

It replaces GRPO's advantage instead of reshaping it: it reads the raw rewards and the group of each row, ignores the
incoming advantages, and must come first in a stack; the methods after it reshape its token advantages.

Statistics: the rollout policy's `1 - pi_t` and `sum_{v != t} pi_v^2`, once per generation batch (verl reads the
old-log-prob forward), each summed over the tokens other than the sampled one. Groups may span processes: the sums over
a group are taken over every process.

Departure from verl, in precision only: verl computes `1 - 2 pi_t + sum_v pi_v^2` as written, from `exp(log pi_t)`
and the full `sum_v pi_v^2`. On a near-certain token (pi_t >= 0.9996, most tokens of a reasoning model) the exact
`w_t` is 1e-9 to 1e-7, below float32's rounding of those terms, so verl's float32 `w_t` there is noise (0, 2.4e-7,
9.5e-7, even negative) and so is every baseline built on it. The second form has no cancellation: both terms are
sums of non-negative numbers that leave the sampled token out, so `w_t` keeps float32's relative precision for any
pi_t. Where verl's `w_t` is well-conditioned the two agree to float32 rounding (`tests/test_otb.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import ROLLOUT_UNSAMPLED_MASS, ROLLOUT_UNSAMPLED_SUM_SQ_PROBS, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import hyperparameter

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

    otb_handle_zero_tail: bool = hyperparameter(
        True,
        "OTB: give no baseline to the part of a group's single longest response beyond the second-longest "
        "(verl's default).",
    )


def otb_path_variance(
    unsampled_mass_BT: torch.Tensor, unsampled_sum_sq_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """`W_t`: the cumulative sum over the response of `w_t = (1 - pi_t)^2 + sum_{v != t} pi_v^2` on valid tokens,
    `(B, T)` float32."""
    return ((unsampled_mass_BT.float().square() + unsampled_sum_sq_BT.float()) * mask_BT).cumsum(dim=1)


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
    # Every process's rows, dense: each process pads its completions to its own longest one, so the rows are padded
    # to the widest process's width before they are concatenated.
    width = int(gather(torch.tensor([num_tokens], device=valid_BT.device)).max().item())
    local_weights_BT = torch.nn.functional.pad(path_variance_BT.float() * valid_BT, (0, width - num_tokens))
    all_rewards_R = gather(rewards_B.float()).double()
    all_weights_RT = gather(local_weights_BT.flatten()).view(all_rewards_R.numel(), width).double()
    all_groups_R = gather(group_index_B.float())
    all_lengths_R = gather(valid_BT.sum(dim=1).float())
    # B_t per group and position, summed in float64 over the group's rows (verl: one group at a time).
    group_ids, group_R = torch.unique(all_groups_R, return_inverse=True)
    numerator_KT = all_weights_RT.new_zeros(group_ids.numel(), width)
    numerator_KT.index_add_(0, group_R, all_rewards_R.view(-1, 1) * all_weights_RT)
    denominator_KT = torch.zeros_like(numerator_KT).index_add_(0, group_R, all_weights_RT)
    local_group_B = torch.searchsorted(group_ids, group_index_B.float())
    group_baselines_KT = (numerator_KT / (denominator_KT + _EPS)).float()
    baselines_BT = group_baselines_KT[local_group_B, :num_tokens] * valid_BT

    # Per group, over every process's rows: its size, its longest response (valid-token count), how many responses
    # have that length, and the longest of the others (the second longest when the longest is alone).
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
    display_name="OTB",
    statistics=(ROLLOUT_UNSAMPLED_MASS, ROLLOUT_UNSAMPLED_SUM_SQ_PROBS),
    arguments=OTBArguments,
    paper=OTB_PAPER,
    estimates_advantages=True,
)
def otb(batch: CreditBatch, otb_handle_zero_tail: bool) -> CreditResult:
    """Advantage estimator: each token gets its raw reward minus the group's per-position baseline, weighted by
    the cumulative path variance 1 - 2p + sum p^2 (must come first in a stack).

    Metrics:
        mean_baseline: mean baseline B_t over valid tokens
        mean_path_variance: mean cumulative path variance W_t over valid tokens
        zero_tail_fraction: fraction of valid tokens left without a baseline by the zero-tail rule

    Token statistic:
        baseline: the group's optimal token baseline B_t at the token's position
    """
    mask_BT = batch.mask_BT
    path_variance_BT = otb_path_variance(batch[ROLLOUT_UNSAMPLED_MASS], batch[ROLLOUT_UNSAMPLED_SUM_SQ_PROBS], mask_BT)
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
# rollout_unsampled_mass=..., rollout_unsampled_sum_sq_probs=...)`.
otb_advantages = get_credit_method("otb").on_tensors

"""GTPO: Group-relative Trajectory-based Policy Optimization.

"GTPO: Trajectory-Based Policy Optimization in Large Language Models", https://huggingface.co/papers/2508.03772.
Rule and defaults as in the official code (https://github.com/winstonsmith1897/GTPO, `gtpo/gtpo_training.py`, last
changed in commit df35bd3 and the file the README of commit 5d33811 runs: `build_conflict_mask` and
`UnslothEfficientGTPO.forward`), per prompt group:

    s_i    = sign(A_i)                                  completions with A_i = 0 take no part in the conflicts
    P      = `gtpo_pad_id` (official PAD_ID): it only keeps tokens out of the runs
    x_i(k) = the k-th valid token of completion i (k = 0, 1, ...); past its end, the ids TRL put there
             (the tokenizer's pad id, a masked completion's own tokens): the official keys read them
    c_i(k) = some completion with s = +1 and some with s = -1 have the token x_i(k) at rank k
    F_i(k) = c_i(0) and ... and c_i(k), and x_i(k) != P             conflict run from the start
    R_i(k) = the same with ranks counted from the last valid token,  conflict run from the end
             and the token at rank k from the start != P             (the official code's coordinates)
    d_i(k) = prod over the runs holding the token of (W if s_i > 0 else 0), 1 outside both runs
    n_i    = max(1, number of ranks k at which either run holds)    F_i(k) or R_i(k), as the official code counts
    H_i    = mean entropy over completion i's valid tokens
    Â_i(k) = d_i(k) * (A_i(k) - gamma * H_i) / n_i   if H_i <= tau,   else 0

A conflict token's negative update is skipped (`d = 0`) and its positive one multiplied by `W` (`W^2` for a token in
both runs, as the official product of the two masks gives). The official loss divides each completion's token mean by
`n_i`; that factor rides on the advantage here, so under TRL's `grpo` loss (token mean per completion, then mean over
completions) the gradient is the official one divided by the number of completions in the micro-batch (the official
loss sums over them, a constant factor). The other loss types normalise the lengths as they do for GRPO. The entropy
shaping applies to every completion under the threshold, `A_i = 0` included (`Â = -gamma H_i / n_i`), and may change
an advantage's sign, as officially. The conflict groups are the prompts' groups; the official code takes a whole
micro-batch as one, which is the same with one prompt per micro-batch, as in its recipe (docs/methods.md).

`A_i(k)` is the incoming token advantage; the sign `s_i` is that of GRPO's sequence advantage (what the official code
reads). The official recipe uses unscaled group advantages (`r - mean`): TRL's `scale_rewards="none"`.

Statistics: the rollout policy's entropy, once per generation batch, where the conflicts need the whole group (all
processes). The official code takes the entropy from its training forward at temperature 1; in its recipe (one
optimizer step per generation) that is the same policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import ROLLOUT_ENTROPY, CreditBatch, CreditResult
from .names import other_paper
from .registry import get_credit_method, paper, register_credit_method
from .settings import FINITE_NON_NEGATIVE, FINITE_POSITIVE, check_fields, hyperparameter

GTPO_PAPER = paper(
    "GTPO: Trajectory-Based Policy Optimization in Large Language Models",
    "2508.03772",
    "simoni2025gtpo",
    "Simoni, Marco and Fontana, Aleksandar and Rossolini, Giulio and Saracino, Andrea",
    year=2025,
)

# Token ids travel through the float32 gather: exact below 2**24.
_MAX_EXACT_ID = 2**24


@dataclass
class GTPOArguments:
    """GTPO's hyperparameters (the official code's defaults)."""

    gtpo_conflict_weight: float = hyperparameter(
        2.0, "GTPO weight W of the conflict tokens of positive-advantage completions (official W_RAW). > 0."
    )
    gtpo_entropy_threshold: float = hyperparameter(
        0.7,
        "GTPO entropy threshold tau (nats): a completion whose mean entropy exceeds it gets no update "
        "(official ENT_THRESHOLD). >= 0; inf filters nothing.",
    )
    gtpo_entropy_scale: float = hyperparameter(
        0.1,
        "GTPO entropy shaping gamma: the advantage becomes A - gamma * mean entropy (official ENT_SCALE). "
        "Finite and >= 0.",
    )
    gtpo_conflict_normalization: bool = hyperparameter(
        True, "GTPO: divide each completion's advantages by its number of conflict tokens (at least 1)."
    )
    gtpo_pad_id: int | None = hyperparameter(
        None,
        "GTPO: token id that never counts as a conflict (official PAD_ID); the conflicts are keyed on the "
        "completion ids as TRL padded them whatever it is. Default: the tokenizer's pad token id.",
    )

    def __post_init__(self):
        check_fields(
            self,
            gtpo_conflict_weight=FINITE_POSITIVE,
            gtpo_entropy_threshold=(lambda value: value >= 0.0, ">= 0 (inf filters no completion)"),
            gtpo_entropy_scale=FINITE_NON_NEGATIVE,
            gtpo_pad_id=(lambda value: value is None or value >= 0, "None (the tokenizer's pad id) or an id >= 0"),
        )


def _keyed_rows(ids_BT: torch.Tensor, valid_BT: torch.Tensor) -> torch.Tensor:
    """Each row's ids, its valid tokens first in order, then the rest of the row in order: the ids the official code
    keys past a completion's end (TRL's padding, the tokenizer's pad id, or a masked completion's own tokens)."""
    order_BT = torch.argsort((~valid_BT).to(torch.int8), dim=1, stable=True)
    return ids_BT.gather(1, order_BT)


def _conflict_table(rows_N, widths_R, lengths_R, groups_R, signs_R, fill_id, reverse: bool):
    """Sorted keys `(group, rank, id)` of every active row up to the longest completion, and whether each key occurs
    in both a positive and a negative completion; plus the strides of the key.

    Rank `k` of a row reads its `k`-th valid token, past its end the rest of its ids (from the end: its valid tokens
    backwards, then the rest of its ids backwards, as the official rotation reads them), and `fill_id` past the row's
    width (rows gathered from a process that padded to a shorter width)."""
    num_rows = lengths_R.numel()
    width = max(int(lengths_R.max().item()) if num_rows else 0, 1)
    rank_RW = torch.arange(width, device=rows_N.device).expand(num_rows, -1)
    lengths_R1, widths_R1 = lengths_R.view(-1, 1), widths_R.view(-1, 1)
    if reverse:
        source_RW = torch.where(rank_RW < lengths_R1, lengths_R1 - 1 - rank_RW, widths_R1 + lengths_R1 - 1 - rank_RW)
    else:
        source_RW = rank_RW
    inside_RW = rank_RW < widths_R1
    offsets_R1 = (widths_R.cumsum(0) - widths_R).view(-1, 1)
    flat_RW = (offsets_R1 + source_RW).clamp(0, max(rows_N.numel() - 1, 0))
    compact_RW = torch.full((num_rows, width), fill_id, dtype=torch.long, device=rows_N.device)
    if rows_N.numel():
        compact_RW = torch.where(inside_RW, rows_N[flat_RW], fill_id)
    vocab = max(int(compact_RW.max().item()) if compact_RW.numel() else 0, fill_id) + 1
    keys_RW = (groups_R.view(-1, 1) * width + rank_RW) * vocab + compact_RW
    active_R = signs_R != 0
    keys_N, slot_N = torch.unique(keys_RW[active_R].flatten(), return_inverse=True)
    sign_N = signs_R[active_R].view(-1, 1).expand(-1, width).reshape(-1)
    positive = torch.zeros(keys_N.numel(), device=rows_N.device).index_add_(0, slot_N, (sign_N > 0).float())
    negative = torch.zeros(keys_N.numel(), device=rows_N.device).index_add_(0, slot_N, (sign_N < 0).float())
    return keys_N, (positive > 0) & (negative > 0), width, vocab


def _checked_ids(ids_BT: torch.Tensor) -> torch.Tensor:
    """The ids, once they are known to round-trip exactly through the float gather."""
    if ids_BT.numel() and not 0 <= int(ids_BT.min()) <= int(ids_BT.max()) < _MAX_EXACT_ID:
        raise ValueError(
            f"GTPO: token ids must be in [0, {_MAX_EXACT_ID}), got {int(ids_BT.min())} to {int(ids_BT.max())}"
        )
    return ids_BT


def gtpo_conflict_runs(
    ids_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    group_index_B: torch.Tensor,
    signs_B: torch.Tensor,
    excluded_id: int,
    fill_id: int | None = None,
    gather=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GTPO's conflict runs from the start and from the end of this process's rows, `(B, T)` bool each, and each
    row's conflict count `(B,)`, as the official code takes them.

    The conflicts are keyed on the ids as given, padding included: past a completion's end the official code reads
    what TRL put there (the tokenizer's pad id), so a completion's last token can conflict with another's padding.
    `excluded_id` (official `PAD_ID`) only keeps a token out of the runs. `fill_id` (the tokenizer's pad id;
    `excluded_id` when None) stands past the width of rows that another process padded to a shorter width.

    The official code keeps the run from the end in reversed coordinates, where it applies the exclusion and counts
    the conflicts: the token at rank `k` from the end leaves that run when the token at rank `k` from the start is
    `excluded_id`, and the count is the number of ranks `k` at which either run holds (the longer run, not the number
    of distinct tokens in the two).

    `gather` concatenates every process's values (a collective): a group's conflicts are taken over all its rows,
    wherever they are. Without it, the rows passed in are the whole batch.
    """
    gather = gather or (lambda values_N: values_N)
    fill_id = excluded_id if fill_id is None else fill_id
    valid_BT = valid_BT.bool()
    ids_BT = _checked_ids(ids_BT.long())
    lengths_B = valid_BT.sum(dim=1)
    keyed_BT = _keyed_rows(ids_BT, valid_BT)
    all_rows_N = gather(keyed_BT.flatten().float()).round().long()
    all_widths_R = gather(torch.full_like(lengths_B, ids_BT.size(1)).float()).round().long()
    all_lengths_R = gather(lengths_B.float()).round().long()
    all_groups_R = gather(group_index_B.float()).round().long()
    all_signs_R = gather(signs_B.float()).round().long()
    rank_BT = valid_BT.long().cumsum(dim=1) - 1
    active_BT = valid_BT & (signs_B != 0).view(-1, 1)
    runs = []
    for reverse in (False, True):
        keys_N, conflicted_N, width, vocab = _conflict_table(
            all_rows_N, all_widths_R, all_lengths_R, all_groups_R, all_signs_R, fill_id, reverse
        )
        rank = (lengths_B.view(-1, 1) - 1 - rank_BT) if reverse else rank_BT
        local_keys_BT = (group_index_B.long().view(-1, 1) * width + rank.clamp(min=0)) * vocab + ids_BT
        slot_BT = torch.searchsorted(keys_N, local_keys_BT).clamp(max=max(keys_N.numel() - 1, 0))
        found_BT = (keys_N[slot_BT] == local_keys_BT) if keys_N.numel() else torch.zeros_like(active_BT)
        raw_BT = active_BT & found_BT & conflicted_N[slot_BT] if keys_N.numel() else found_BT
        step_BT = torch.where(valid_BT, raw_BT, True).long()  # the run skips the positions that are not tokens
        run_BT = step_BT.flip(1).cumprod(1).flip(1) if reverse else step_BT.cumprod(1)
        # The exclusion reads the token at the same rank from the start, in either direction (see above).
        kept_BT = keyed_BT.gather(1, rank.clamp(min=0)) != excluded_id
        runs.append(run_BT.bool() & active_BT & kept_BT)
    forward_BT, reverse_BT = runs
    rows_N = valid_BT.nonzero(as_tuple=True)[0]
    by_rank_BT = torch.zeros_like(valid_BT)
    by_rank_BT[rows_N, rank_BT[valid_BT]] = forward_BT[valid_BT]
    by_rank_BT[rows_N, (lengths_B.view(-1, 1) - 1 - rank_BT)[valid_BT]] |= reverse_BT[valid_BT]
    return forward_BT, reverse_BT, by_rank_BT.sum(dim=1)


def _pad_id(batch: CreditBatch, gtpo_pad_id: int | None) -> int:
    pad_id = gtpo_pad_id if gtpo_pad_id is not None else batch.pad_token_id
    if pad_id is None:
        raise ValueError("credit method 'gtpo' needs a pad token id: give the tokenizer one, or set gtpo_pad_id")
    return int(pad_id)


@register_credit_method(
    "gtpo",
    display_name="GTPO",
    statistics=(ROLLOUT_ENTROPY,),
    arguments=GTPOArguments,
    paper=GTPO_PAPER,
    # "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy", whose GTPO third-party code
    # implements under that name.
    not_to_be_confused_with=(other_paper("GTPO", "Group Token Policy Optimization", "2508.04349", by="ByteDance"),),
)
def gtpo(
    batch: CreditBatch,
    gtpo_conflict_weight: float,
    gtpo_entropy_threshold: float,
    gtpo_entropy_scale: float,
    gtpo_conflict_normalization: bool,
    gtpo_pad_id: int | None,
) -> CreditResult:
    """Skips the negative and amplifies the positive update of tokens shared at the start or end of a group's
    positive and negative completions; drops completions above an entropy threshold, shapes A - gamma * H.

    Metrics:
        conflict_fraction: fraction of valid tokens in a conflict run (from the start or from the end)
        skipped_fraction: fraction of valid tokens whose negative update is skipped (conflicts of A < 0 completions)
        amplified_fraction: fraction of valid tokens whose positive update is amplified (conflicts of A > 0)
        filtered_fraction: fraction of valid tokens in completions above the entropy threshold (no update)
        mean_entropy: mean over valid tokens of their completion's mean entropy H_i

    Token statistic:
        conflict_weight: d: the conflict factor, W or W^2 on a positive, 0 on a negative conflict
    """
    if batch.completion_ids_BT is None or batch.group_index_B is None:
        raise ValueError("credit method 'gtpo' reads the completion ids and the prompt groups; the batch has none")
    mask_BT = batch.mask_BT
    signs_B = torch.sign(batch.sequence_advantages_B)
    forward_BT, reverse_BT, counts_B = gtpo_conflict_runs(
        batch.completion_ids_BT,
        mask_BT,
        batch.group_index_B,
        signs_B,
        excluded_id=_pad_id(batch, gtpo_pad_id),
        fill_id=batch.pad_token_id,
        gather=batch.gather,
    )
    positive_B = (signs_B > 0).view(-1, 1)
    run_weight_BT = torch.where(positive_B, gtpo_conflict_weight, 0.0).expand_as(mask_BT)
    delta_BT = torch.where(forward_BT, run_weight_BT, 1.0) * torch.where(reverse_BT, run_weight_BT, 1.0)
    conflict_BT = forward_BT | reverse_BT
    counts_B = counts_B.clamp(min=1).float()
    if not gtpo_conflict_normalization:
        counts_B = torch.ones_like(counts_B)
    entropy_B = (batch[ROLLOUT_ENTROPY] * mask_BT).sum(dim=1) / mask_BT.sum(dim=1).clamp(min=1)
    kept_B = entropy_B <= gtpo_entropy_threshold
    shaped_BT = (batch.advantages_BT - gtpo_entropy_scale * entropy_B.view(-1, 1)) * delta_BT
    advantages_BT = torch.where(kept_B.view(-1, 1) & mask_BT, shaped_BT / counts_B.view(-1, 1), 0.0)
    return CreditResult(
        advantages_BT=advantages_BT,
        metrics={
            "conflict_fraction": conflict_BT.float(),
            "skipped_fraction": (conflict_BT & ~positive_B).float(),
            "amplified_fraction": (conflict_BT & positive_B).float(),
            "filtered_fraction": (~kept_B).view(-1, 1).float().expand_as(mask_BT),
            "mean_entropy": entropy_B.view(-1, 1).expand_as(mask_BT),
        },
        statistic_BT=torch.where(mask_BT, delta_BT, 0.0),
    )


# GTPO on plain tensors (every row of every group): `gtpo_advantages(advantages_B, mask_BT, rollout_entropy=...,
# completion_ids_BT=..., group_index_B=..., pad_token_id=...)`.
gtpo_advantages = get_credit_method("gtpo").on_tensors

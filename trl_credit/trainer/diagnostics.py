"""What the trainer logs about credit: per-method metrics (global over processes) and the token-credit view."""

from __future__ import annotations

import math
from collections import Counter

import torch

from ..methods import CreditResult

# Logged once per batch whatever the stack, besides each method's `name/...` metrics.
TRAINER_METRICS = {
    "credit/adv_abs_mean": "mean |Â| over the valid tokens of every process, after the whole stack",
    "credit/extra_forwards": "policy forwards over a batch or micro-batch the methods added in an optimizer step "
    "(0 where TRL's forward or `generate` was reused)",
    "credit/extra_reference_forwards": "forwards of the reference model a deviation statistic reads (`reference_deviation`) over a batch in an "
    "optimizer step",
    "credit/token_credit_log_forwards": "policy forwards over the few rows of the token-credit log in an optimizer step "
    "(`log_token_credit=True`)",
}


# A token's weight is defined where its incoming |A| exceeds this share of the largest |A| or |Â| of the batch: the
# factor of a near-zero advantage means nothing (GTPO's additive -gamma * H over a tied group's rounding noise gives
# thousands), and this bounds every factor below 1 / WEIGHT_FLOOR.
WEIGHT_FLOOR = 1e-3


@torch.no_grad()
def credit_metrics(accelerator, name: str, incoming_BT, result: CreditResult, mask_BT) -> dict[str, float]:
    """`name/...` metrics of one method of the stack, reduced over every process (a collective on each one).

    Besides the method's own metrics, every method gets `registry.COMMON_DIAGNOSTICS`. The weight of a token is the factor
    its advantage was multiplied by (`out / in`), where `|in|` exceeds `WEIGHT_FLOOR` times the largest `|in|` or
    `|out|` over the valid tokens of every process; `mean_shift` is the mean of `out - in`, defined on every token.
    """
    magnitudes_N = torch.maximum(incoming_BT.abs(), result.advantages_BT.abs())[mask_BT].float()
    local_scale = magnitudes_N.max() if magnitudes_N.numel() else magnitudes_N.new_zeros(())
    scale = accelerator.gather(local_scale.reshape(1).to(accelerator.device)).max().item()
    reshaped_BT = mask_BT & (incoming_BT.abs() > WEIGHT_FLOOR * scale)
    weights_N = (result.advantages_BT / torch.where(reshaped_BT, incoming_BT, 1.0))[reshaped_BT]
    valid_count = mask_BT.sum()
    sums = {
        "mean_weight": (weights_N.sum(), reshaped_BT.sum()),
        "weight_sq": ((weights_N**2).sum(), reshaped_BT.sum()),
        "mean_shift": ((result.advantages_BT - incoming_BT)[mask_BT].sum(), valid_count),
    }
    if result.loss_mask_BT is not None:
        sums["kept_fraction"] = ((result.loss_mask_BT * mask_BT).sum(), valid_count)
    scalars = {}
    for metric, value in result.metrics.items():
        if isinstance(value, tuple):  # (numerator, denominator) masks
            sums[metric] = (value[0].sum(), value[1].sum())
        elif isinstance(value, torch.Tensor):  # per-token values, averaged over valid tokens
            sums[metric] = (value.float()[mask_BT].sum(), valid_count)
        else:  # already global
            scalars[metric] = float(value)
    totals = torch.stack([torch.stack([s.float(), c.float()]) for s, c in sums.values()])
    totals = accelerator.reduce(totals.to(accelerator.device), reduction="sum").tolist()
    means = {metric: s / c if c > 0 else float("nan") for metric, (s, c) in zip(sums, totals)}
    mean_sq = means.pop("weight_sq")
    means["weight_std"] = math.sqrt(max(mean_sq - means["mean_weight"] ** 2, 0.0))
    local_max = weights_N.max() if weights_N.numel() else torch.tensor(float("nan"))
    gathered = accelerator.gather(local_max.reshape(1).float().to(accelerator.device))
    gathered = gathered[~torch.isnan(gathered)]
    means["weight_max"] = gathered.max().item() if gathered.numel() else float("nan")
    means.update(scalars)
    return {f"{name}/{metric}": value for metric, value in means.items()}


@torch.no_grad()
def advantage_magnitude(accelerator, advantages_BT, mask_BT) -> float:
    """Mean `|Â|` over the valid tokens of every process (`credit/adv_abs_mean`)."""
    total = torch.stack([advantages_BT[mask_BT].abs().sum(), mask_BT.sum().float()])
    total = accelerator.reduce(total.to(accelerator.device), reduction="sum")
    return (total[0] / total[1]).item() if total[1] > 0 else float("nan")


def unscored_counters(reward_funcs) -> list:
    """The counters of the answers the reward functions could not score (timeouts, unparseable LaTeX): a reward
    function counts them in an `unscored` attribute with `snapshot_and_reset() -> {name: count}`
    (`rewards.RewardStats`)."""
    return [
        f.unscored for f in reward_funcs if callable(getattr(getattr(f, "unscored", None), "snapshot_and_reset", None))
    ]


def unscored_answers(counters, accelerator) -> dict[str, float]:
    """The unscored answers the `counters` counted since the last call, by metric name, summed over processes (every
    process holds the same reward functions, so all or none run the reduction)."""
    counts = Counter()
    for counter in counters:
        counts.update(counter.snapshot_and_reset())
    totals = accelerator.reduce(torch.tensor(list(counts.values()), device=accelerator.device), "sum")
    return {name: float(total) for name, total in zip(counts, totals.tolist())}


def gather_all(accelerator, values_N: torch.Tensor) -> torch.Tensor:
    """The values of every process, concatenated in process order (a collective): `CreditBatch.gather`."""
    # One padding element keeps every process's tensor non-empty, whatever its mask.
    padded_N = torch.cat([values_N.float().flatten(), values_N.new_zeros(1, dtype=torch.float32)])
    sizes = accelerator.gather(torch.tensor([values_N.numel()], device=values_N.device))
    gathered = accelerator.gather(accelerator.pad_across_processes(padded_N, dim=0))
    rows = gathered.view(len(sizes), -1)
    return torch.cat([row[:size] for row, size in zip(rows, sizes.tolist())])

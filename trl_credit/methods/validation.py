"""The checks around every call of a credit method: the batch it is handed and the result it returns.

[`CreditMethod`] runs them on each call, in the trainer and on plain tensors alike, so that a method's own function
holds only its paper's math. Every error names the method and what is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .batch import STATISTIC_RANGES, CreditBatch, CreditResult

if TYPE_CHECKING:
    from .registry import CreditMethod

# A streamed computation may round a bounded statistic this far outside its range.
_RANGE_TOLERANCE = 1e-4


def checked_batch(method: CreditMethod, batch: CreditBatch, hyperparameters: Mapping[str, Any]) -> CreditBatch:
    """`batch` with each statistic the method reads checked (shape, finite at valid positions, range) and zeroed
    at masked positions, where whatever padding holds (even NaN) is ignored."""
    name, mask_BT = method.name, batch.mask_BT
    if mask_BT.dim() != 2 or mask_BT.dtype != torch.bool:
        raise ValueError(f"credit method {name!r}: mask_BT must be a (B, T) bool tensor, got {_describe(mask_BT)}")
    rows_B = torch.ones(mask_BT.shape[:1], dtype=torch.bool, device=mask_BT.device)  # every row, finite or not
    _check(name, "sequence_advantages_B", batch.sequence_advantages_B, rows_B)
    if method.estimates_advantages:
        for what, values_B in (("group_index_B", batch.group_index_B), ("rewards_B", batch.rewards_B)):
            if values_B is None:
                raise ValueError(
                    f"credit method {name!r} estimates advantages from the groups and raw rewards: the batch must "
                    f"carry {what} of shape ({mask_BT.size(0)},), got None"
                )
            _check(name, what, values_B, rows_B)
    advantages_BT = _check(name, "advantages_BT", batch.advantages_BT, mask_BT)
    weights_BT = _check(name, "loss_weights_BT", batch.loss_weights_BT, mask_BT, bounds=(0.0, 1.0))
    statistics = dict(batch.statistics)
    for statistic in method.statistics_for(hyperparameters):
        if statistic not in statistics:
            raise ValueError(f"credit method {name!r} reads statistic {statistic!r}, which the batch does not have")
        bounds = STATISTIC_RANGES.get(statistic)
        statistics[statistic] = _check(
            name, f"statistic {statistic!r}", statistics[statistic].detach(), mask_BT, bounds, True
        )
    return dataclasses.replace(batch, advantages_BT=advantages_BT, statistics=statistics, loss_weights_BT=weights_BT)


def check_result(method: CreditMethod, batch: CreditBatch, result: CreditResult) -> None:
    """Raise unless `result` has the batch's shape, finite advantages at valid positions, a loss mask in [0, 1] only
    where the method declared `drops_tokens`, and only the metrics its docstring lists."""
    name, mask_BT = method.name, batch.mask_BT
    _check(name, "the returned advantages_BT", result.advantages_BT, mask_BT)
    if result.loss_mask_BT is not None:
        if not method.drops_tokens:
            raise ValueError(f"credit method {name!r} returned a loss mask but is registered with drops_tokens=False")
        _check(name, "the returned loss mask", result.loss_mask_BT, mask_BT, bounds=(0.0, 1.0))
    undeclared = sorted(set(result.metrics) - set(method.diagnostics))
    if undeclared:
        raise ValueError(
            f"credit method {name!r} logged metrics {undeclared} that its registration does not declare; list them "
            "under 'Metrics:' in the function's docstring"
        )


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} of shape {tuple(tensor.shape)}"


def _check(
    method: str,
    what: str,
    tensor: torch.Tensor,
    like: torch.Tensor,
    bounds: tuple[float, float] | None = None,
    tolerant: bool = False,
) -> torch.Tensor:
    """`tensor` as float, zero wherever `like` (a mask) is false, after checking it has the shape of `like` and is
    finite (and within `bounds`, `tolerant` of a streamed computation's rounding) wherever `like` is true; whatever
    masked positions hold is ignored."""
    per_token = like.dim() == 2
    if tensor.shape != like.shape:
        raise ValueError(
            f"credit method {method!r}: {what} must have {'the shape of the mask' if per_token else 'shape'} "
            f"{tuple(like.shape)}, got {tuple(tensor.shape)}"
        )
    values = torch.where(like, tensor.float(), 0.0)
    # One reduction on the common path: a NaN or inf makes the sum non-finite (an overflow too, which the exact test
    # clears); the count only for the message.
    if not torch.isfinite(values.sum()) and not torch.isfinite(values).all():
        raise ValueError(
            f"credit method {method!r}: {what} has NaN or inf{' at valid positions' if per_token else ''} "
            f"({int((~torch.isfinite(values)).sum())} of {int(like.sum())} values)"
        )
    if bounds is not None:
        low, high = bounds
        slack = _RANGE_TOLERANCE if tolerant else 0.0
        if low <= 0.0 <= high and values.numel():  # the zeros at masked positions pass: one pass for min and max
            smallest, largest = torch.aminmax(values)
            outside = bool(smallest < low - slack) or bool(largest > high + slack)
        else:
            outside = bool((like & ((values < low - slack) | (values > high + slack))).any())
        if outside:
            valid = values[like]
            raise ValueError(
                f"credit method {method!r}: {what} must lie in [{low:g}, {high:g}] at valid positions, got values in "
                f"[{valid.min().item():g}, {valid.max().item():g}]"
            )
    return values

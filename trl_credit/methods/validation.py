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
    mask_BT = batch.mask_BT
    if mask_BT.dim() != 2 or mask_BT.dtype != torch.bool:
        raise ValueError(
            f"credit method {method.name!r}: mask_BT must be a (B, T) bool tensor, got {_describe(mask_BT)}"
        )
    if batch.sequence_advantages_B.shape != mask_BT.shape[:1]:
        raise ValueError(
            f"credit method {method.name!r}: sequence_advantages_B must have shape ({mask_BT.size(0)},), got "
            f"{tuple(batch.sequence_advantages_B.shape)}"
        )
    _check_finite(method.name, "sequence_advantages_B", batch.sequence_advantages_B, None)
    if method.estimates_advantages:
        for what, values_B in (("group_index_B", batch.group_index_B), ("rewards_B", batch.rewards_B)):
            if values_B is None or values_B.shape != mask_BT.shape[:1]:
                got = "None" if values_B is None else tuple(values_B.shape)
                raise ValueError(
                    f"credit method {method.name!r} estimates advantages from the groups and raw rewards: the batch "
                    f"must carry {what} of shape ({mask_BT.size(0)},), got {got}"
                )
        _check_finite(method.name, "rewards_B", batch.rewards_B, None)
    _check_finite(
        method.name, "advantages_BT", _same_shape(method.name, "advantages_BT", batch.advantages_BT, mask_BT), mask_BT
    )
    weights_BT = _same_shape(method.name, "loss_weights_BT", batch.loss_weights_BT, mask_BT).float()
    if (mask_BT & ~((weights_BT >= 0) & (weights_BT <= 1))).any():  # NaN fails both comparisons
        raise ValueError(f"credit method {method.name!r}: loss_weights_BT must lie in [0, 1] at valid positions")
    statistics = dict(batch.statistics)
    for name in method.statistics_for(hyperparameters):
        if name not in statistics:
            raise ValueError(f"credit method {method.name!r} reads statistic {name!r}, which the batch does not have")
        values_BT = _same_shape(method.name, f"statistic {name!r}", statistics[name], mask_BT).detach().float()
        _check_finite(method.name, f"statistic {name!r}", values_BT, mask_BT)
        statistics[name] = torch.where(mask_BT, values_BT, 0.0)
        if name in STATISTIC_RANGES:
            low, high = STATISTIC_RANGES[name]
            outside_BT = mask_BT & ((values_BT < low - _RANGE_TOLERANCE) | (values_BT > high + _RANGE_TOLERANCE))
            if outside_BT.any():
                valid_N = values_BT[mask_BT]
                raise ValueError(
                    f"credit method {method.name!r}: statistic {name!r} must lie in [{low:g}, {high:g}] at valid "
                    f"positions, got values in [{valid_N.min().item():g}, {valid_N.max().item():g}]"
                )
    return dataclasses.replace(
        batch,
        advantages_BT=torch.where(mask_BT, batch.advantages_BT.float(), 0.0),
        statistics=statistics,
        loss_weights_BT=torch.where(mask_BT, weights_BT, 0.0),
    )


def check_result(method: CreditMethod, batch: CreditBatch, result: CreditResult) -> None:
    """Raise unless `result` has the batch's shape, finite advantages at valid positions, a loss mask in [0, 1] only
    where the method declared `drops_tokens`, and only the metrics its registration declares."""
    mask_BT = batch.mask_BT
    if result.advantages_BT.shape != mask_BT.shape:
        raise ValueError(
            f"credit method {method.name!r} returned advantages of shape {tuple(result.advantages_BT.shape)}, "
            f"expected {tuple(mask_BT.shape)}"
        )
    _check_finite(method.name, "the returned advantages_BT", result.advantages_BT, mask_BT)
    if result.loss_mask_BT is not None:
        if not method.drops_tokens:
            raise ValueError(
                f"credit method {method.name!r} returned a loss mask but is registered with drops_tokens=False"
            )
        loss_mask_BT = _same_shape(method.name, "returned loss mask", result.loss_mask_BT, mask_BT).float()
        if (mask_BT & ~((loss_mask_BT >= 0) & (loss_mask_BT <= 1))).any():  # NaN fails both comparisons
            raise ValueError(f"credit method {method.name!r} returned a loss mask outside [0, 1] at valid positions")
    undeclared = sorted(set(result.metrics) - set(method.diagnostics))
    if undeclared:
        raise ValueError(
            f"credit method {method.name!r} logged metrics {undeclared} that its registration does not declare; "
            "add them to `diagnostics={name: meaning}` of register_credit_method"
        )


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} of shape {tuple(tensor.shape)}"


def _same_shape(method: str, what: str, tensor: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    if tensor.shape != mask_BT.shape:
        raise ValueError(
            f"credit method {method!r}: {what} must have the shape of the mask {tuple(mask_BT.shape)}, got {tuple(tensor.shape)}"
        )
    return tensor


def _check_finite(method: str, what: str, tensor: torch.Tensor, mask_BT: torch.Tensor | None) -> None:
    bad = ~torch.isfinite(tensor)
    if mask_BT is not None:
        bad &= mask_BT  # whatever masked positions hold is ignored
    if bad.any():  # one reduction on the common path; the count only for the message
        where = "" if mask_BT is None else " at valid positions"
        total = tensor.numel() if mask_BT is None else int(mask_BT.sum())
        raise ValueError(
            f"credit method {method!r}: {what} has NaN or inf{where} ({int(bad.sum())} of {total} values)"
        )

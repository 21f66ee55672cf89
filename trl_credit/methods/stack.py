"""Running a stack of credit methods: [`run_stack`] checks the batch each method is handed, calls it, checks its
result and hands the next method what it produced. The trainer's two stages and `on_tensors` all run stacks through
it, so a method's own function holds only its paper's math. Every error names the method and what is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batch import STATISTIC_RANGES, CreditBatch, CreditResult

# A streamed computation may round a bounded statistic this far outside its range.
_RANGE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class StackStep:
    """One method of a stack as it runs: its registration, its resolved hyperparameters (by field name) and the
    statistics they make it read. [`CreditMethod.step`] builds it."""

    method: Any  # its `registry.CreditMethod`, not imported: the registry imports this module
    hyperparameters: Mapping[str, Any]
    statistics: tuple[str, ...]


@dataclass(frozen=True)
class StackCredit:
    """What a stack gave a batch.

    Args:
        batch: the batch after the last method: its advantages, GRPO's sequence advantages, the tokens still in the
            loss and their weights, as a next stack would take them.
        loss_mask_BT: the product of the loss masks the methods returned (None when none did).
        statistic_BT: the per-token statistic the last method that returned one returned, for the token-credit view.
        results: `(method name, the checked batch it was handed, its result)` of each method, in order.
    """

    batch: CreditBatch
    loss_mask_BT: torch.Tensor | None
    statistic_BT: torch.Tensor | None
    results: tuple[tuple[str, CreditBatch, CreditResult], ...]


def run_stack(steps: Sequence[StackStep], batch: CreditBatch) -> StackCredit:
    """Run the methods of `steps` in order on `batch`: the stage's inputs checked once (`checked_batch`: the
    advantages, loss weights and every statistic a method reads), then each method called and its result checked (its
    shape, finite advantages at valid positions, a loss mask in [0, 1] only from a method that declared
    `drops_tokens`, only the metrics it declared), each seeing what the methods before it produced
    ([`CreditBatch.followed_by`]); the loss masks they return are multiplied."""
    loss_mask_BT, statistic_BT, results = None, None, []
    with torch.no_grad():  # advantages are weights of the loss, not part of its graph
        batch = checked_batch(steps, batch)
        for step in steps:
            method = step.method
            result = method.function(batch, **step.hyperparameters)
            result = result if isinstance(result, CreditResult) else CreditResult(advantages_BT=result)
            # Zero wherever the mask is false: the next method takes these advantages as they are.
            advantages_BT = _check(method.name, "the returned advantages_BT", result.advantages_BT, batch.mask_BT)
            result = dataclasses.replace(result, advantages_BT=advantages_BT)
            if result.loss_mask_BT is not None:
                if not method.drops_tokens:
                    raise ValueError(
                        f"credit method {method.name!r} returned a loss mask but is registered with drops_tokens=False"
                    )
                _check(method.name, "the returned loss mask", result.loss_mask_BT, batch.mask_BT, bounds=(0.0, 1.0))
                loss_mask_BT = result.loss_mask_BT * (1.0 if loss_mask_BT is None else loss_mask_BT)
            undeclared = sorted(set(result.metrics) - set(method.diagnostics))
            if undeclared:
                raise ValueError(
                    f"credit method {method.name!r} logged metrics {undeclared} that its registration does not declare; "
                    "list them under 'Metrics:' in the function's docstring"
                )
            statistic_BT = result.statistic_BT if result.statistic_BT is not None else statistic_BT
            results.append((method.name, batch, result))
            batch = batch.followed_by(result)
    return StackCredit(batch, loss_mask_BT, statistic_BT, tuple(results))


def checked_batch(steps: Sequence[StackStep], batch: CreditBatch) -> CreditBatch:
    """`batch` with its advantages, loss weights and each statistic the methods of `steps` read checked (shape,
    finite at valid positions, range) and zeroed at masked positions, where whatever padding holds (even NaN) is
    ignored; an advantage estimator's groups and raw rewards present and finite. Each check runs once for the stage;
    an error names the first method that reads what failed it."""
    first, mask_BT = steps[0].method.name if steps else "grpo", batch.mask_BT  # no steps: GRPO's own advantages
    if mask_BT.dim() != 2 or mask_BT.dtype != torch.bool:
        got = f"{mask_BT.dtype} of shape {tuple(mask_BT.shape)}"
        raise ValueError(f"credit method {first!r}: mask_BT must be a (B, T) bool tensor, got {got}")
    rows_B = torch.ones(mask_BT.shape[:1], dtype=torch.bool, device=mask_BT.device)  # every row, finite or not
    _check(first, "sequence_advantages_B", batch.sequence_advantages_B, rows_B)
    advantages_BT = _check(first, "advantages_BT", batch.advantages_BT, mask_BT)
    if batch.loss_weights_BT is None:  # the valid tokens at full weight: nothing to check
        weights_BT = mask_BT.float()
    else:
        weights_BT = _check(first, "loss_weights_BT", batch.loss_weights_BT, mask_BT, bounds=(0.0, 1.0))
    statistics, checked = dict(batch.statistics), set()
    for step in steps:
        name = step.method.name
        for what in ("group_index_B", "rewards_B") if step.method.estimates_advantages else ():
            if getattr(batch, what) is None:
                raise ValueError(
                    f"credit method {name!r} estimates advantages from the groups and raw rewards: the batch must "
                    f"carry {what} of shape ({mask_BT.size(0)},), got None"
                )
            _check(name, what, getattr(batch, what), rows_B)
        for statistic in [s for s in step.statistics if s not in checked]:
            if statistic not in statistics:
                raise ValueError(
                    f"credit method {name!r} reads statistic {statistic!r}, which the batch does not have"
                )
            bounds, values = STATISTIC_RANGES.get(statistic), statistics[statistic].detach()
            statistics[statistic] = _check(name, f"statistic {statistic!r}", values, mask_BT, bounds, True)
            checked.add(statistic)
    return dataclasses.replace(batch, advantages_BT=advantages_BT, statistics=statistics, loss_weights_BT=weights_BT)


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
        shape = "the shape of the mask" if per_token else "shape"
        raise ValueError(
            f"credit method {method!r}: {what} must have {shape} {tuple(like.shape)}, got {tuple(tensor.shape)}"
        )
    values = torch.where(like, tensor.float(), 0.0)
    # One reduction on the common path: a NaN or inf makes the sum non-finite (an overflow too, which the exact test
    # clears); the count only for the message.
    if not torch.isfinite(values.sum()) and not torch.isfinite(values).all():
        raise ValueError(
            f"credit method {method!r}: {what} has NaN or inf{' at valid positions' if per_token else ''} "
            f"({int((~torch.isfinite(values)).sum())} of {int(like.sum())} values)"
        )
    if bounds is not None and values.numel():
        # Every range holds 0 (the statistics' ranges, loss weights and masks in [0, 1]), so the zeros at masked
        # positions pass: one pass for min and max.
        (low, high), slack = bounds, _RANGE_TOLERANCE if tolerant else 0.0
        smallest, largest = torch.aminmax(values)
        if smallest < low - slack or largest > high + slack:
            valid = values[like]
            raise ValueError(
                f"credit method {method!r}: {what} must lie in [{low:g}, {high:g}] at valid positions, got values in "
                f"[{valid.min().item():g}, {valid.max().item():g}]"
            )
    return values

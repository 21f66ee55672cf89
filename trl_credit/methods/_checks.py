"""Input validation shared by the pure credit functions.

Every check runs before any arithmetic and names the offending argument, so a bad call fails with a
message a user can act on instead of a NaN three steps later.
"""

from __future__ import annotations

import torch


def check_inputs(advantages_B: torch.Tensor, mask_BT: torch.Tensor, **per_token_BT: torch.Tensor) -> torch.Tensor:
    """Validate shapes and finiteness; return the mask as a bool tensor.

    Non-finite values are only an error at *valid* positions: masked positions never enter a statistic,
    so whatever padding holds (even NaN) is ignored.
    """
    if advantages_B.dim() != 1:
        raise ValueError(f"advantages_B must have shape (B,), got {tuple(advantages_B.shape)}")
    if mask_BT.dim() != 2 or mask_BT.shape[0] != advantages_B.shape[0]:
        raise ValueError(
            f"mask_BT must have shape (B, T) with B = {advantages_B.shape[0]} (from advantages_B), "
            f"got {tuple(mask_BT.shape)}"
        )
    if not torch.isfinite(advantages_B).all():
        raise ValueError("advantages_B contains NaN or inf; sequence advantages must be finite")
    valid_BT = mask_BT.bool()
    for name, tensor_BT in per_token_BT.items():
        if tensor_BT.shape != mask_BT.shape:
            raise ValueError(f"{name} must have the shape of mask_BT {tuple(mask_BT.shape)}, got {tuple(tensor_BT.shape)}")
        if not torch.isfinite(tensor_BT[valid_BT]).all():
            raise ValueError(f"{name} contains NaN or inf at valid (unmasked) positions")
    return valid_BT


def prepare_inputs(
    advantages_B: torch.Tensor, mask_BT: torch.Tensor, check_finite: bool = True, **per_token_BT: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Validate like `check_inputs`, then return the float32 mask and the per-token tensors, cast to float32.

    This is the fast path the credit functions use on `(B, T)` batches. Boolean indexing (`x[mask]`) and
    `torch.where` with a boolean condition are slow on CPU (10-100x an elementwise multiply), so:

    * finiteness is checked optimistically with one `sum()` per tensor: a finite sum means every entry is
      finite; only a non-finite sum (or a shape error) runs `check_inputs`' exact masked check, which names
      the offending argument;
    * a tensor with non-finite values at masked positions (allowed: padding is ignored) is then replaced
      by a copy with 0 there, so that callers may mask by multiplying with the returned float mask.

    `check_finite=False` checks shapes only: for a caller that sums its inputs anyway and calls again with
    `check_finite=True` when that sum is not finite. `mask_BT` must be bool or hold 0/1 (TRL's completion and tool masks are 0/1 integers).
    """
    tensors = [t.float() for t in per_token_BT.values()]
    shapes_ok = (
        advantages_B.dim() == 1
        and mask_BT.dim() == 2
        and mask_BT.shape[0] == advantages_B.shape[0]
        and all(t.shape == mask_BT.shape for t in tensors)
    )
    if shapes_ok and not check_finite:
        return _float_mask(mask_BT), tensors
    if shapes_ok and bool(torch.isfinite(torch.stack([advantages_B.float().sum(), *(t.sum() for t in tensors)])).all()):
        return _float_mask(mask_BT), tensors
    valid_BT = check_inputs(advantages_B, mask_BT, **per_token_BT)
    tensors = [t if bool(torch.isfinite(t.sum())) else torch.where(valid_BT, t, 0.0) for t in tensors]
    return _float_mask(mask_BT), tensors


def _float_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    # bool -> float32 is several times slower than uint8 -> float32 on CPU; the bytes are the same.
    return (mask_BT.view(torch.uint8) if mask_BT.dtype == torch.bool else mask_BT).to(torch.float32)


def check_range(name: str, value: float, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    """Raise `ValueError` unless `value` lies in the interval; the message spells out the interval."""
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value}")

"""Input validation shared by the baselines' helper functions, and the registry checks' building blocks.

Every check runs before any arithmetic and names the offending argument, so a bad call fails with a
message a user can act on instead of a NaN three steps later.
"""

from __future__ import annotations

import math

import torch


def check_token_inputs(
    advantages_BT: torch.Tensor, mask_BT: torch.Tensor, **per_token_BT: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Validate shapes and finiteness of `(B, T)` token advantages and per-token tensors; return the bool mask, then
    the advantages and the per-token tensors in float32, 0 where masked.

    Non-finite values are only an error at *valid* positions: masked positions never enter a statistic, so whatever
    padding holds (even NaN) is ignored.
    """
    if advantages_BT.dim() != 2:
        raise ValueError(f"advantages_BT must have shape (B, T), got {tuple(advantages_BT.shape)}")
    if mask_BT.dim() != 2:
        raise ValueError(f"mask_BT must have shape (B, T), got {tuple(mask_BT.shape)}")
    valid_BT = mask_BT.bool()
    cleaned = []
    for name, tensor_BT in {"advantages_BT": advantages_BT, **per_token_BT}.items():
        if tensor_BT.shape != mask_BT.shape:
            raise ValueError(
                f"{name} must have the shape of mask_BT {tuple(mask_BT.shape)}, got {tuple(tensor_BT.shape)}"
            )
        if not torch.isfinite(tensor_BT[valid_BT]).all():
            raise ValueError(f"{name} contains NaN or inf at valid (unmasked) positions")
        cleaned.append(torch.where(valid_BT, tensor_BT.detach().float(), 0.0))
    return valid_BT, cleaned


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def _contains(value: float, low: float, high: float, low_open: bool, high_open: bool) -> bool:
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    return above and below


def check_range(
    name: str, value: float, low: float, high: float, low_open: bool = False, high_open: bool = False
) -> None:
    """Raise `ValueError` unless `value` lies in the interval; the message spells out the interval."""
    if not _contains(value, low, high, low_open, high_open):
        raise ValueError(f"{name} must be in {_interval(low, high, low_open, high_open)}, got {value}")


def in_range(low: float, high: float, low_open: bool = False, high_open: bool = False):
    """A registry check `(predicate, allowed)` for a number in an interval."""

    def ok(value) -> bool:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return _contains(number, low, high, low_open, high_open)

    return ok, f"in {_interval(low, high, low_open, high_open)}"


# Registry checks `(predicate, allowed)` for the common open-ended ranges.
FINITE_NON_NEGATIVE = (lambda value: 0.0 <= value < math.inf, "finite and >= 0")
FINITE_POSITIVE = (lambda value: 0.0 < value < math.inf, "finite and > 0")


def paper(title: str, arxiv_id: str, key: str, authors: str, year: int = 2026) -> dict[str, str]:
    """TRL's `_paper` record: title, arXiv id and a BibTeX entry (the model card cites it)."""
    citation = (
        f"@article{{{key},\n"
        f"    title        = {{{{{title}}}}},\n"
        f"    author       = {{{authors}}},\n"
        f"    year         = {year},\n"
        f"    eprint       = {{arXiv:{arxiv_id}}},\n"
        f"}}"
    )
    return {"title": title, "id": arxiv_id, "citation": citation}

"""The credit-method registry: a method is its name, the statistics it reads, its arguments dataclass, its paper and
its function; `@register_credit_method` records them, [`get_credit_method`] finds them, stacks run in order.

What a method shows (its display name and summary, the meaning of its metrics, its statistic in the token-credit view)
is read from its function's docstring ([`CreditMethod.display_name`] says how). Nothing here imports TRL.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .batch import LOSS_FORWARD_STATISTICS, CreditBatch, CreditResult
from .settings import SettingError, resolve_settings, supported_type
from .user_modules import import_registering_module
from .validation import check_result, checked_batch

# `CreditBatch` fields that `on_tensors` takes by name, besides the statistics (the other tensors it is given).
BATCH_FIELDS = frozenset(f.name for f in dataclasses.fields(CreditBatch)) - {
    "sequence_advantages_B",
    "mask_BT",
    "statistics",
}

# What the trainer logs for every method of a stack, as `name/metric`, besides the method's own metrics.
COMMON_DIAGNOSTICS = {
    "mean_weight": "mean factor Â / A by which the method multiplied the incoming advantages, over the valid tokens "
    "whose |A| exceeds 1e-3 of the largest |A| or |Â| of the batch (a near-zero A has no meaningful factor)",
    "weight_std": "standard deviation of that factor, over the same tokens",
    "weight_max": "largest factor, over the same tokens",
    "mean_shift": "mean change Â - A over the valid tokens (defined where the factor is not: an additive rule on "
    "near-zero advantages)",
    "kept_fraction": "mean loss-mask weight over the tokens the method saw in the loss (methods that drop tokens)",
}

CREDIT_METHODS: dict[str, CreditMethod] = {}


@dataclass(frozen=True, eq=False)
class CreditMethod:
    """A registered credit method. Build it with [`register_credit_method`]."""

    name: str
    function: Callable[..., CreditResult | torch.Tensor]
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]]
    arguments: type | None = None
    paper: Mapping[str, str] | None = None
    drops_tokens: bool = False
    estimates_advantages: bool = False

    @functools.cached_property
    def _described(self) -> tuple[str, str, dict[str, dict[str, str]]]:
        """The function's docstring: a first paragraph `Display name: summary`, then sections (`Metrics:`,
        `Token statistic:`) of indented `name: meaning` lines, a meaning continued on more deeply indented lines."""
        first, _, rest = inspect.cleandoc(self.function.__doc__ or "").partition("\n\n")
        display, colon, summary = " ".join(first.split()).partition(": ")
        sections, entries = {}, None
        for line in rest.splitlines():
            if line.strip() and not line[0].isspace():
                entries = sections.setdefault(line.strip().rstrip(":").lower(), {})
            elif entries is not None and line.strip():
                if line.startswith(" " * 8) and entries:
                    entries[next(reversed(entries))] += " " + line.strip()
                else:
                    key, _, meaning = line.strip().partition(": ")
                    entries[key] = meaning
        if colon and len(display.split()) <= 4:  # a name, not the start of a sentence that holds a colon
            return display, summary, sections
        return self.name, " ".join(first.split()), sections

    @property
    def display_name(self) -> str:
        """Its name in plots, cards and tables: the docstring's text before the first `: ` (at most four words; else
        `name`)."""
        return self._described[0]

    @property
    def summary(self) -> str:
        """One line saying what it does (the rest of the docstring's first paragraph)."""
        return self._described[1]

    @property
    def diagnostics(self) -> dict[str, str]:
        """`{metric: meaning}` of every metric it returns (logged as `name/metric`), its docstring's `Metrics:`."""
        return self._described[2].get("metrics", {})

    @property
    def token_statistic(self) -> tuple[str, str] | None:
        """`(name, meaning)` of the statistic it returns for the token-credit view, its docstring's `Token statistic:`."""
        return next(iter(self._described[2].get("token statistic", {}).items()), None)

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.argument_fields())

    def argument_fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.arguments) if self.arguments else ()

    def hyperparameters(self, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every hyperparameter: `values` (by field name) converted to the declared types, the rest their defaults,
        checked by the arguments dataclass. [`SettingError`] names the first unknown or bad one."""
        for name in values or {}:
            if name not in self.argument_names:
                raise SettingError(name, _not_owned(name, [self]))
        return resolve_settings(self.arguments, dict(values or {}))

    def statistics_for(self, hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(self.statistics(dict(hyperparameters)) if callable(self.statistics) else self.statistics)

    def reads_training_forward(self, hyperparameters: Mapping[str, Any]) -> bool:
        """Whether the method runs in the training forward (it reads the current policy) or at generation."""
        return any(name in LOSS_FORWARD_STATISTICS for name in self.statistics_for(hyperparameters))

    def __call__(self, batch: CreditBatch, hyperparameters: Mapping[str, Any]) -> CreditResult:
        """Run on `batch` with resolved `hyperparameters`, checking the batch and the result (errors name it)."""
        batch = checked_batch(self, batch, hyperparameters)
        result = self.function(batch, **hyperparameters)
        result = result if isinstance(result, CreditResult) else CreditResult(advantages_BT=result)
        check_result(self, batch, result)
        return result

    def on_tensors(self, advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, **named) -> CreditResult:
        """The method on one process's plain tensors, as the trainer runs it: its whole [`CreditResult`].

        `advantages_B` is `(B,)` (None for an advantage estimator), `mask_BT` `(B, T)`; `named` holds each statistic
        it reads (`policy_logps=logps_BT`: every tensor that is not a [`CreditBatch`] field is a statistic), its
        hyperparameters by field name (`taco_alpha=0.05`, the others keep their defaults) and any other field of
        [`CreditBatch`] (`vocab_size`, `step`, `rewards_B`, `group_index_B`, ...). Batch-global reductions span the
        tensors passed in.
        """
        return _run_stack([self], advantages_B, mask_BT, named)[0]


def register_credit_method(
    name: str,
    *,
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = (),
    arguments: type | None = None,
    paper: Mapping[str, str] | None = None,
    drops_tokens: bool = False,
    estimates_advantages: bool = False,
    **moved,
):
    """Register `function(batch: CreditBatch, **hyperparameters) -> CreditResult | Tensor` as method `name`.

    Args:
        name: what `credit_method` / `--method` calls it; its metrics are logged as `name/...`.
        statistics: the statistics it reads (the names in `batch.py`, or one a trainer subclass supplies), or a
            function of its hyperparameters returning them.
        arguments: the dataclass of its hyperparameters (fields named `<name>_...`, with `help` and defaults; its
            `__post_init__` checks them with [`check_fields`]).
        paper: `{"title", "id" (arXiv id), "citation" (BibTeX)}`, for the model card.
        drops_tokens: whether it may return a `loss_mask_BT`.
        estimates_advantages: it computes token advantages from `batch.rewards_B` and `batch.group_index_B` instead
            of reshaping the incoming ones, so it must come first in a stack.

    The function's docstring gives what the method shows ([`CreditMethod.display_name`]). Registering a second,
    different function under an existing name is an error.
    """
    if moved:
        hints = dict.fromkeys(_MOVED.get(keyword, "it is no keyword of it") for keyword in sorted(moved))
        raise TypeError(f"register_credit_method() does not take {sorted(moved)}: {'; '.join(hints)}")
    if not name.isidentifier():
        raise ValueError(f"credit method names must be Python identifiers (they prefix metrics), got {name!r}")
    if not callable(statistics) and not all(isinstance(s, str) and s.isidentifier() for s in statistics):
        raise ValueError(f"credit method {name!r}: statistics must be names, got {statistics!r}")
    if arguments is not None:
        _check_arguments(name, arguments)

    def decorator(function):
        method = CreditMethod(name, function, statistics, arguments, paper, drops_tokens, estimates_advantages)
        reserved = sorted(set(method.diagnostics) & set(COMMON_DIAGNOSTICS))
        if reserved:
            raise ValueError(
                f"credit method {name!r}: the trainer logs {reserved} for every method; rename its metric"
            )
        existing = CREDIT_METHODS.get(name)
        if existing is not None and _qualname(existing.function) != _qualname(function):
            raise ValueError(f"credit method {name!r} is already registered by {_qualname(existing.function)}")
        CREDIT_METHODS[name] = method
        return function

    return decorator


_DOCSTRING = (
    "start the function's docstring with 'Display name: summary.', then list its metrics under 'Metrics:' and its "
    "token-view statistic under 'Token statistic:', one indented 'name: meaning' line each"
)
_MOVED = {
    "checks": "check the values in the arguments dataclass's __post_init__, e.g. "
    "check_fields(self, my_max=(lambda v: v >= 1, '>= 1')) (from trl_credit.methods import check_fields)",
    **dict.fromkeys(("display_name", "summary", "diagnostics", "token_statistic"), _DOCSTRING),
}


def _check_arguments(name: str, arguments: type) -> None:
    """Hyperparameters carry their method's name (`taco_alpha`), so that TRL's config or another method can never
    set or read them, and have types that flags, YAML and JSON convert to."""
    declared_types = typing.get_type_hints(arguments)
    for f in dataclasses.fields(arguments):
        if not f.name.startswith(f"{name}_"):
            raise ValueError(
                f"credit method {name!r}: hyperparameter {f.name!r} must start with the method's name "
                f"({name}_{f.name}), so that no other method and no field of TRL's config can set it"
            )
        owner = next((m.name for m in CREDIT_METHODS.values() if m.name != name and f.name in m.argument_names), None)
        if owner is not None:
            raise ValueError(f"credit method {name!r}: hyperparameter {f.name!r} is already declared by {owner!r}")
        if f.name in BATCH_FIELDS:
            raise ValueError(f"credit method {name!r}: hyperparameter {f.name!r} is a field of CreditBatch")
        if not supported_type(declared_types[f.name]):
            raise ValueError(
                f"credit method {name!r}: hyperparameter {f.name!r} has type {declared_types[f.name]}; use bool, int, "
                "float, str, a Literal, an optional or a list of these"
            )


def _qualname(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def get_credit_method(name: str) -> CreditMethod:
    """The method registered as `name`; `"package.module:name"` imports the module first (it registers the method)."""
    if ":" in name:
        module_name, name = name.rsplit(":", 1)
        import_registering_module(module_name, CREDIT_METHODS)
    if name not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {name!r}; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}")
    return CREDIT_METHODS[name]


def parse_credit_methods(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`"eapo+taco"` or `["eapo", "taco"]` -> `("eapo", "taco")`; `"grpo"` (no reshaping) drops out of a stack."""
    parts = spec.split("+") if isinstance(spec, str) else [p for s in spec for p in str(s).split("+")]
    parts = [p.strip() for p in parts]
    if not parts or any(not p for p in parts):
        raise ValueError(f"credit_method must name one method or a '+'-separated stack, got {spec!r}")
    names = tuple(p for p in parts if p != "grpo")
    if len(set(names)) != len(names):
        raise ValueError(f"credit_method lists a method twice: {spec!r}")
    return names


def _not_owned(name: str, stack: list[CreditMethod]) -> str:
    """Why hyperparameter `name` does not belong to `stack`: whose it is, or the close matches."""
    stack_spec = "+".join(m.name for m in stack) or "grpo"
    owner = next((m.name for m in CREDIT_METHODS.values() if name in m.argument_names), None)
    if owner is not None:
        return f"belongs to credit method {owner!r}, which is not in the stack {stack_spec!r}"
    names = [n for m in stack for n in m.argument_names]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    known = f"did you mean {' or '.join(repr(n) for n in close)}?" if close else f"it has {names or 'none'}"
    return f"is not a hyperparameter of {stack_spec!r}; {known}"


def stack_hyperparameters(stack: list[CreditMethod], values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each method's hyperparameters, `{method: {name: value}}`, from `values` keyed by hyperparameter name; every
    name must belong to a method of the stack."""
    for name in values:
        if not any(name in m.argument_names for m in stack):
            raise SettingError(name, _not_owned(name, stack))
    return {m.name: m.hyperparameters({k: v for k, v in values.items() if k in m.argument_names}) for m in stack}


def apply_credit_method(name: str, advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, **named) -> CreditResult:
    """Run registered method `name` on plain tensors: [`CreditMethod.on_tensors`] of `get_credit_method(name)`."""
    return get_credit_method(name).on_tensors(advantages_B, mask_BT, **named)


def apply_credit_stack(
    spec: str | list[str], advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, **named
) -> CreditResult:
    """Run the stack `spec` (`"ar_lopti+taco+stapo"`) on one process's tensors (`named` as for
    [`CreditMethod.on_tensors`]), each method seeing what the methods before it produced (`CreditBatch.followed_by`).

    Returns the last method's advantages and, as `loss_mask_BT`, the product of the loss masks the methods returned
    (None when none did); no metrics.
    """
    stack = [get_credit_method(name) for name in parse_credit_methods(spec)]
    batch, drops_tokens = _run_stack(stack, advantages_B, mask_BT, named)[1:]
    return CreditResult(batch.advantages_BT, batch.loss_weights_BT if drops_tokens else None)


def _run_stack(
    stack: list[CreditMethod], advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, named: Mapping[str, Any]
) -> tuple[CreditResult | None, CreditBatch, bool]:
    """The last method's result, the batch after the stack, and whether a method returned a loss mask."""
    if advantages_B is None:  # an advantage estimator ignores the incoming advantages
        advantages_B = torch.zeros(mask_BT.shape[:1])
    if advantages_B.dim() != 1 or mask_BT.dim() != 2 or mask_BT.size(0) != advantages_B.size(0):
        raise ValueError(
            f"advantages_B must have shape (B,) and mask_BT (B, T), got {tuple(advantages_B.shape)} and {tuple(mask_BT.shape)}"
        )
    fields = {k: v for k, v in named.items() if k in BATCH_FIELDS and k != "advantages_BT"}
    owned = {name for method in stack for name in method.argument_names}  # a tensor given for one is refused there
    statistics = {k: v for k, v in named.items() if isinstance(v, torch.Tensor) and k not in BATCH_FIELDS | owned}
    values = {k: v for k, v in named.items() if k not in BATCH_FIELDS and k not in statistics}
    hyperparameters = stack_hyperparameters(stack, values)
    if fields.get("rewards_B") is not None:
        fields["rewards_B"] = fields["rewards_B"].float()
    batch = CreditBatch.from_sequence_advantages(advantages_B, mask_BT, statistics=statistics, **fields)
    if named.get("advantages_BT") is not None:
        batch = dataclasses.replace(batch, advantages_BT=named["advantages_BT"])
    result, drops_tokens = None, False
    with torch.no_grad():
        for method in stack:
            result = method(batch, hyperparameters[method.name])
            drops_tokens |= result.loss_mask_BT is not None
            batch = batch.followed_by(result)
    return result, batch, drops_tokens


def paper(title: str, arxiv_id: str, key: str, authors: str, year: int = 2026) -> dict[str, str]:
    """The `paper` record of a registration, as TRL's `_paper`: title, arXiv id and a BibTeX entry."""
    citation = (
        f"@article{{{key},\n    title        = {{{{{title}}}}},\n    author       = {{{authors}}},\n"
        f"    year         = {year},\n    eprint       = {{arXiv:{arxiv_id}}},\n}}"
    )
    return {"title": title, "id": arxiv_id, "citation": citation}

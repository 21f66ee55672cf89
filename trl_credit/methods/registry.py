"""The credit-method registry: `CREDIT_METHODS` (name -> [`CreditMethod`]), `@register_credit_method` that fills it
and [`get_credit_method`] that reads it; then the checks a registration passes, and methods run on plain tensors.

A method's display name is its registration's `display_name` (its name when not given). The rest of what it shows is
read once, at registration, from its function's docstring: the first paragraph is its summary, and the sections
`Metrics:` and `Token statistic:` list its metrics and its token-view statistic as indented `name: meaning` lines (a
meaning may go on over more deeply indented lines). A registration may name the papers of other methods that go by
the same name (`not_to_be_confused_with`, read by `names.py`). Nothing here imports TRL.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .batch import LOSS_FORWARD_STATISTICS, CreditBatch, CreditResult
from .names import confusions, other_papers
from .settings import SettingError, resolve_settings, supported_type
from .stack import StackCredit, StackStep, run_stack
from .user_modules import import_registering_module

CREDIT_METHODS: dict[str, CreditMethod] = {}


def register_credit_method(
    name: str,
    *,
    display_name: str | None = None,
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = (),
    arguments: type | None = None,
    paper: Mapping[str, str] | None = None,
    drops_tokens: bool = False,
    estimates_advantages: bool = False,
    keeps_signs: bool = False,
    not_to_be_confused_with: tuple[Mapping[str, str], ...] = (),
):
    """Register `function(batch: CreditBatch, **hyperparameters) -> CreditResult | Tensor` as method `name`.

    Args:
        name: what `credit_method` / `--method` calls it; its metrics are logged as `name/...`.
        display_name: its name in plots, cards and tables (`name` when not given).
        statistics: the statistics it reads (the names in `batch.py`, or one a trainer subclass supplies), or a
            function of its hyperparameters returning them.
        arguments: the dataclass of its hyperparameters (fields named `<name>_...`, with `help` and defaults; its
            `__post_init__` checks them with [`check_fields`]).
        paper: `{"title", "id" (arXiv id), "citation" (BibTeX)}`, for the model card.
        drops_tokens: whether it may return a `loss_mask_BT`.
        estimates_advantages: it computes token advantages from `batch.rewards_B` and `batch.group_index_B` instead
            of reshaping the incoming ones, so it must come first in a stack.
        keeps_signs: every token advantage it returns has the sign of the incoming one, or is 0 (it scales by
            positive factors, zeroes or drops tokens). TRL's loss reads each token advantage's sign
            (`off_policy_mask_threshold`, `loss_type="vespo"` and `"sapo"`); after such a method it reads the signs it
            read before it (docs/methods.md, "TRL's sign-reading options").
        not_to_be_confused_with: the papers of other methods that go by the same name, each [`other_paper`]: an
            unknown method name that looks like one of them (`gtpo_bytedance`) is answered with both papers
            (`names.py`).

    Registering a second, different function under an existing name is an error.
    """
    _check_registration(name, statistics, arguments)
    others = other_papers(name, not_to_be_confused_with)

    def decorator(function):
        registered = (name, function, statistics, arguments, paper, drops_tokens, estimates_advantages, keeps_signs)
        names = tuple(f.name for f in dataclasses.fields(arguments)) if arguments else ()
        method = CreditMethod(*registered, display_name or name, others, names, **_described(function))
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


def get_credit_method(name: str) -> CreditMethod:
    """The method registered as `name`; `"package.module:name"` imports the module first (it registers the method)."""
    if ":" in name:
        module_name, name = name.rsplit(":", 1)
        import_registering_module(module_name, CREDIT_METHODS)
    if name not in CREDIT_METHODS:
        known = f"; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}"  # after what the name looks like
        raise ValueError(f"unknown credit method {name!r}{confusions(name, CREDIT_METHODS.values())}{known}")
    return CREDIT_METHODS[name]


@dataclass(frozen=True, eq=False)
class CreditMethod:
    """A registered credit method: [`register_credit_method`]'s arguments, and what its docstring says it shows
    (`summary`, `diagnostics`: `{metric: meaning}`, logged as `name/metric`, and `token_statistic`: `(name, meaning)` of
    the statistic it returns for the token-credit view, or None)."""

    name: str
    function: Callable[..., CreditResult | torch.Tensor]
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]]
    arguments: type | None
    paper: Mapping[str, str] | None
    drops_tokens: bool
    estimates_advantages: bool
    keeps_signs: bool
    display_name: str
    not_to_be_confused_with: tuple[Mapping[str, str], ...] = ()
    argument_names: tuple[str, ...] = ()  # the fields of `arguments`, in order
    summary: str = ""
    diagnostics: dict[str, str] = field(default_factory=dict)
    token_statistic: tuple[str, str] | None = None

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

    def on_tensors(self, advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, **named) -> CreditResult:
        """The method on one process's plain tensors, as the trainer runs it: its whole [`CreditResult`].

        `advantages_B` is `(B,)` (None for an advantage estimator), `mask_BT` `(B, T)`; `named` holds each statistic
        it reads (`policy_logps=logps_BT`: every tensor that is not a [`CreditBatch`] field is a statistic), its
        hyperparameters by field name (`taco_alpha=0.05`, the others keep their defaults) and any other field of
        [`CreditBatch`] (`vocab_size`, `step`, `rewards_B`, `group_index_B`, ...). Batch-global reductions span the
        tensors passed in.
        """
        return _tensor_stack([self], advantages_B, mask_BT, named).results[-1][2]


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
# `CreditBatch` fields that `on_tensors` takes by name, besides the statistics (the other tensors it is given).
BATCH_FIELDS = frozenset(f.name for f in dataclasses.fields(CreditBatch)) - {
    "sequence_advantages_B",
    "mask_BT",
    "statistics",
}


def _described(function) -> dict[str, Any]:
    """`summary`, `diagnostics` and `token_statistic` from `function`'s docstring (the module docstring says how)."""
    first, _, rest = inspect.cleandoc(function.__doc__ or "").partition("\n\n")
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
    return {
        "summary": " ".join(first.split()),
        "diagnostics": sections.get("metrics", {}),
        "token_statistic": next(iter(sections.get("token statistic", {}).items()), None),
    }


def _check_registration(name: str, statistics, arguments: type | None) -> None:
    if not name.isidentifier():
        raise ValueError(f"credit method names must be Python identifiers (they prefix metrics), got {name!r}")
    if not callable(statistics) and not all(isinstance(s, str) and s.isidentifier() for s in statistics):
        raise ValueError(f"credit method {name!r}: statistics must be names, got {statistics!r}")
    if arguments is not None:
        _check_arguments(name, arguments)


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


def _not_owned(name: str, stack: Sequence[CreditMethod]) -> str:
    """Why hyperparameter `name` does not belong to `stack`: whose it is, or the close matches."""
    stack_spec = "+".join(m.name for m in stack) or "grpo"
    owner = next((m.name for m in CREDIT_METHODS.values() if name in m.argument_names), None)
    if owner is not None:
        return f"belongs to credit method {owner!r}, which is not in the stack {stack_spec!r}"
    names = [n for m in stack for n in m.argument_names]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    known = f"did you mean {' or '.join(repr(n) for n in close)}?" if close else f"it has {names or 'none'}"
    return f"is not a hyperparameter of {stack_spec!r}; {known}"


def resolve_stack(stack: Sequence[CreditMethod], values: Mapping[str, Any]) -> tuple[StackStep, ...]:
    """The steps of `stack` as it trains: each method with its hyperparameters (`values`, keyed by hyperparameter
    name, converted to the declared types; the rest their defaults) and the statistics they make it read. Every name
    must belong to a method of the stack; [`SettingError`] names the first unknown or bad one."""
    for name in values:
        if not any(name in m.argument_names for m in stack):
            raise SettingError(name, _not_owned(name, stack))
    steps = []
    for method in stack:
        hyperparameters = resolve_settings(
            method.arguments, {k: v for k, v in values.items() if k in method.argument_names}
        )
        steps.append(StackStep(method, hyperparameters, method.statistics_for(hyperparameters)))
    return tuple(steps)


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
    credit = _tensor_stack(stack, advantages_B, mask_BT, named)
    return CreditResult(
        credit.batch.advantages_BT, None if credit.loss_mask_BT is None else credit.batch.loss_weights_BT
    )


def _tensor_stack(
    stack: list[CreditMethod], advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, named: Mapping[str, Any]
) -> StackCredit:
    """`stack` run on plain tensors (`named` as for [`CreditMethod.on_tensors`]) by [`run_stack`]."""
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
    if fields.get("rewards_B") is not None:
        fields["rewards_B"] = fields["rewards_B"].float()
    batch = CreditBatch.from_sequence_advantages(advantages_B, mask_BT, statistics=statistics, **fields)
    if named.get("advantages_BT") is not None:
        batch = dataclasses.replace(batch, advantages_BT=named["advantages_BT"])
    return run_stack(resolve_stack(stack, values), batch)


def paper(title: str, arxiv_id: str, key: str, authors: str, year: int = 2026) -> dict[str, str]:
    """The `paper` record of a registration, as TRL's `_paper`: title, arXiv id and a BibTeX entry."""
    citation = (
        f"@article{{{key},\n    title        = {{{{{title}}}}},\n    author       = {{{authors}}},\n"
        f"    year         = {year},\n    eprint       = {{arXiv:{arxiv_id}}},\n}}"
    )
    return {"title": title, "id": arxiv_id, "citation": citation}

"""The credit-method registry: what the package knows about each method, how a method is registered, found by
name and run, alone or in a stack.

A credit method is one file holding three things:

* its hyperparameters, a dataclass of config fields with `help` and the paper's defaults;
* the per-token statistics it reads (the names in `batch.py`);
* a pure function from a [`CreditBatch`] to a [`CreditResult`]: new `(B, T)` token advantages and, where the
  official method drops tokens from the loss, a per-token loss mask.

`@register_credit_method` makes it available as `credit_method="name"` in Python, YAML and the CLI, and
[`CreditMethod.on_tensors`] runs it on plain tensors. Methods stack (`"eapo+taco"`): each sees the token advantages and
the loss mask the previous one returned. Nothing here imports TRL.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .batch import LOSS_FORWARD_STATISTICS, STATISTICS, CreditBatch, CreditResult
from .settings import Check, SettingError, resolve_settings, supported_type
from .user_modules import import_user_module
from .validation import check_result, checked_batch

# What `on_tensors` takes by name besides statistics and hyperparameters: the batch's other fields.
TENSOR_FIELDS = frozenset(f.name for f in dataclasses.fields(CreditBatch)) - {
    "sequence_advantages_B",
    "mask_BT",
    "statistics",
}


@dataclass(frozen=True, eq=False)
class CreditMethod:
    """A registered credit method: everything the package knows about it. Build it with [`register_credit_method`].

    Plots, the token-credit view, model cards, `--help` and the documentation tables read these fields; no other
    module names a method.
    """

    name: str
    function: Callable[..., CreditResult | torch.Tensor]
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]]
    arguments: type | None = None
    checks: Mapping[str, Check] = field(default_factory=dict)
    paper: Mapping[str, str] | None = None
    drops_tokens: bool = False
    display_name: str = ""
    summary: str = ""
    diagnostics: Mapping[str, str] = field(default_factory=dict)
    token_statistic: tuple[str, str] | None = None
    estimates_advantages: bool = False

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.argument_fields())

    def argument_fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.arguments) if self.arguments else ()

    def hyperparameters(self, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every hyperparameter of the method: `values` (by field name) coerced to the declared types, the rest
        their defaults, passed through the `arguments` dataclass and checked by the registration's `checks`.

        Raises [`SettingError`] naming the first unknown, mistyped or out-of-range hyperparameter.
        """
        values = dict(values or {})
        for name in values:
            if name not in self.argument_names:
                raise SettingError(name, _not_owned(name, [self]))
        return resolve_settings(self.arguments, self.checks, values)

    def statistics_for(self, hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
        statistics = self.statistics(dict(hyperparameters)) if callable(self.statistics) else self.statistics
        return tuple(statistics)

    def reads_training_forward(self, hyperparameters: Mapping[str, Any]) -> bool:
        """Whether the method runs in the training forward (it reads the current policy) or at generation."""
        return any(name in LOSS_FORWARD_STATISTICS for name in self.statistics_for(hyperparameters))

    def __call__(self, batch: CreditBatch, hyperparameters: Mapping[str, Any]) -> CreditResult:
        """Run the method on `batch` with resolved `hyperparameters` (from [`hyperparameters`]), validating the batch
        and what the method returned (errors name the method)."""
        batch = checked_batch(self, batch, hyperparameters)
        result = self.function(batch, **hyperparameters)
        result = result if isinstance(result, CreditResult) else CreditResult(advantages_BT=result)
        check_result(self, batch, result)
        return result

    def on_tensors(self, advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, **named) -> CreditResult:
        """The method on one process's plain tensors, as the trainer runs it: its whole [`CreditResult`].

        Args:
            advantages_B: `(B,)` sequence advantages `A_i`, which every valid token carries unless `advantages_BT` is
                given; None for an advantage estimator (it reads `rewards_B` and `group_index_B`).
            mask_BT: `(B, T)` valid completion positions (bool or 0/1).
            **named: each statistic the method reads, by its name (`policy_logps=logps_BT`, `(B, T)` each); its
                hyperparameters, by field name (`taco_alpha=0.5`; the others keep their defaults); any other field of
                [`CreditBatch`] (`advantages_BT`, `vocab_size`, `step`, `clip_range`, `loss_weights_BT`,
                `group_index_B`, `rewards_B`, `gather`).

        The hyperparameters are checked once, by the registration's `checks`. Batch-global reductions (EAPO's
        quantiles) span the tensors passed in. For example
        `get_credit_method("taco").on_tensors(advantages_B, mask_BT, policy_logps=logps_BT,
        policy_entropy=entropy_BT, taco_alpha=0.05).advantages_BT`.
        """
        batch, values = tensor_batch(advantages_B, mask_BT, named)
        hyperparameters = self.hyperparameters(values)
        with torch.no_grad():
            return self(batch, hyperparameters)


def tensor_batch(
    advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, named: Mapping[str, Any]
) -> tuple[CreditBatch, dict[str, Any]]:
    """The [`CreditBatch`] of plain tensors that [`CreditMethod.on_tensors`] describes, and what is left of `named`:
    the hyperparameters."""
    statistics = {name: value for name, value in named.items() if name in STATISTICS}
    fields = {name: value for name, value in named.items() if name in TENSOR_FIELDS}
    hyperparameters = {name: value for name, value in named.items() if name not in statistics and name not in fields}
    if advantages_B is None:  # an advantage estimator ignores the incoming advantages
        advantages_B = torch.zeros(mask_BT.shape[:1])
    if advantages_B.dim() != 1 or mask_BT.dim() != 2 or mask_BT.size(0) != advantages_B.size(0):
        raise ValueError(
            f"advantages_B must have shape (B,) and mask_BT (B, T), got {tuple(advantages_B.shape)} and {tuple(mask_BT.shape)}"
        )
    advantages_BT = fields.pop("advantages_BT", None)
    if fields.get("rewards_B") is not None:
        fields["rewards_B"] = fields["rewards_B"].float()
    batch = CreditBatch.from_sequence_advantages(advantages_B, mask_BT, statistics=statistics, **fields)
    if advantages_BT is not None:
        batch = dataclasses.replace(batch, advantages_BT=advantages_BT)
    return batch, hyperparameters


CREDIT_METHODS: dict[str, CreditMethod] = {}

# `grpo` is no registered method: it is the empty stack, every token keeping its response's advantage.
GRPO_DISPLAY_NAME = "GRPO"
GRPO_SUMMARY = "Every token of a completion receives the completion's group-normalised advantage."

# What the trainer logs for every method of a stack, as `name/metric`, besides the method's own diagnostics.
COMMON_DIAGNOSTICS = {
    "mean_weight": "mean factor Â / A by which the method multiplied the incoming advantages (valid tokens, A != 0)",
    "weight_std": "standard deviation of that factor",
    "weight_max": "largest factor",
    "kept_fraction": "mean loss-mask weight over the tokens the method saw in the loss (methods that drop tokens)",
}


def register_credit_method(
    name: str,
    *,
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = (),
    arguments: type | None = None,
    checks: Mapping[str, Check] | None = None,
    paper: Mapping[str, str] | None = None,
    drops_tokens: bool = False,
    display_name: str | None = None,
    summary: str = "",
    diagnostics: Mapping[str, str] | None = None,
    token_statistic: tuple[str, str] | None = None,
    estimates_advantages: bool = False,
):
    """Register `function(batch: CreditBatch, **hyperparameters) -> CreditResult | Tensor` as credit method `name`.

    Args:
        name: what `credit_method` / `--method` calls it; its diagnostics are logged as `name/...`.
        statistics: the statistics it reads (the names in `batch.py`), or a function of its
            hyperparameters returning them.
        arguments: a dataclass of its hyperparameters (fields with `help` and defaults). They are set through
            `CreditGRPOConfig(credit_kwargs={...})`, YAML keys or `--flags` of `trl-credit grpo --method name`.
        checks: `{hyperparameter: (predicate, allowed values in words)}`, checked before training starts.
        paper: `{"title", "id" (arXiv id), "citation" (BibTeX)}`, for the model card.
        drops_tokens: whether it may return a `loss_mask_BT`.
        display_name: its name in plots, cards and tables (defaults to `name`).
        summary: one line saying what it does, for cards, `--help` and the methods table.
        diagnostics: `{metric: meaning}` of every metric it returns (logged as `name/metric`); returning an
            undeclared one is an error.
        token_statistic: `(name, meaning)` of the per-token statistic it returns for the token-credit view.
        estimates_advantages: it computes token advantages from the raw rewards and the groups (`batch.rewards_B`,
            `batch.group_index_B`) instead of reshaping the incoming ones, so it must come first in a stack.

    Registering a second, different function under an existing name is an error.
    """
    if not name.isidentifier():
        raise ValueError(f"credit method names must be Python identifiers (they prefix metrics), got {name!r}")
    if not callable(statistics):
        unknown = [s for s in statistics if s not in STATISTICS]
        if unknown:
            raise ValueError(f"unknown statistics {unknown} for credit method {name!r}; choose from {STATISTICS}")
    if arguments is not None:
        _check_arguments(name, arguments)
        unknown = sorted(set(checks or {}) - {f.name for f in dataclasses.fields(arguments)})
        if unknown:
            raise ValueError(f"credit method {name!r} checks {unknown}, which are not fields of {arguments.__name__}")

    reserved = sorted(set(diagnostics or {}) & set(COMMON_DIAGNOSTICS))
    if reserved:
        raise ValueError(
            f"credit method {name!r}: the trainer logs {reserved} for every method; name its metrics otherwise"
        )

    def decorator(function):
        method = CreditMethod(
            name,
            function,
            statistics if callable(statistics) else tuple(statistics),
            arguments,
            dict(checks or {}),
            paper,
            drops_tokens,
            display_name or name,
            summary,
            dict(diagnostics or {}),
            token_statistic,
            estimates_advantages,
        )
        existing = CREDIT_METHODS.get(name)
        if existing is not None and _qualname(existing.function) != _qualname(function):
            raise ValueError(f"credit method {name!r} is already registered by {_qualname(existing.function)}")
        CREDIT_METHODS[name] = method
        return function

    return decorator


def _check_arguments(name: str, arguments: type) -> None:
    """A method's hyperparameters carry its name (`taco_alpha`), so that TRL's config or another method can never
    set or read them; their types must be ones that YAML, JSON and flags can be converted to."""
    declared_types = typing.get_type_hints(arguments)
    for f in dataclasses.fields(arguments):
        if not f.name.startswith(f"{name}_"):
            raise ValueError(
                f"credit method {name!r}: hyperparameter {f.name!r} must start with the method's name "
                f"({name}_{f.name}), so that no other method and no field of TRL's config can set it"
            )
        if f.name in STATISTICS or f.name in TENSOR_FIELDS:
            raise ValueError(
                f"credit method {name!r}: hyperparameter {f.name!r} is the name of a statistic or a batch field, which "
                "`on_tensors` takes by the same name"
            )
        owner = next((m.name for m in CREDIT_METHODS.values() if m.name != name and f.name in m.argument_names), None)
        if owner is not None:
            raise ValueError(f"credit method {name!r}: hyperparameter {f.name!r} is already declared by {owner!r}")
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
        try:
            _import_method_module(module_name)
        except Exception as error:  # noqa: BLE001 - a user module may fail at import in any way: name it in one line
            reason = " ".join(f"{type(error).__name__}: {error}".split())
            raise ValueError(f"cannot import credit-method module {module_name!r}: {reason}") from error
    if name not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {name!r}; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}")
    return CREDIT_METHODS[name]


def _import_method_module(module_name: str) -> None:
    """Import the user's module that registers methods. If the import raises, the methods it registered before
    failing are forgotten, with the module itself (`import_user_module`): a retry, the file fixed, starts afresh."""
    registered = dict(CREDIT_METHODS)
    try:
        import_user_module(module_name)
    except BaseException:
        CREDIT_METHODS.clear()
        CREDIT_METHODS.update(registered)
        raise


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
    """Each method's hyperparameters, `{method: {name: value}}`, from `values` keyed by hyperparameter name.

    Every name must belong to a method of the stack; values are coerced and checked by their method.
    """
    for name in values:
        if not any(name in m.argument_names for m in stack):
            raise SettingError(name, _not_owned(name, stack))
    return {m.name: m.hyperparameters({k: v for k, v in values.items() if k in m.argument_names}) for m in stack}


def apply_credit_method(name: str, advantages_B: torch.Tensor | None, mask_BT: torch.Tensor, **named) -> CreditResult:
    """Run registered method `name` on plain tensors: [`CreditMethod.on_tensors`] of `get_credit_method(name)`."""
    return get_credit_method(name).on_tensors(advantages_B, mask_BT, **named)


def apply_credit_stack(
    spec: str | list[str], advantages_B: torch.Tensor, mask_BT: torch.Tensor, **named
) -> CreditResult:
    """Run the stack `spec` (`"ar_lopti+taco+stapo"`) on one process's tensors, as the trainer runs a stage: each
    method sees the advantages and the loss mask the methods before it produced (`CreditBatch.followed_by`).

    Args:
        advantages_B, mask_BT, **named: as for [`CreditMethod.on_tensors`]; `named` holds the statistics every method
            reads and any method's hyperparameters (the others keep their defaults).

    Returns:
        The last method's advantages, and as `loss_mask_BT` the product of the loss masks the methods returned (None
        when none did); no metrics.
    """
    stack = [get_credit_method(name) for name in parse_credit_methods(spec)]
    batch, values = tensor_batch(advantages_B, mask_BT, named)
    hyperparameters = stack_hyperparameters(stack, values)
    drops_tokens = False
    with torch.no_grad():
        for method in stack:
            result = method(batch, hyperparameters[method.name])
            drops_tokens |= result.loss_mask_BT is not None
            batch = batch.followed_by(result)
    return CreditResult(batch.advantages_BT, batch.loss_weights_BT if drops_tokens else None)


def paper(title: str, arxiv_id: str, key: str, authors: str, year: int = 2026) -> dict[str, str]:
    """The `paper` record of a registration, as TRL's `_paper`: title, arXiv id and a BibTeX entry (the model card
    cites it)."""
    citation = (
        f"@article{{{key},\n"
        f"    title        = {{{{{title}}}}},\n"
        f"    author       = {{{authors}}},\n"
        f"    year         = {year},\n"
        f"    eprint       = {{arXiv:{arxiv_id}}},\n"
        f"}}"
    )
    return {"title": title, "id": arxiv_id, "citation": citation}

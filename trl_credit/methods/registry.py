"""The credit-method interface: the statistics a method may read, what it returns, and the registry.

A credit method is one file holding three things:

* its hyperparameters, a dataclass of config fields with `help` and the paper's defaults;
* the per-token statistics it reads (names below);
* a pure function from a [`CreditBatch`] to a [`CreditResult`]: new `(B, T)` token advantages and, where the
  official method drops tokens from the loss, a per-token loss mask.

`@register_credit_method` makes it available as `credit_method="name"` in Python, YAML and the CLI. Methods stack
(`"eapo+taco"`): each sees the token advantages and the loss mask the previous one returned. Nothing here imports
TRL.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

# Per-token statistics a method can ask for. Each is `(B, T)` float32, aligned with the completion tokens, zero
# at masked positions. The trainer computes each requested statistic once per batch from TRL's own forward
# (the model's full output transform, the sampling temperature, multimodal inputs).
POLICY_LOGPS = "policy_logps"  # log p of the sampled token under the current policy, from the training forward
POLICY_ENTROPY = "policy_entropy"  # full-vocabulary entropy (nats) of the current policy, from the training forward
# `z_y - max_v z_v` (<= 0): the sampled token's logit minus the largest logit of the current policy, logits at the
# sampling temperature, from the LM head streamed over the training forward's final hidden states
POLICY_LOGIT_GAP = "policy_logit_gap"
ROLLOUT_LOGPS = "rollout_logps"  # the same for the policy that generated the batch, once per generation batch
ROLLOUT_ENTROPY = "rollout_entropy"
# sum_v pi_v^2 of the rollout policy's next-token distribution (in (0, 1]), from the same source as `rollout_entropy`
ROLLOUT_SUM_SQ_PROBS = "rollout_sum_sq_probs"
# The token mean of `rollout_entropy` over every valid token of the generation batch (all processes), the same value at
# every valid position: a batch-level entropy that a method in the training forward can read from any micro-batch
ROLLOUT_MEAN_ENTROPY = "rollout_mean_entropy"
REFERENCE_DEVIATION = "reference_deviation"  # squared Hellinger distance to the frozen initial model
PREVIOUS_POLICY_DEVIATION = "previous_policy_deviation"  # ... to the policy of the previous generation batch
# 1.0 on the tokens the task's ground truth marks as deciding the reward, else 0. The trainer cannot compute it: only a
# trainer that knows the task supplies it (the credit lab's `LabTrainer`).
TASK_DECISIVE = "task_decisive"

LOSS_FORWARD_STATISTICS = (POLICY_LOGPS, POLICY_ENTROPY, POLICY_LOGIT_GAP)
GENERATION_STATISTICS = (
    ROLLOUT_LOGPS,
    ROLLOUT_ENTROPY,
    ROLLOUT_SUM_SQ_PROBS,
    ROLLOUT_MEAN_ENTROPY,
    REFERENCE_DEVIATION,
    PREVIOUS_POLICY_DEVIATION,
)
STATISTICS = LOSS_FORWARD_STATISTICS + GENERATION_STATISTICS + (TASK_DECISIVE,)


def _local(values_N: torch.Tensor) -> torch.Tensor:
    return values_N


@dataclass(frozen=True)
class CreditBatch:
    """What a credit method sees of a batch.

    Args:
        advantages_BT: incoming token advantages: `A_i` on every valid token for the first method of a stack,
            else the previous method's output. Zero at masked positions. "Positive token" means `advantages_BT > 0`.
        sequence_advantages_B: GRPO's sequence advantages `A_i`, whatever ran before.
        mask_BT: bool, the positions still in the loss: valid completion positions (completion mask x tool mask)
            with a positive `loss_weights_BT`. Tokens an earlier method of the stack dropped are masked.
        statistics: the statistics the method asked for, by name.
        vocab_size: rows of the policy's LM head.
        step: the optimizer step (`trainer.state.global_step`), for schedules.
        gather: returns the values of every process, concatenated (a collective: call it on every process). At
            generation it spans the whole generation batch; in the training forward, the micro-batches of one step.
        clip_range: `(epsilon_low, epsilon_high)` of the loss's PPO clip, for methods that must know which tokens
            the clipped objective already silences (Clip-Cov).
        loss_weights_BT: float, each token's weight in the loss: the product of the loss masks the earlier methods
            of the stack returned (soft for min-p), as the official code multiplies verl's `response_mask` step by
            step. `mask_BT` as float when omitted.
        group_index_B: long, the prompt group of each row, the same number on every process for the completions of
            one prompt (a group may span processes), for advantage estimators; None outside a trainer unless given.
        rewards_B: the raw reward of each row (TRL's weighted sum over reward functions, before any normalisation),
            for advantage estimators; None outside a trainer unless given.
    """

    advantages_BT: torch.Tensor
    sequence_advantages_B: torch.Tensor
    mask_BT: torch.Tensor
    statistics: Mapping[str, torch.Tensor] = field(default_factory=dict)
    vocab_size: int | None = None
    step: int = 0
    gather: Callable[[torch.Tensor], torch.Tensor] = _local
    clip_range: tuple[float, float] = (0.2, 0.2)
    loss_weights_BT: torch.Tensor | None = None
    group_index_B: torch.Tensor | None = None
    rewards_B: torch.Tensor | None = None

    def __post_init__(self):
        if self.loss_weights_BT is None:
            object.__setattr__(self, "loss_weights_BT", self.mask_BT.float())

    def followed_by(self, result: CreditResult) -> CreditBatch:
        """The batch the next method of a stack sees: `result`'s advantages, and its loss mask multiplied into the
        loss weights; a token whose weight reaches 0 leaves `mask_BT`."""
        weights_BT = self.loss_weights_BT
        if result.loss_mask_BT is not None:
            weights_BT = weights_BT * result.loss_mask_BT.float()
        mask_BT = self.mask_BT & (weights_BT > 0)
        return dataclasses.replace(
            self,
            advantages_BT=torch.where(mask_BT, result.advantages_BT.float(), 0.0),
            mask_BT=mask_BT,
            loss_weights_BT=torch.where(mask_BT, weights_BT, 0.0),
        )

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.statistics:
            raise KeyError(f"statistic {name!r} was not requested; the method's `statistics` must list it")
        return self.statistics[name]

    @classmethod
    def from_sequence_advantages(cls, advantages_B: torch.Tensor, mask_BT: torch.Tensor, **kwargs) -> CreditBatch:
        """The batch a stack starts from: every valid token carries its response's advantage, as in GRPO."""
        mask_BT = mask_BT.bool()
        advantages_B = advantages_B.float()
        return cls(advantages_B.unsqueeze(1) * mask_BT, advantages_B, mask_BT, **kwargs)


# A per-token metric: a `(B, T)` tensor averaged over valid tokens, a `(numerator_BT, denominator_BT)` pair of
# masks whose sums give a ratio, or a float that is already the same on every process.
Metric = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | float


@dataclass
class CreditResult:
    """What a credit method returns.

    Args:
        advantages_BT: the new `(B, T)` token advantages.
        loss_mask_BT: optional `(B, T)` weights in `[0, 1]` that multiply the loss mask, as the official code of
            some baselines multiplies verl's `response_mask`: a dropped token also leaves the loss normaliser.
        metrics: diagnostics, logged as `<method>/<name>` and reduced over every process.
        statistic_BT: the per-token statistic shown in the token-credit view.
    """

    advantages_BT: torch.Tensor
    loss_mask_BT: torch.Tensor | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    statistic_BT: torch.Tensor | None = None


# A check of one hyperparameter: a predicate and the allowed values in words ("in (0, 1]").
Check = tuple[Callable[[Any], bool], str]

# Statistics with a bounded range: a streamed computation may round slightly outside it, anything further is a bug
# upstream. The rest need only be finite.
STATISTIC_RANGES = {
    REFERENCE_DEVIATION: (0.0, 1.0),
    PREVIOUS_POLICY_DEVIATION: (0.0, 1.0),
    ROLLOUT_SUM_SQ_PROBS: (0.0, 1.0),
}
_RANGE_TOLERANCE = 1e-4


class SettingError(ValueError):
    """A setting (a method hyperparameter, a run size) that is unknown, of the wrong type or out of range.

    `name` is the setting and `problem` what is wrong with it, so that a front end can say where the value came
    from (`--taco_alpha`, a YAML key, `credit_kwargs`).
    """

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name} {problem}")
        self.name, self.problem = name, problem


_TRUE, _FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off"}


def coerce_value(name: str, value: Any, declared: Any) -> Any:
    """`value` as the declared type of hyperparameter `name`, or [`SettingError`].

    YAML reads `5e-2` as a string and JSON gives ints where floats are declared: numbers, booleans and lists are
    converted; anything that does not denote a value of the declared type is refused.
    """
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if declared is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in arguments:
            return None
        (inner,) = [a for a in arguments if a is not type(None)]
        return coerce_value(name, value, inner)
    if origin is Literal:
        if value not in arguments:
            raise SettingError(name, f"must be one of {list(arguments)}, got {value!r}")
        return value
    if origin in (list, tuple):
        items = value
        if isinstance(value, str):
            try:
                items = json.loads(value)
            except json.JSONDecodeError:
                items = [part.strip() for part in value.strip("[]()").split(",")]
        if not isinstance(items, list | tuple):
            raise SettingError(name, f"must be a list, got {value!r}")
        (item_type,) = arguments[:1] or (Any,)
        return origin(coerce_value(name, item, item_type) for item in items)
    if declared is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
    elif declared is int:
        number = _number(value)
        if number is not None and float(number).is_integer():
            return int(number)
    elif declared is float:
        number = _number(value)
        if number is not None:
            return float(number)
    elif declared is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise SettingError(name, f"must be {_TYPE_WORDS[declared]}, got {value!r}")


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
SUPPORTED_TYPES = (*_TYPE_WORDS, Any)


def _number(value: Any) -> int | float | None:
    """An int or float from a number or a numeric string (not a bool); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _supported(declared: Any) -> bool:
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in arguments if a is not type(None)]
        return len(inner) == 1 and _supported(inner[0])
    if origin in (list, tuple):
        return len(arguments) <= 1 and all(_supported(a) for a in arguments)
    return origin is Literal or declared in SUPPORTED_TYPES


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
        their defaults, passed through the `arguments` dataclass and checked.

        Raises [`SettingError`] naming the first unknown, mistyped or out-of-range hyperparameter.
        """
        values = dict(values or {})
        for name in values:
            if name not in self.argument_names:
                raise SettingError(name, _not_owned(name, [self]))
        if self.arguments is None:
            return {}
        declared_types = typing.get_type_hints(self.arguments)
        coerced = {name: coerce_value(name, value, declared_types[name]) for name, value in values.items()}
        resolved = dataclasses.asdict(self.arguments(**coerced))
        for name, (ok, allowed) in self.checks.items():
            value = resolved[name]
            try:
                fine = ok(value)
            except (TypeError, ValueError):
                fine = False
            if not fine:
                raise SettingError(name, f"must be {allowed}, got {value!r}")
        return resolved

    def statistics_for(self, hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
        statistics = self.statistics(dict(hyperparameters)) if callable(self.statistics) else self.statistics
        return tuple(statistics)

    def reads_training_forward(self, hyperparameters: Mapping[str, Any]) -> bool:
        """Whether the method runs in the training forward (it reads the current policy) or at generation."""
        return any(name in LOSS_FORWARD_STATISTICS for name in self.statistics_for(hyperparameters))

    def __call__(self, batch: CreditBatch, hyperparameters: Mapping[str, Any]) -> CreditResult:
        """Validate `batch`, run the method, and validate what it returned (errors name the method)."""
        batch = self._checked_batch(batch, hyperparameters)
        result = self.function(batch, **hyperparameters)
        result = result if isinstance(result, CreditResult) else CreditResult(advantages_BT=result)
        self._check_result(batch, result)
        return result

    def _checked_batch(self, batch: CreditBatch, hyperparameters: Mapping[str, Any]) -> CreditBatch:
        """`batch` with each statistic the method reads checked (shape, finite at valid positions, range) and zeroed
        at masked positions, where whatever padding holds (even NaN) is ignored."""
        mask_BT = batch.mask_BT
        if mask_BT.dim() != 2 or mask_BT.dtype != torch.bool:
            raise ValueError(
                f"credit method {self.name!r}: mask_BT must be a (B, T) bool tensor, got {_describe(mask_BT)}"
            )
        if batch.sequence_advantages_B.shape != mask_BT.shape[:1]:
            raise ValueError(
                f"credit method {self.name!r}: sequence_advantages_B must have shape ({mask_BT.size(0)},), got "
                f"{tuple(batch.sequence_advantages_B.shape)}"
            )
        _check_finite(self.name, "sequence_advantages_B", batch.sequence_advantages_B, None)
        if self.estimates_advantages:
            for what, values_B in (("group_index_B", batch.group_index_B), ("rewards_B", batch.rewards_B)):
                if values_B is None or values_B.shape != mask_BT.shape[:1]:
                    got = "None" if values_B is None else tuple(values_B.shape)
                    raise ValueError(
                        f"credit method {self.name!r} estimates advantages from the groups and raw rewards: the batch "
                        f"must carry {what} of shape ({mask_BT.size(0)},), got {got}"
                    )
            _check_finite(self.name, "rewards_B", batch.rewards_B, None)
        _check_finite(
            self.name, "advantages_BT", _same_shape(self.name, "advantages_BT", batch.advantages_BT, mask_BT), mask_BT
        )
        weights_BT = _same_shape(self.name, "loss_weights_BT", batch.loss_weights_BT, mask_BT).float()
        if (mask_BT & ~((weights_BT >= 0) & (weights_BT <= 1))).any():  # NaN fails both comparisons
            raise ValueError(f"credit method {self.name!r}: loss_weights_BT must lie in [0, 1] at valid positions")
        statistics = dict(batch.statistics)
        for name in self.statistics_for(hyperparameters):
            if name not in statistics:
                raise ValueError(
                    f"credit method {self.name!r} reads statistic {name!r}, which the batch does not have"
                )
            values_BT = _same_shape(self.name, f"statistic {name!r}", statistics[name], mask_BT).detach().float()
            _check_finite(self.name, f"statistic {name!r}", values_BT, mask_BT)
            statistics[name] = torch.where(mask_BT, values_BT, 0.0)
            if name in STATISTIC_RANGES:
                low, high = STATISTIC_RANGES[name]
                outside_BT = mask_BT & ((values_BT < low - _RANGE_TOLERANCE) | (values_BT > high + _RANGE_TOLERANCE))
                if outside_BT.any():
                    valid_N = values_BT[mask_BT]
                    raise ValueError(
                        f"credit method {self.name!r}: statistic {name!r} must lie in [{low:g}, {high:g}] at valid "
                        f"positions, got values in [{valid_N.min().item():g}, {valid_N.max().item():g}]"
                    )
        return dataclasses.replace(
            batch,
            advantages_BT=torch.where(mask_BT, batch.advantages_BT.float(), 0.0),
            statistics=statistics,
            loss_weights_BT=torch.where(mask_BT, weights_BT, 0.0),
        )

    def _check_result(self, batch: CreditBatch, result: CreditResult) -> None:
        mask_BT = batch.mask_BT
        if result.advantages_BT.shape != mask_BT.shape:
            raise ValueError(
                f"credit method {self.name!r} returned advantages of shape {tuple(result.advantages_BT.shape)}, "
                f"expected {tuple(mask_BT.shape)}"
            )
        _check_finite(self.name, "the returned advantages_BT", result.advantages_BT, mask_BT)
        if result.loss_mask_BT is not None:
            if not self.drops_tokens:
                raise ValueError(
                    f"credit method {self.name!r} returned a loss mask but is registered with drops_tokens=False"
                )
            loss_mask_BT = _same_shape(self.name, "returned loss mask", result.loss_mask_BT, mask_BT).float()
            if (mask_BT & ~((loss_mask_BT >= 0) & (loss_mask_BT <= 1))).any():  # NaN fails both comparisons
                raise ValueError(f"credit method {self.name!r} returned a loss mask outside [0, 1] at valid positions")
        undeclared = sorted(set(result.metrics) - set(self.diagnostics))
        if undeclared:
            raise ValueError(
                f"credit method {self.name!r} logged metrics {undeclared} that its registration does not declare; "
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
        statistics: the statistics it reads (the constants of this module), or a function of its
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
        owner = next((m.name for m in CREDIT_METHODS.values() if m.name != name and f.name in m.argument_names), None)
        if owner is not None:
            raise ValueError(f"credit method {name!r}: hyperparameter {f.name!r} is already declared by {owner!r}")
        if not _supported(declared_types[f.name]):
            raise ValueError(
                f"credit method {name!r}: hyperparameter {f.name!r} has type {declared_types[f.name]}; use bool, int, "
                "float, str, a Literal, an optional or a list of these"
            )


def apply_credit_method(
    name: str,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    statistics: Mapping[str, torch.Tensor],
    *,
    vocab_size: int | None = None,
    step: int = 0,
    clip_range: tuple[float, float] = (0.2, 0.2),
    advantages_BT: torch.Tensor | None = None,
    group_index_B: torch.Tensor | None = None,
    rewards_B: torch.Tensor | None = None,
    **hyperparameters,
) -> CreditResult:
    """Run registered method `name` on one process's tensors, as the trainer does, outside a trainer.

    Args:
        advantages_B: `(B,)` sequence advantages `A_i`.
        mask_BT: `(B, T)` valid completion positions (bool or 0/1).
        statistics: the statistics the method reads, `(B, T)` each, by name.
        advantages_BT: incoming token advantages (a previous method's output); `A_i` on every valid token if None.
        group_index_B, rewards_B: `(B,)` prompt group of each row and raw rewards, for advantage estimators.
        **hyperparameters: the method's hyperparameters by field name; the others keep their defaults.

    Batch-global reductions (EAPO's quantiles) span the tensors passed in.
    """
    method = get_credit_method(name)
    values = method.hyperparameters(hyperparameters)
    if advantages_B.dim() != 1 or mask_BT.dim() != 2 or mask_BT.size(0) != advantages_B.size(0):
        raise ValueError(
            f"advantages_B must have shape (B,) and mask_BT (B, T), got {tuple(advantages_B.shape)} and {tuple(mask_BT.shape)}"
        )
    batch = CreditBatch.from_sequence_advantages(
        advantages_B,
        mask_BT,
        statistics=statistics,
        vocab_size=vocab_size,
        step=step,
        clip_range=clip_range,
        group_index_B=group_index_B,
        rewards_B=None if rewards_B is None else rewards_B.float(),
    )
    if advantages_BT is not None:
        batch = dataclasses.replace(batch, advantages_BT=advantages_BT)
    with torch.no_grad():
        return method(batch, values)


def apply_credit_stack(
    spec: str | list[str],
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    statistics: Mapping[str, torch.Tensor],
    *,
    vocab_size: int | None = None,
    step: int = 0,
    clip_range: tuple[float, float] = (0.2, 0.2),
    **hyperparameters,
) -> CreditResult:
    """Run the stack `spec` (`"ar_lopti+taco+stapo"`) on one process's tensors, as the trainer runs a stage: each
    method sees the advantages and the loss mask the methods before it produced (`CreditBatch.followed_by`).

    Args:
        advantages_B, mask_BT, statistics: as for [`apply_credit_method`]; `statistics` holds what every method reads.
        **hyperparameters: any method's hyperparameters by field name; the others keep their defaults.

    Returns:
        The last method's advantages, and as `loss_mask_BT` the product of the loss masks the methods returned (None
        when none did); no metrics.
    """
    stack = [get_credit_method(name) for name in parse_credit_methods(spec)]
    values = stack_hyperparameters(stack, hyperparameters)
    batch = CreditBatch.from_sequence_advantages(
        advantages_B, mask_BT, statistics=statistics, vocab_size=vocab_size, step=step, clip_range=clip_range
    )
    drops_tokens = False
    with torch.no_grad():
        for method in stack:
            result = method(batch, values[method.name])
            drops_tokens |= result.loss_mask_BT is not None
            batch = batch.followed_by(result)
    return CreditResult(batch.advantages_BT, batch.loss_weights_BT if drops_tokens else None)


def _qualname(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def get_credit_method(name: str) -> CreditMethod:
    """The method registered as `name`; `"package.module:name"` imports the module first (it registers the method)."""
    if ":" in name:
        module_name, name = name.rsplit(":", 1)
        try:
            _import_user_module(module_name)
        except (ImportError, OSError) as error:
            raise ValueError(f"cannot import credit-method module {module_name!r}: {error}") from error
    if name not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {name!r}; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}")
    return CREDIT_METHODS[name]


def _import_user_module(module: str) -> None:
    """Import a dotted module name, or a `.py` file by path (e.g. `examples/custom_credit_method.py`).

    A dotted name that is not importable is also looked for in the current folder (`mymethods` ->
    `./mymethods.py`), as `python -m` would find it: console scripts do not put that folder on `sys.path`.
    """
    if not module.endswith(".py"):
        try:
            importlib.import_module(module)
            return
        except ModuleNotFoundError as error:
            local = Path.cwd() / (module.replace(".", "/") + ".py")
            if error.name != module.split(".")[0] or not local.is_file():
                raise
            module = str(local)
    path = Path(module).resolve()
    name = f"trl_credit_user_{path.stem}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise ImportError(f"no such file: {module}")
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])


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

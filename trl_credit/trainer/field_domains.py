"""The domain of each field of TRL's `GRPOConfig` (and transformers' `TrainingArguments`) that no library checks
before the model loads, checked when a `CreditGRPOConfig` is built.

A field's domain is read from its owner where the owner states it in code: the enum transformers converts the field
to (`optim`, `lr_scheduler_type`, the strategies, `debug`) and the `choices` of the field's metadata (`log_level`,
`ddp_backend`, ...), both checked by `check_declared_choices`. Where only the words of the field's `help` state it,
and no library refuses a value outside it before training runs, it is a row of `TRL_FIELD_CHECKS`, with why.
The values of TRL's enumerated string fields (`TRL_CHOICES`) and the settings a library can be asked about (the
optimizer, the sampling processors, vLLM, the reporting callbacks, the Hub) are `owner_checks.py`'s.
`tests/test_field_domains.py` reads the help of every field and fails for any whose help states a range or choices
that no check here or in `owner_checks.py` refuses, so a new TRL field is caught by the tests, not by a user.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import typing
from collections.abc import Callable
from typing import Any

from ..methods import SettingError


def is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A real number, not NaN or infinite (YAML and flags accept `nan` and `inf` as floats)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# Values handed to torch (the optimizer, gradient clipping) and to the logits processors, whose checks NaN passes.
FINITE_FIELDS = (
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
)

TRL_FIELD_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    # transformers reads max_steps <= 0 as "train for num_train_epochs" (-5) or trains one step at learning rate 0 (0).
    "max_steps": (
        lambda v: is_integer(v) and (v >= 1 or v == -1),
        "an integer >= 1, or -1 to train for num_train_epochs",
    ),
    "num_train_epochs": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),  # NaN epochs: no step, no error
    # Sizes TRL divides by or builds its batches from; 0 fails only in the first step, after the model has loaded.
    "per_device_train_batch_size": (lambda v: is_integer(v) and v >= 1, "an integer >= 1"),
    "gradient_accumulation_steps": (lambda v: is_integer(v) and v >= 1, "an integer >= 1"),
    # TRL divides by it before its own check (`num_generations >= 2`), so a 0 or a None from YAML fails unexplained.
    "num_generations": (
        lambda v: v is None or (is_integer(v) and v >= 2),
        "an integer >= 2 (GRPO normalises within groups)",
    ),
    "max_completion_length": (lambda v: is_integer(v) and v >= 1, "an integer >= 1"),  # 0 generates nothing
    "num_iterations": (lambda v: is_integer(v) and v >= 1, "an integer >= 1"),  # 0: no optimiser step, no error
    # transformers seeds numpy, whose seeds are 32-bit, in `set_seed`, which TRL calls after the model has loaded.
    "seed": (lambda v: is_integer(v) and 0 <= v < 2**32, "an integer in [0, 2**32 - 1]"),
    # TRL's loss reads these as they are: a negative KL weight or clip range trains, away from the reference.
    "beta": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "epsilon": (lambda v: _finite(v) and v > 0, "a finite number > 0"),
    "epsilon_high": (lambda v: v is None or (_finite(v) and v > 0), "a finite number > 0, or unset"),
    # TRL clamps the ratio at delta: below 1 the on-policy ratio (1) is clamped, and every positive-advantage token
    # loses its gradient. TRL's help recommends delta > 1 + epsilon.
    "delta": (
        lambda v: v is None or (_finite(v) and v > 1),
        "a finite number > 1 (TRL recommends > 1 + epsilon), or unset",
    ),
    # TRL's help: [0, 1]. Above 1 trains as 1; below 0 torch's quantile fails inside the first step.
    "top_entropy_quantile": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    # TRL's help: a positive value. Below 0 every negative-advantage sequence is masked out, whatever its KL.
    "off_policy_mask_threshold": (lambda v: v is None or (_finite(v) and v > 0), "a finite number > 0, or unset"),
    # TRL's help: (0, 1]. transformers' top-p processor takes 0 (greedy: a group of identical completions, advantage
    # 0); above 1 and non-finite values are left to the processor's own check, and vLLM's.
    "top_p": (lambda v: not _finite(v) or v > 0, "a number in (0, 1] (0 samples greedily: every completion alike)"),
    # transformers clips only when max_grad_norm > 0: a negative value silently turns clipping off.
    "max_grad_norm": (lambda v: v is None or (_finite(v) and v >= 0), "a finite number >= 0 (0 turns clipping off)"),
    # transformers reads a step count below 1 as a fraction of the run: -1 saves (logs) at every step, and a negative
    # logging_steps labels the token-credit records of the unlogged steps with the wrong step.
    "save_steps": (
        lambda v: _finite(v) and v > 0,
        "a number > 0 (an integer number of steps, or below 1 a fraction of the run)",
    ),
    "logging_steps": (
        lambda v: _finite(v) and v > 0,
        "a number > 0 (an integer number of steps, or below 1 a fraction of the run)",
    ),
    "eval_steps": (
        lambda v: v is None or (_finite(v) and v > 0),
        "a number > 0 (an integer number of steps, or below 1 a fraction of the run), or unset",
    ),
    # transformers' help: one of all, non_padding, no, or a boolean; another string counts nothing, silently.
    "include_num_input_tokens_seen": (
        lambda v: isinstance(v, bool) or v in ("all", "non_padding", "no"),
        "one of all, non_padding, no, or true/false",
    ),
    # transformers' help: options 'inputs' and 'loss'; another name is silently ignored.
    "include_for_metrics": (
        lambda v: isinstance(v, (list, tuple)) and all(name in ("inputs", "loss") for name in v),
        "a list of 'inputs' and 'loss'",
    ),
    # TRL checks only the number of weights, not the weights.
    "reward_weights": (
        lambda v: v is None or (isinstance(v, (list, tuple)) and all(_finite(w) for w in v)),
        "a list of finite numbers, one per reward function, or unset",
    ),
}
"""The fields of TRL's `GRPOConfig` and transformers' `TrainingArguments` that no library checks (or checks only after
the model has loaded), each with the values it allows and, in a comment, why it is here, `{field: (allowed, allowed
values in words)}`. What depends on more than the config (the number of reward functions against `reward_weights`,
the model's context against `max_completion_length`) is checked by `trl-credit grpo`, which knows both."""


def check_trl_fields(args) -> None:
    """Refuse values of TRL's own fields that no library checks before training runs, or that transformers silently
    reinterprets (`max_steps=-5` trains for `num_train_epochs`): the declared choices, each field of
    `TRL_FIELD_CHECKS`, the numbers torch and the sampling code would take (finite), then what two fields decide
    together. Runs before TRL's `__post_init__` reads them; `SettingError` names the field."""
    check_declared_choices(args)
    for name, (allowed, words) in TRL_FIELD_CHECKS.items():
        if not allowed(getattr(args, name)):
            raise SettingError(name, f"must be {words}, got {getattr(args, name)!r}")
    check_finite(args)
    if args.max_steps == -1 and not args.num_train_epochs > 0:
        raise SettingError("num_train_epochs", f"must be > 0 when max_steps is -1, got {args.num_train_epochs!r}")
    length = args.vllm_max_model_length  # TRL's help: at least the longest prompt plus max_completion_length
    if length is not None and not (is_integer(length) and length > args.max_completion_length):
        raise SettingError(
            "vllm_max_model_length",
            f"must be an integer > max_completion_length {args.max_completion_length} (it holds the prompt and the "
            f"completion), or unset, got {length!r}",
            mentions=("max_completion_length",),
        )


def check_declared_choices(args) -> None:
    """The fields whose values transformers declares: an enum it converts the field to (`IntervalStrategy`,
    `OptimizerNames`, ...), which it refuses without naming the field, or the `choices` of the field's metadata, which
    only its command-line parser enforces."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        choices = field.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            raise SettingError(field.name, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        kind = _enum_of(field.type)
        if kind is None or value is None:
            continue
        values = value.split() if isinstance(value, str) and _lists(field.type) else value
        for item in values if isinstance(values, (list, tuple)) else [values]:
            try:
                kind(item)
            except ValueError:
                allowed = ", ".join(str(member.value) for member in kind)
                raise SettingError(
                    field.name, f"must be one of {allowed} (transformers' {kind.__name__}), got {value!r}"
                ) from None


def check_finite(args) -> None:
    """`FINITE_FIELDS` hold finite numbers (`SettingError` naming the first that does not)."""
    for name in FINITE_FIELDS:
        value = getattr(args, name)
        if value is None and name in ("min_p", "max_grad_norm"):  # unset: no min-p filtering, no clipping
            continue
        if not _finite(value):
            raise SettingError(name, f"must be a finite number, got {value!r}")


def _enum_of(annotation) -> type[enum.Enum] | None:
    """The enum an annotation names (`IntervalStrategy | str`, `str | list[DebugOption]`), else None (a string
    annotation is one of trl-credit's own fields, which name none)."""
    for argument in typing.get_args(annotation) or (annotation,):
        if isinstance(argument, type) and issubclass(argument, enum.Enum):
            return argument
        if typing.get_args(argument) and (found := _enum_of(argument)) is not None:
            return found
    return None


def _lists(annotation) -> bool:
    """Whether the annotation is or admits a list (`str | list[DebugOption]`, or `list[DebugOption]` once transformers'
    parser has narrowed the union in place): a string value is then split on spaces, as transformers does."""
    return list in (typing.get_origin(annotation), *map(typing.get_origin, typing.get_args(annotation)))

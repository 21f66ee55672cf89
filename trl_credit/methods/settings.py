"""A method's hyperparameters as settings: their declaration ([`hyperparameter`]), [`SettingError`], the checks an
arguments dataclass runs in its `__post_init__` ([`check_fields`]), and the conversion of values that no argument parser has read.

Flags and YAML keys reach a method's arguments dataclass through TRL's parser, which converts them to the declared
types. `credit_kwargs` from Python or JSON does not pass a parser: [`resolve_settings`] converts what JSON and YAML
cannot spell exactly (`"5e-2"`, an int where a float is declared) and refuses anything else of the wrong type.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

# A check of one hyperparameter: a predicate and the allowed values in words ("in (0, 1]").
Check = tuple[Callable[[Any], bool], str]


def hyperparameter(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A field of a method's arguments dataclass: its default, its `--help` text and, for a string, its `choices`, in
    the field metadata that TRL's parser and the docs tables read. A list default is copied for each instance."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": list(choices)}
    if isinstance(default, list):
        return dataclasses.field(default_factory=default.copy, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class SettingError(ValueError):
    """A setting (a method hyperparameter, a run size) that is unknown, of the wrong type or out of range; `name` and
    `problem` apart, so that a front end can say where the value came from (`--taco_alpha`, a YAML key). `mentions`
    are the other settings the problem names, as plain field names, for the front end to name the same way."""

    def __init__(self, name: str, problem: str, mentions: tuple[str, ...] = ()):
        super().__init__(f"{name} {problem}")
        self.name, self.problem, self.mentions = name, problem, mentions


def check_fields(arguments: Any, **checks: Check) -> None:
    """Raise [`SettingError`] naming the first field of the dataclass instance `arguments` that fails its check."""
    for name, (ok, allowed) in checks.items():
        value = getattr(arguments, name)
        try:
            fine = ok(value)
        except (TypeError, ValueError):
            fine = False
        if not fine:
            raise SettingError(name, f"must be {allowed}, got {value!r}")


def in_range(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Check:
    """A check for a number in an interval; the words spell the interval out."""

    def ok(value) -> bool:
        return (value > low if low_open else value >= low) and (value < high if high_open else value <= high)

    return ok, f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


FINITE_NON_NEGATIVE: Check = (lambda value: 0.0 <= value < math.inf, "finite and >= 0")
FINITE_POSITIVE: Check = (lambda value: 0.0 < value < math.inf, "finite and > 0")

_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def coerce_value(name: str, value: Any, declared: Any) -> Any:
    """`value` as the declared type (bool, int, float, str, a Literal, an optional or a list of these), or
    [`SettingError`]. Numeric strings become numbers and `"true"`/`"false"` booleans; nothing else is guessed."""
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in arguments if a is not type(None)]
        return None if value is None else coerce_value(name, value, inner)
    if origin is Literal:
        if value not in arguments:
            raise SettingError(name, f"must be one of {list(arguments)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise SettingError(name, f"must be a list, got {value!r}")
        return [coerce_value(name, item, arguments[0]) for item in value]
    if declared is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if declared in (int, float) and not isinstance(value, bool):
        try:
            number = float(value) if isinstance(value, str | int | float) else None
        except ValueError:
            number = None
        if number is not None and (declared is float or number.is_integer()):
            return declared(number)
    if isinstance(value, declared) and not (declared is not bool and isinstance(value, bool)):
        return value
    raise SettingError(name, f"must be {_WORDS[declared]}, got {value!r}")


def supported_type(declared: Any) -> bool:
    """Whether [`coerce_value`] and TRL's parser both handle `declared`."""
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in arguments if a is not type(None)]
        return len(inner) == 1 and supported_type(inner[0])
    if origin is list:
        return len(arguments) == 1 and arguments[0] in _WORDS
    return origin is Literal or declared in _WORDS


def resolve_settings(arguments: type | None, values: dict[str, Any]) -> dict[str, Any]:
    """Every field of the `arguments` dataclass: `values` (by field name) converted to the declared types, the rest
    their defaults; the dataclass's `__post_init__` checks them. Raises [`SettingError`] naming the first bad one."""
    if arguments is None:
        return {}
    declared_types = typing.get_type_hints(arguments)
    converted = {name: coerce_value(name, value, declared_types[name]) for name, value in values.items()}
    return dataclasses.asdict(arguments(**converted))

"""A method's hyperparameters as settings: conversion to the declared type, range checks, and [`SettingError`].

YAML, JSON, `credit_kwargs` and `--flags` all hand values to [`resolve_settings`], so that a value is converted and
checked once, by the checks its method registered, whatever front end it came from.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

# A check of one hyperparameter: a predicate and the allowed values in words ("in (0, 1]").
Check = tuple[Callable[[Any], bool], str]


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


def supported_type(declared: Any) -> bool:
    """Whether YAML, JSON and flags can be converted to `declared` (see [`coerce_value`])."""
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in arguments if a is not type(None)]
        return len(inner) == 1 and supported_type(inner[0])
    if origin in (list, tuple):
        return len(arguments) <= 1 and all(supported_type(a) for a in arguments)
    return origin is Literal or declared in SUPPORTED_TYPES


def resolve_settings(arguments: type | None, checks: Mapping[str, Check], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every field of the `arguments` dataclass: `values` (by field name) coerced to the declared types, the rest their
    defaults, each checked by its entry of `checks`. Raises [`SettingError`] naming the first bad value."""
    if arguments is None:
        return {}
    declared_types = typing.get_type_hints(arguments)
    coerced = {name: coerce_value(name, value, declared_types[name]) for name, value in values.items()}
    resolved = dataclasses.asdict(arguments(**coerced))
    for name, (ok, allowed) in checks.items():
        value = resolved[name]
        try:
            fine = ok(value)
        except (TypeError, ValueError):
            fine = False
        if not fine:
            raise SettingError(name, f"must be {allowed}, got {value!r}")
    return resolved


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def in_range(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Check:
    """A check for a number in an interval; the words spell the interval out."""

    def ok(value) -> bool:
        number = float(value)
        above = number > low if low_open else number >= low
        below = number < high if high_open else number <= high
        return above and below

    return ok, f"in {_interval(low, high, low_open, high_open)}"


# Checks for the common open-ended ranges.
FINITE_NON_NEGATIVE: Check = (lambda value: 0.0 <= value < math.inf, "finite and >= 0")
FINITE_POSITIVE: Check = (lambda value: 0.0 < value < math.inf, "finite and > 0")

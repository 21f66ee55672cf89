"""The parser of every `trl-credit` sub-command: an `HfArgumentParser` whose errors are one-line `UsageError`s.

`trl-credit eval`, `compare` and `lab` parse their config dataclass with `parse_config`; `inspect` and `plot` add their
own arguments; `grpo` builds its parser over TRL's config classes (`grpo_arguments.py`) and raises the same
`UsageError`. `run_command` (`trl_credit.cli`) reports any of them as `PROG: error: MESSAGE` with exit status 2.
"""

from __future__ import annotations

import itertools
import re
from importlib.resources import as_file
from importlib.resources.abc import Traversable

import yaml
from transformers import HfArgumentParser

from . import UsageError, one_line

# A negative number in any notation Python's `float` reads: argparse's own pattern knows only `-5` and `-0.5`, so
# `--learning_rate -1e-5` would read `-1e-5` as an option.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


def read_negative_numbers_as_values(parser) -> None:
    """Make `parser` (an `argparse.ArgumentParser`, none of whose options looks like a number) read every negative
    number after an option as that option's value."""
    parser._negative_number_matcher = NEGATIVE_NUMBER


def refuse_repeated_options(argv: list[str]) -> None:
    """Refuse an option given more than once: argparse keeps the last value and drops the others without a word
    (`--seeds 0 --seeds 1` would run seed 1 only)."""
    given: dict[str, list[str]] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--") or len(arg) == 2:
            continue
        name, equals, value = arg.partition("=")
        values = [value] if equals else list(itertools.takewhile(lambda a: not a.startswith("--"), argv[i + 1 :]))
        given.setdefault("--" + name[2:].replace("-", "_"), []).append(" ".join(values))
    for name, values in given.items():
        if len(values) > 1:
            raise UsageError(
                f"{name} is given {len(values)} times ({', '.join(values)}): give it once, with all its values"
            )


class CommandParser(HfArgumentParser):
    """`HfArgumentParser` over `dataclass_types` (none for a parser built with `add_argument`); abbreviations are off
    (`--seed` must not stand for `--seeds`) and argparse's errors raise `UsageError` instead of printing the usage."""

    def __init__(self, dataclass_types=(), *, prog: str, **kwargs):
        super().__init__(dataclass_types, prog=prog, allow_abbrev=False, **kwargs)
        read_negative_numbers_as_values(self)

    def error(self, message: str):
        raise UsageError(message)

    def parse_config(self, argv: list[str], *, passthrough: bool = False):
        """The dataclasses parsed from `argv`, and the unparsed strings when `passthrough` (else those are an error);
        an option given twice is an error.

        A dataclass that refuses its values (`ValueError` from `__post_init__`) is a `UsageError` too.
        """
        refuse_repeated_options(argv)
        try:
            *configs, remaining = self.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
        except ValueError as error:
            raise UsageError(one_line(error)) from error
        if remaining and not passthrough:
            raise UsageError(f"unrecognized arguments: {' '.join(remaining)}")
        return (*configs, remaining) if passthrough else tuple(configs)


def require_scipy() -> None:
    """Refuse to start a compare or lab run whose report would need SciPy when it is not installed."""
    from ..experiments.compare.stats import scipy_stats

    try:
        scipy_stats()
    except ImportError as error:
        raise UsageError(one_line(error)) from error


def read_recipe(value: str | None) -> tuple[Traversable, str, dict]:
    """The `--config` recipe `value` (a file or a packaged name; the packaged quick start when None), how to name it
    in a message, and the mapping it holds; `UsageError` naming the recipe, and where in it, otherwise."""
    from ..resources import QUICK_START, find_yaml, recipes

    try:
        recipe, shown = find_yaml("--config", QUICK_START if value is None else value, recipes())
    except ValueError as error:
        raise UsageError(str(error)) from None
    try:
        config = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
    except OSError as error:
        raise UsageError(f"cannot read --config {shown!r}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise UsageError(f"--config {shown!r} is not valid YAML: {yaml_error_words(error)}") from error
    if not isinstance(config, dict):
        raise UsageError(f"--config {shown!r} must hold a YAML mapping of argument names to values")
    return recipe, shown, config


def parse_with_recipe(parser, recipe: Traversable, argv: list[str]) -> tuple:
    """TRL's `TrlParser.parse_args_and_config(argv)`, with `argv`'s `--config` (the first, the one it reads; added when
    there is none) naming a file of `recipe` on disk, which that parser opens."""
    at = argv.index("--config") if "--config" in argv else None
    with as_file(recipe) as path:
        if at is None:
            return parser.parse_args_and_config(["--config", str(path), *argv])
        return parser.parse_args_and_config([*argv[: at + 1], str(path), *argv[at + 2 :]])


def yaml_error_words(error: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with the line and column (1-based) it points at, and a tab called a tab."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if "\\t" in problem or "\t" in problem:
        problem += " (a tab: YAML indents with spaces)"
    return where + problem

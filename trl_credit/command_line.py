"""What every command line of the tooling shares: the usage error, how an option is spelt and the `--config` recipe.

`trl-credit`'s sub-commands (`cli/`) raise `UsageError` for a bad command line and report it as one line with exit
status 2; `trl-credit compare` (`experiments/compare/`) plans `trl-credit grpo` runs from the same flags and recipe, so
it reads option names and recipes the way `grpo` does. Both import them from here, below them.
"""

from __future__ import annotations

from importlib.resources.abc import Traversable

import yaml

from .resources import QUICK_START, find_yaml, recipes


class UsageError(Exception):
    """A bad command line or config: reported as one line, exit status 2, before any model is loaded."""


def one_line(error: BaseException) -> str:
    """An error's message on one line, for `trl-credit <command>: error: ...` (its type where it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def option_name(arg: str) -> str:
    """The name an option is read by: `--taco-alpha=0.05` -> `taco_alpha` (argparse also accepts the dashes)."""
    return arg[2:].partition("=")[0].replace("-", "_")


def given_options(argv: list[str]) -> set[str]:
    """The names of the options on the command line (`--taco_alpha=0.05` -> `taco_alpha`)."""
    return {option_name(arg) for arg in argv if arg.startswith("--")}


def normalise_options(argv: list[str]) -> list[str]:
    """`--taco-alpha 0.05` -> `--taco_alpha 0.05` and `--config=x` -> `--config x`: `HfArgumentParser` accepts
    both spellings, and every later step looks an option up by its underscore name."""
    normalised = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, (_, equals, value) = option_name(arg), arg.partition("=")
            if name == "config" and equals:
                normalised += ["--config", value]
                continue
            arg = f"--{name}{equals}{value}"
        normalised.append(arg)
    return normalised


def read_recipe(value: str | None) -> tuple[Traversable, str, dict]:
    """The `--config` recipe `value` (a file or a packaged name; the packaged quick start when None), how to name it
    in a message, and the mapping it holds; `UsageError` naming the recipe, and where in it, otherwise."""
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


def yaml_error_words(error: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with the line and column (1-based) it points at, and a tab called a tab."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if "\\t" in problem or "\t" in problem:
        problem += " (a tab: YAML indents with spaces)"
    return where + problem

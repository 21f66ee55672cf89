"""The documentation's tables, generated from the code: the registered methods, the logged metrics and each
sub-command's options. It reads every layer of the package (docs/layout.md), so it sits in the top one.

    python -m trl_credit.cli.doc_tables          # rewrite the generated blocks of README.md and docs/*.md
    python -m trl_credit.cli.doc_tables --check  # exit 1, naming the files, if a block differs from the code

A generated block sits between `<!-- BEGIN generated:NAME -->` and `<!-- END generated:NAME -->`; the text around it
is written by hand. `tests/test_docs.py` fails when a block differs from what this module generates.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def documents(root: Path = REPOSITORY) -> list[str]:
    """The user documents: README.md and docs/*.md."""
    return ["README.md", *sorted(str(path.relative_to(root)) for path in (root / "docs").glob("*.md"))]


def _registered():
    """The package's methods (not the lab's oracle, nor those a user or a test registered), the default comparison's
    first."""
    from ..methods import CREDIT_METHODS, DEFAULT_COMPARISON

    order = {name: i for i, name in enumerate(DEFAULT_COMPARISON)}
    built_in = [m for m in CREDIT_METHODS.values() if m.function.__module__.startswith("trl_credit.methods.")]
    return sorted(built_in, key=lambda m: (order.get(m.name, len(order)), m.name))


def _cell(text: str) -> str:
    """Text for a Markdown table cell (a `|` would end the cell)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _paper_link(method) -> str:
    if not method.paper:
        return ""
    return f"[{method.paper['id']}](https://huggingface.co/papers/{method.paper['id']})"


def _statistics(method) -> str:
    statistics = method.statistics_for(method.hyperparameters())
    return ", ".join(f"`{name}`" for name in statistics)


def methods_table() -> str:
    """One row per registered method: name, paper, what it does, the statistics it reads (at its defaults)."""
    rows = [
        "| method | paper | what it does | reads | drops tokens |",
        "|---|---|---|---|---|",
    ]
    for method in _registered():
        rows.append(
            f"| `{method.name}` ({_cell(method.display_name)}) | {_paper_link(method)} | {_cell(method.summary)} | "
            f"{_statistics(method)} | {'yes' if method.drops_tokens else 'no'} |"
        )
    return "\n".join(rows)


def sign_readings_table() -> str:
    """What TRL's sign-reading options read after each registered method: its registration's `keeps_signs`."""
    rows = [
        "| method | keeps each token's sign | what `off_policy_mask_threshold`, `vespo` and `sapo` read after it |",
        "|---|---|---|",
    ]
    for method in _registered():
        if method.keeps_signs:
            reading = "the signs it was handed (alone: GRPO's `A_i` at every token that adds to the loss, as on GRPO)"
        else:
            reading = "each token's own sign, which can differ from the one it was handed: each option acts per token"
        rows.append(f"| `{method.name}` | {'yes' if method.keeps_signs else 'no'} | {reading} |")
    return "\n".join(rows)


def name_collisions() -> str:
    """One row per other paper whose method goes by a registered method's name (the registration's
    `not_to_be_confused_with`)."""
    rows = ["| name | registered here | not to be confused with |", "|---|---|---|"]
    for method in _registered():
        for other in method.not_to_be_confused_with:
            by = f"{other['by']}'s " if other["by"] else ""
            link = f"[{other['id']}](https://huggingface.co/papers/{other['id']})"
            rows.append(
                f"| `{method.name}` | {method.display_name}, {_cell(method.paper['title'])} ({_paper_link(method)}) | "
                f"{by}{other['name']}, {_cell(other['title'])} ({link}) |"
            )
    return "\n".join(rows)


def hyperparameters_table() -> str:
    """Every method's hyperparameters with their defaults and help, as `--flags` of `trl-credit grpo`."""
    rows = ["| method | option | default | meaning |", "|---|---|---|---|"]
    for method in _registered():
        defaults = method.hyperparameters()
        for f in method.argument_fields():
            rows.append(f"| `{method.name}` | `--{f.name}` | `{defaults[f.name]!r}` | {_cell(f.metadata['help'])} |")
    return "\n".join(rows)


def metrics_list() -> str:
    """Every metric trl-credit logs: the trainer's own, those of every method, and each method's diagnostics."""
    from ..methods import COMMON_DIAGNOSTICS
    from ..rewards import RewardStats
    from ..trainer.diagnostics import TRAINER_METRICS

    lines = ["| metric | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in TRAINER_METRICS.items()]
    lines += [f"| `rewards/{key}` | {_cell(meaning)} |" for key, meaning in RewardStats.MEANINGS.items()]
    lines += [f"| `METHOD/{name}` | {_cell(meaning)} |" for name, meaning in COMMON_DIAGNOSTICS.items()]
    for method in _registered():
        lines += [f"| `{method.name}/{name}` | {_cell(meaning)} |" for name, meaning in method.diagnostics.items()]
    return "\n".join(lines)


def token_statistics_table() -> str:
    """The per-token statistic each method shows in the token-credit view."""
    rows = ["| method | statistic in the token view | meaning |", "|---|---|---|"]
    for method in _registered():
        name, meaning = method.token_statistic
        rows.append(f"| `{method.name}` | `{name}` | {_cell(meaning)} |")
    return "\n".join(rows)


def _bibtex(methods) -> str:
    seen, entries = set(), []
    for method in methods:
        if method.paper and method.paper["id"] not in seen:
            seen.add(method.paper["id"])
            entries.append(method.paper["citation"])
    return "```bibtex\n" + "\n\n".join(entries) + "\n```"


def _in_default_comparison(method) -> bool:
    from ..methods import DEFAULT_COMPARISON

    return method.name in DEFAULT_COMPARISON


def _options_table(rows) -> str:
    lines = ["| option | default | meaning |", "|---|---|---|"]
    lines += [f"| `{option}` | {_default(default)} | {_cell(meaning)} |" for option, default, meaning in rows]
    return "\n".join(lines)


def _default(value) -> str:
    import dataclasses

    return "required" if value is dataclasses.MISSING else f"`{value!r}`"


def _dataclass_options(cls, inherited_from=None):
    """`(--name, default, help)` of a dataclass's fields, without those of `inherited_from`."""
    import dataclasses

    skip = {f.name for f in dataclasses.fields(inherited_from)} if inherited_from else set()
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        yield f"--{f.name}", default, f.metadata.get("help", "")


def _argparse_options(parser):
    for action in parser._actions:
        if action.help == "==SUPPRESS==" or "-h" in action.option_strings:
            continue
        name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
        yield name, action.default, action.help or ""


def cli_options(command: str) -> str:
    """The options of `trl-credit COMMAND`; for `grpo`, those trl-credit adds to TRL's `GRPOConfig` and
    `ModelConfig` (which `trl-credit grpo --help` lists in full)."""
    if command == "grpo":
        from trl import GRPOConfig

        from ..trainer import CreditGRPOConfig
        from .grpo_arguments import CreditScriptArguments

        rows = [*_dataclass_options(CreditScriptArguments), *_dataclass_options(CreditGRPOConfig, GRPOConfig)]
    elif command == "eval":
        from ..experiments.evaluation import EvalConfig

        rows = _dataclass_options(EvalConfig)
    elif command == "compare":
        from ..experiments.compare.plan import CompareConfig

        rows = _dataclass_options(CompareConfig)
    elif command == "lab":
        from ..experiments.lab.lab_config import LabConfig

        rows = _dataclass_options(LabConfig)
    else:
        import importlib

        rows = _argparse_options(importlib.import_module(f"trl_credit.cli.{command}").build_parser())
    return _options_table(rows)


def extending_example() -> str:
    """The method of `examples/custom_credit_method.py`, from its imports to the end of its function."""
    source = (REPOSITORY / "examples" / "custom_credit_method.py").read_text()
    start, end = source.index("from dataclasses"), source.index("\n\n\ndef main(")
    return f"```python\n{source[start:end].strip()}\n```"


def citations() -> str:
    """The BibTeX entries of the papers of the default comparison's methods (TACO, EAPO, TIDE)."""
    return _bibtex(m for m in _registered() if _in_default_comparison(m))


def baseline_citations() -> str:
    """The BibTeX entries of the other registered methods' papers."""
    return _bibtex(m for m in _registered() if not _in_default_comparison(m))


GENERATORS: dict[str, Callable[[], str]] = {
    **{
        f"{command}_options": functools.partial(cli_options, command)
        for command in ("grpo", "eval", "inspect", "plot", "compare", "lab")
    },
    "citations": citations,
    "extending_example": extending_example,
    "baseline_citations": baseline_citations,
    "methods_table": methods_table,
    "sign_readings": sign_readings_table,
    "name_collisions": name_collisions,
    "hyperparameters": hyperparameters_table,
    "metrics": metrics_list,
    "token_statistics": token_statistics_table,
}
_BLOCK = re.compile(r"(<!-- BEGIN generated:(\w+) -->\n)(.*?)(<!-- END generated:\2 -->)", re.DOTALL)


def render(text: str) -> str:
    """`text` with every generated block replaced by what its generator gives now."""

    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated block {name!r}; known: {sorted(GENERATORS)}")
        return f"{match.group(1)}{GENERATORS[name]()}\n{match.group(4)}"

    return _BLOCK.sub(replace, text)


def stale_documents(root: Path = REPOSITORY) -> list[str]:
    """The documents whose generated blocks differ from the code."""
    return [name for name in documents(root) if (root / name).read_text() != render((root / name).read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_credit.cli.doc_tables", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale documents (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = stale_documents()
    if args.check:
        if stale:
            print(f"stale generated blocks in {', '.join(stale)}: run python -m trl_credit.cli.doc_tables")
        return 1 if stale else 0
    for name in stale:
        path = REPOSITORY / name
        path.write_text(render(path.read_text()))
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

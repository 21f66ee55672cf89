"""`trl-credit` console script: a thin dispatcher over sub-command modules.

Each sub-command lives in `trl_credit/cli/<name>.py` and exposes `main(argv) -> int` (the command line of `grpo`,
which `compare` shares, is `grpo_arguments.py`); modules are imported lazily so that `trl-credit --help` answers
without importing torch or TRL.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "grpo": "Train with GRPO and a token-level credit method (mirrors `trl grpo`).",
    "eval": "Evaluate a model on a math data set: avg@k, pass@k, mean completion length.",
    "inspect": "Render the token-credit view of a run as an HTML page (and PNG).",
    "plot": "Plot reward, entropy, length and method diagnostics of one or more runs.",
    "compare": "Train methods x seeds, evaluate them, and write a report with confidence intervals.",
    "lab": "Measure where each method puts credit on procedural tasks with known decisive tokens.",
}


def one_line(error: BaseException) -> str:
    """An error's message on one line, for `trl-credit <command>: error: ...` (its type where it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def _usage() -> str:
    lines = ["usage: trl-credit <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, text in SUBCOMMANDS.items()]
    lines += ["", "Run `trl-credit <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"trl-credit: unknown command {command!r}; choose from {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"trl_credit.cli.{command}")
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())

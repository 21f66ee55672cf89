"""`trl-credit` console script: a table of sub-commands, each a module `trl_credit/cli/<name>.py` with
`main(argv) -> int`.

Every sub-command has the same shape: its options are parsed by an `HfArgumentParser` (`parsing.CommandParser` over
its config dataclass or its own arguments; `grpo`: TRL's `TrlParser`, `grpo_arguments.py`), a bad command line is a
`UsageError`, and it is reported as `trl-credit <command>: error: <one line>` on stderr with exit status 2
(`run_command`). Modules are imported lazily, so that
`trl-credit --help` answers without importing torch, transformers or TRL.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from contextlib import contextmanager

from ..command_line import UsageError, one_line

SUBCOMMANDS = {
    "grpo": "Train with GRPO and a token-level credit method (mirrors `trl grpo`).",
    "eval": "Evaluate a model on a math data set: avg@k, pass@k, mean completion length.",
    "inspect": "Render the token-credit view of a run as an HTML page (and PNG).",
    "plot": "Plot reward, entropy, length and method diagnostics of one or more runs.",
    "compare": "Train methods x seeds, evaluate them, and write a report with confidence intervals.",
    "lab": "Measure where each method puts credit on procedural tasks with known decisive tokens.",
}


@contextmanager
def owned_folder(output_dir: str):
    """Hold the lock of the run folder `output_dir` inside the block (`trl_credit.trainer.run_folder`): a folder that
    another process holds is a `UsageError` naming that process."""
    from ..trainer.run_folder import RunFolderBusy, run_folder_lock

    try:
        with run_folder_lock(output_dir):
            yield
    except RunFolderBusy as error:  # taken by another process (this one's own lock is re-entrant)
        raise UsageError(f"--output_dir {error}") from None


def run_command(prog: str, command: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a sub-command: a `UsageError` becomes one line on stderr and status 2; `--help` returns argparse's 0."""
    try:
        return command(argv)
    except UsageError as error:
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # argparse's --help (after printing it)
        return int(exit_.code or 0)


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
    return importlib.import_module(f"trl_credit.cli.{command}").main(rest)


if __name__ == "__main__":
    sys.exit(main())

"""`trl-credit plot RUN_DIR [--compare RUN_B ...]`: training curves of one or more runs as PNGs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import run_command
from .outputs import check_plot_folder

PROG = "trl-credit plot"


def build_parser() -> argparse.ArgumentParser:
    from .parsing import CommandParser

    parser = CommandParser(
        prog=PROG,
        description=(
            "Plot reward, entropy, completion length and each credit method's diagnostics against the step, "
            "from trainer_state.json (the run folder's or its latest checkpoint-*'s)."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="training output directory")
    parser.add_argument("--compare", nargs="+", default=[], metavar="RUN", help="more runs to overlay")
    parser.add_argument(
        "--output",
        default=None,
        help="folder for the PNGs (default: RUN_DIR/plots, the plots of RUN_DIR's card: with --compare, give one)",
    )
    return parser


def main(argv: list[str]) -> int:
    return run_command(PROG, _plot, argv)


def _plot(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from trl_credit.reports import plots

    try:
        runs = [plots.load_run(run_dir) for run_dir in [args.run_dir, *args.compare]]
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    output_dir = Path(args.output) if args.output else Path(args.run_dir) / plots.PLOTS_DIRNAME
    check_plot_folder(output_dir, [args.run_dir, *args.compare])
    written = plots.plot_runs(runs, output_dir)
    if not written:
        print(f"{PROG}: no plottable metrics in the runs' log history", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

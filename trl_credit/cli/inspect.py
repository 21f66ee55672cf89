"""`trl-credit inspect RUN_DIR`: the token-credit view of a run as an offline HTML page (and a PNG).

By default the view keeps the completions whose credit the method changed (a token weight other than 1) and says how
many it leaves out; a method that changes few completions (TACO touches rare tail tokens) would otherwise show a
page of white tokens. Steps are TRL's optimizer steps, as in `trainer_state.json`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import UsageError, run_command
from .outputs import check_output_file

PROG = "trl-credit inspect"
PNG_COMPLETIONS = 4  # completions in the PNG unless --png-completions says otherwise


def _step(value: str) -> int | str:
    if value == "last":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer step or 'last', got {value!r}") from None


def _count(minimum: int, allowed: str):
    """An argparse type: an integer of at least `minimum`; `allowed` says which, in words, for the error."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value!r}")
        return number

    return parse


def build_parser() -> argparse.ArgumentParser:
    from .parsing import CommandParser

    parser = CommandParser(
        prog=PROG,
        description=(
            "Render RUN_DIR/token_credit.jsonl (written with log_token_credit=True) as a self-contained HTML "
            "page: each token coloured by its weight Â/A, hover for log-prob, entropy and method statistic."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="training output directory (or a token_credit.jsonl file)")
    parser.add_argument(
        "--step",
        type=_step,
        default=None,
        help="only this training step (as numbered in trainer_state.json, or 'last')",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="show every recorded completion (default: those where the method changed some token's credit)",
    )
    parser.add_argument(
        "--max-completions",
        type=_count(0, "an integer >= 0 (0 shows them all)"),
        default=64,
        help="show at most this many completions (default: 64; 0 = all)",
    )
    parser.add_argument("--output", default=None, help="HTML path (default: RUN_DIR/token_credit.html)")
    parser.add_argument(
        "--png",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also write a PNG of the first completions (default path: next to the HTML page, .png)",
    )
    parser.add_argument(
        "--png-completions",
        type=_count(1, "an integer >= 1"),
        default=None,
        help=f"completions in the PNG, with --png (default: {PNG_COMPLETIONS})",
    )
    return parser


def _completions_to_show(records: list[dict], *, show_all: bool) -> tuple[list[dict], str]:
    """The records to draw, and a sentence saying which ones they are."""
    from trl_credit.reports.token_view import credit_changed

    if show_all:
        return records, f"showing all {len(records)} completions"
    changed = [record for record in records if credit_changed(record)]
    if not changed:
        return records, f"credit changed in none of the {len(records)} completions (every weight is 1); showing all"
    return changed, (
        f"showing {len(changed)} of {len(records)} completions where credit changed; --all shows every one"
    )


def main(argv: list[str]) -> int:
    return run_command(PROG, _inspect, argv)


def _inspect(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.png_completions is not None and args.png is None:
        raise UsageError("--png-completions sets the PNG's size; add --png to write one")
    from trl_credit.reports import token_view

    try:
        records = token_view.read_token_credit(args.run_dir)
    except (FileNotFoundError, token_view.TokenCreditError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    at_step = token_view.select_records(records, step=args.step)
    if not at_step:
        where = "" if args.step is None else f" at step {args.step}"
        recorded = token_view.format_steps(record["step"] for record in records)
        print(f"{PROG}: no completions recorded{where}; recorded steps: {recorded}", file=sys.stderr)
        return 2
    selected, note = _completions_to_show(at_step, show_all=args.all)
    if args.max_completions and len(selected) > args.max_completions:
        selected = selected[: args.max_completions]
        note = f"{note} (the first {args.max_completions} here; --max-completions 0 shows them all)"

    source = token_view.find_token_credit_file(args.run_dir)
    html_path = Path(args.output) if args.output else source.with_suffix(".html")
    check_output_file(html_path, [source], "an HTML page", (".html", ".htm"), "--output")
    png_path = None if args.png is None else Path(args.png) if args.png else html_path.with_suffix(".png")
    if png_path is not None:
        check_output_file(png_path, [source, html_path], "a PNG image", (".png",), "--png")
    token_view.write_token_credit_html(selected, html_path, title=f"Token credit: {source.parent.name}", note=note)
    print(note)
    print(f"wrote {html_path} ({len(selected)} completions)")
    if png_path is not None:
        token_view.render_token_credit_png(selected[: args.png_completions or PNG_COMPLETIONS], png_path)
        print(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

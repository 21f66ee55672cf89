"""`trl-credit inspect RUN_DIR`: the token-credit view of a run as an offline HTML page (and a PNG)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _step(value: str) -> int | str:
    if value == "last":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer step or 'last', got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-credit inspect",
        description=(
            "Render RUN_DIR/token_credit.jsonl (written with log_token_credit=True) as a self-contained HTML "
            "page: each token coloured by its weight Â/A, hover for log-prob, entropy and method statistic."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="training output directory (or a token_credit.jsonl file)")
    parser.add_argument("--step", type=_step, default=None, help="only this training step (an integer or 'last')")
    parser.add_argument(
        "--max-completions", type=int, default=64, help="show at most this many completions (default: 64; 0 = all)"
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
    parser.add_argument("--png-completions", type=int, default=4, help="completions in the PNG (default: 4)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from trl_credit import viz

    try:
        records = viz.read_token_credit(args.run_dir)
    except (FileNotFoundError, viz.TokenCreditError) as error:
        print(f"trl-credit inspect: {error}", file=sys.stderr)
        return 2
    selected = viz.select_records(records, step=args.step, max_completions=args.max_completions or None)
    if not selected:
        print(f"trl-credit inspect: no completions recorded at step {args.step}", file=sys.stderr)
        return 2

    source = viz.find_token_credit_file(args.run_dir)
    html_path = Path(args.output) if args.output else source.with_suffix(".html")
    viz.write_token_credit_html(selected, html_path, title=f"Token credit: {source.parent.name}")
    print(f"wrote {html_path} ({len(selected)} completions)")
    if args.png is not None:
        png_path = Path(args.png) if args.png else html_path.with_suffix(".png")
        viz.render_token_credit_png(selected[: args.png_completions], png_path)
        print(f"wrote {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

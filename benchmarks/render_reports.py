"""Every report page rendered from the committed results (`results/`), byte for byte.

    python benchmarks/render_reports.py                  # rewrite the pages under docs/
    python benchmarks/render_reports.py --output DIR     # write them under DIR instead (same relative paths)

The pages: each stored `trl-credit lab` folder's `report.md` (results/lab.jsonl, lab_evidence.jsonl,
lab_regimes.jsonl), the two aggregates `docs/lab_evidence/report.md` and `docs/lab_regimes/report.md`, and each
`benchmarks/eapo_resample.py` run's page (results/eapo_resample.jsonl). `tests/test_lab.py` renders them into a
temporary folder and compares with the committed pages.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402, F401  (the offline environment and the repository import path)
import _results  # noqa: E402

LAB_EXPERIMENTS = ("lab", "lab_evidence", "lab_regimes")


def render_all() -> dict[str, str]:
    """`{page path relative to the repository: its text}` for every page rendered from results/."""
    import eapo_resample
    import lab_evidence
    import lab_regimes

    pages = {}
    for experiment in LAB_EXPERIMENTS:
        for row in _results.read_lines(experiment):
            pages[row["page"]] = _results.render_lab_page(row)
    for module in (lab_evidence, lab_regimes):
        pages[str(module.OUTPUT.relative_to(_results.REPO_ROOT) / "report.md")] = module.aggregate()
    for row in _results.read_lines(eapo_resample.EXPERIMENT):
        pages[row["page"]] = eapo_resample.render_page(row)
    return pages


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=_results.REPO_ROOT, help="folder the page paths start from")
    args = parser.parse_args(argv)
    pages = render_all()
    for page, text in pages.items():
        path = args.output / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"render_reports: {len(pages)} pages written under {args.output}")


if __name__ == "__main__":
    main()

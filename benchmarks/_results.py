"""The committed experiment results: `results/<experiment>.jsonl`, one JSON object a line.

A lab line is one `trl-credit lab` output folder: `page` (the report page it renders, under docs/), `command`, and
`settings` and `runs` as that folder's `results.json` holds them. `results/lab_oracle.jsonl` holds one trace file a
line (`file`, and `json` or `text`), `results/eapo_resample.jsonl` one `benchmarks/eapo_resample.py` run a line.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "results"


_READ: dict[str, tuple[int, list[dict]]] = {}  # experiment -> (file modification time, its lines)


def read_lines(experiment: str) -> list[dict]:
    """The lines of `results/<experiment>.jsonl` (read once while the file is unchanged; do not modify them)."""
    path = RESULTS / f"{experiment}.jsonl"
    if not path.is_file():
        return []
    modified = path.stat().st_mtime_ns
    if _READ.get(experiment, (None,))[0] != modified:
        _READ[experiment] = (modified, [json.loads(line) for line in path.read_text().splitlines()])
    return _READ[experiment][1]


def write_lines(experiment: str, rows: list[dict]) -> None:
    RESULTS.mkdir(exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)
    (RESULTS / f"{experiment}.jsonl").write_text(text)


def lab_folder(experiment: str, page: str) -> dict | None:
    """The stored lab folder whose report is `page` (a path relative to the repository), or `None`."""
    return next((row for row in read_lines(experiment) if row["page"] == page), None)


def lab_runs(experiment: str, page: str) -> list[dict]:
    row = lab_folder(experiment, page)
    return row["runs"] if row else []


def render_lab_page(row: dict) -> str:
    """The report page of a stored lab folder, as `trl-credit lab` writes it (its config read from its command)."""
    import shlex

    from trl_credit.cli.parsing import CommandParser
    from trl_credit.experiments.lab.lab_report import render_report, summarize
    from trl_credit.experiments.lab.lab_runs import LabConfig

    (config,) = CommandParser(LabConfig, prog="trl-credit lab").parse_config(shlex.split(row["command"])[2:])
    wanted = [
        r
        for r in row["runs"]
        if r["task"] in config.tasks and r["method"] in config.methods and r["seed"] in config.seeds
    ]
    return render_report(summarize(wanted, config), config, wanted, row["command"]) + "\n"


def run_stored_lab(experiment: str, page: str, argv: list[str]) -> int:
    """Run `trl-credit lab ARGV` in a scratch folder seeded with the stored runs of `page` (so that finished runs
    are not repeated), store its results in `results/<experiment>.jsonl` and render its report at `page`."""
    import shlex

    from trl_credit.cli import main as cli_main

    stored = lab_folder(experiment, page)
    with tempfile.TemporaryDirectory() as scratch:
        if stored:
            results = {"settings": stored["settings"], "runs": stored["runs"]}
            (Path(scratch) / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        status = cli_main(["lab", *argv, "--output_dir", scratch])
        if status:
            return status
        results = json.loads((Path(scratch) / "results.json").read_text())
    command = shlex.join(["trl-credit", "lab", *argv, "--output_dir", str(Path(page).parent)])
    row = {"page": page, "command": command, **results}
    rows = read_lines(experiment)
    at = next((i for i, old in enumerate(rows) if old["page"] == page), len(rows))
    write_lines(experiment, [*rows[:at], row, *rows[at + 1 :]])
    (REPO_ROOT / page).parent.mkdir(parents=True, exist_ok=True)
    (REPO_ROOT / page).write_text(render_lab_page(row))
    return 0

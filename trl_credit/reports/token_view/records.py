"""Token-credit records read back: the records of `{output_dir}/token_credit.jsonl` for the views.

The trainer writes the file (its schema: `trl_credit.trainer.token_credit_records`, re-exported here); this module
finds, reads, selects and formats its records. Importing it imports neither TRL nor torch, so `trl-credit inspect`
starts quickly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...trainer.token_credit_records import (  # noqa: F401
    RECORD_KEYS,
    TOKEN_CREDIT_FILENAME,
    TokenCreditError,
    append_token_credit,
    drop_token_credit_after,
    method_statistic_name,
    token_credit_record,
    token_credit_records_from_batch,
    validate_record,
)


def find_token_credit_file(run: str | Path) -> Path:
    """`run` itself if it is a file, else `run/token_credit.jsonl`; `FileNotFoundError` with a clear message."""
    run = Path(run)
    if run.is_file():
        return run
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    path = run / TOKEN_CREDIT_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: train with log_token_credit=True to record token credit")
    return path


def read_token_credit(run: str | Path) -> list[dict[str, Any]]:
    """Read and validate all records of a run directory (or of a `token_credit.jsonl` path)."""
    path = find_token_credit_file(run)
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(validate_record(json.loads(line)))
            except (json.JSONDecodeError, TokenCreditError) as error:
                raise TokenCreditError(f"{path}:{line_number}: {error}") from error
    return records


def select_records(
    records: Sequence[dict[str, Any]], *, step: int | str | None = None, max_completions: int | None = None
) -> list[dict[str, Any]]:
    """Keep the records of one step (an int, or `"last"`; `None` keeps all), then the first `max_completions`."""
    if step == "last":
        step = max((record["step"] for record in records), default=None)
    selected = [record for record in records if step is None or record["step"] == int(step)]
    return selected if max_completions is None else selected[:max_completions]


def credit_changed(record: dict[str, Any]) -> bool:
    """Whether the method gave any token of the completion a weight other than 1 (`Â_t != A`).

    Untouched tokens read exactly 1 (`token_credit_record` divides in float32), so the comparison is exact.
    """
    return any(weight is not None and weight != 1.0 for weight in record["weights"])


def format_steps(steps: Iterable[int]) -> str:
    """Steps as sorted, comma-separated runs: `1-3, 5, 10-12` (`none` when empty)."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in runs) or "none"


def format_value(value: float | None, spec: str = ".3f") -> str:
    """A number for display in `spec` format; `n/a` for a missing value."""
    return "n/a" if value is None else format(value, spec)


def completion_header(record: dict[str, Any]) -> str:
    """One line naming a completion: its step, method, reward and advantage."""
    return (
        f"step {record['step']} · {record['method']} · reward {format_value(record['reward'])}"
        f" · advantage {format_value(record['advantage'], '+.3f')}"
    )

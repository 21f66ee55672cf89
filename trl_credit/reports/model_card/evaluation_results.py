"""The `trl-credit eval` results of a run in its card: the summaries found in its folder, the card's evaluation table,
and the same numbers as `model-index` metadata (huggingface_hub's `EvalResult`s), which the Hub renders.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult

EVAL_TASK_TYPE = "text-generation"
SAMPLING_SETTINGS = ("temperature", "top_p", "max_new_tokens")  # recorded with each metric of the model-index


def load_eval_summaries(output_dir: str | Path) -> list[dict[str, Any]]:
    """The `trl-credit eval` summaries saved in `output_dir` (`eval*.json` holding avg@ or pass@ metrics)."""
    summaries = []
    for path in sorted(Path(output_dir).glob("eval*.json")):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # not an eval summary: the card simply has no row for it
        if isinstance(summary, dict) and eval_metrics(summary):
            summaries.append(summary)
    return summaries


_METRIC_KEY = re.compile(r"(avg|pass)@(\d+|n)")


def eval_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The avg@/pass@ numbers of one evaluation summary, as `{"avg@4": ..., "pass@1": ...}`, avg@ first, then by k.

    Reads the flat keys `trl-credit eval` writes (`avg@4`, `pass@1`, ...) and the nested form
    `{"avg@k": {k: value}, "pass@k": {k: value}}`; `avg@n` is the accuracy averaged over the `n` samples per problem.
    """
    metrics = {
        key: float(value)
        for key, value in summary.items()
        if _METRIC_KEY.fullmatch(key) and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    for kind in ("avg", "pass"):
        for k, value in (summary.get(f"{kind}@k") or {}).items():
            metrics[f"{kind}@{k}"] = float(value)

    def order(key: str) -> tuple:
        kind, k = key.split("@")
        return (kind != "avg", int(k) if k.isdigit() else float("inf"))

    return {key: metrics[key] for key in sorted(metrics, key=order)}


def dataset_reference(name: str) -> tuple[str, str, str | None]:
    """`(name shown, Hub type, Hub config)` of an evaluation data set; a local file is named by its file name only."""
    from ...data import SOURCES, hub_dataset_id

    spec, hub_id = SOURCES.get(name), hub_dataset_id(name)
    if spec is not None:
        return name, hub_id or name, spec.hub_config if spec.kind == "hub" else None
    if hub_id is not None:
        return hub_id, hub_id, None
    label = Path(name).name or name  # no local path in a card meant for the Hub
    return label, label, None


def eval_table(summaries: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the evaluation table, one row per summary (see `eval_metrics` for the metrics read).

    `dataset`, `split`, `num_problems`, `n` (samples per problem) and `mean_completion_length` are shown when
    present; the split and problem columns only when some summary has them.
    """
    metrics = [eval_metrics(s) for s in summaries]
    names = list(eval_metrics({key: 0.0 for m in metrics for key in m}))  # every metric, in eval_metrics' order
    has_split = any(s.get("split") for s in summaries)
    has_problems = any("num_problems" in s for s in summaries)
    columns = [
        "Dataset",
        *(["Split"] if has_split else []),
        *(["Problems"] if has_problems else []),
        "n",
        *names,
        "Mean completion length",
    ]

    def cell(value) -> str:
        if value is None:
            return "–"
        return f"{value:.4g}" if isinstance(value, float) else str(value).replace("|", "\\|")

    rows = []
    for s, values in zip(summaries, metrics):
        dataset = dataset_reference(str(s["dataset"]))[0] if s.get("dataset") else None
        row = [
            dataset,
            *([s.get("split")] if has_split else []),
            *([s.get("num_problems")] if has_problems else []),
            s.get("n"),
            *(values.get(name) for name in names),
            s.get("mean_completion_length"),
        ]
        rows.append([cell(value) for value in row])
    return columns, rows


def eval_results(summaries: Sequence[Mapping[str, Any]]) -> list[EvalResult]:
    """The summaries as huggingface_hub `EvalResult`s (`model-index` metadata): one per summary and metric.

    Task `text-generation`; the data set's Hub id as its type when it has one (its name otherwise), its split;
    the metric (`avg@4`, `pass@1`, ...) as type and name, with the sampling settings it was measured under as
    `metric_args` (`n` samples per problem, and the temperature, top-p and token limit `trl-credit eval` recorded).
    """
    results = []
    for summary in summaries:
        if not summary.get("dataset"):
            continue  # the model-index needs a data set
        name, dataset_type, dataset_config = dataset_reference(str(summary["dataset"]))
        config = summary.get("config") if isinstance(summary.get("config"), Mapping) else {}
        settings = {"n": summary.get("n"), **{key: config.get(key) for key in SAMPLING_SETTINGS}}
        settings = {key: value for key, value in settings.items() if value is not None}
        for metric, value in eval_metrics(summary).items():
            results.append(
                EvalResult(
                    task_type=EVAL_TASK_TYPE,
                    dataset_type=dataset_type,
                    dataset_name=name,
                    dataset_config=dataset_config,
                    dataset_split=summary.get("split"),
                    metric_type=metric,
                    metric_name=metric,
                    metric_value=value,
                    metric_args=settings or None,
                )
            )
    return results

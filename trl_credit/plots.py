"""Training curves from `trainer_state.json`: reward, entropy, completion length and method diagnostics.

One PNG per panel, several runs overlaid (one colour per run). Method diagnostics are the metrics of each credit
method in the log (`name/...`: the trainer logs `name/mean_weight` for every method of a stack, registered in this
process or not) and the trainer's own `credit/...`; one figure per prefix with one subplot per metric, so a new
method's diagnostics appear without touching this file.
Rendering uses matplotlib's Agg backend: no display, safe inside a training job.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRAINER_STATE_NAME = "trainer_state.json"
TRAINER_PREFIX = "credit"  # the trainer's own credit metrics, whatever the methods
_METHOD_MARKER = "mean_weight"  # logged as `name/mean_weight` for every method of a stack
PLOTS_DIRNAME = "plots"


@dataclass(frozen=True)
class Panel:
    """One figure of a single quantity: `metric` (and optional `band` = its std) plus matching extras."""

    filename: str
    title: str
    metric: str
    band: str | None = None
    extra_pattern: str | None = None  # regex for more metrics drawn dashed on the same axes


CORE_PANELS = (
    Panel("reward.png", "Reward", "reward", band="reward_std", extra_pattern=r"rewards/.+/mean"),
    Panel("entropy.png", "Entropy (nats)", "entropy"),
    Panel("completion_length.png", "Mean completion length (tokens)", "completions/mean_length"),
)


@dataclass
class Run:
    """A run's name, method and per-step log history."""

    name: str
    log_history: list[dict[str, Any]]
    method: str = field(default="")

    def __post_init__(self):
        if not self.method:
            self.method = infer_method(self.log_history)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.method})"


# --------------------------------------------------------------------------------------------------
# Reading runs
# --------------------------------------------------------------------------------------------------


def _checkpoint_number(path: Path) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(match.group(1)) if match else -1


def find_trainer_state(run_dir: str | Path) -> Path:
    """The most advanced `trainer_state.json` of a run: the run's own or its latest `checkpoint-*`'s.

    `Trainer.save_state()` writes it to the run folder, every checkpoint has one; a run that is still
    training (or was resumed) can have a newer checkpoint than the folder's copy, so the one with the
    largest `global_step` wins. `run_dir` may also be a checkpoint folder or the JSON file itself.
    """
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return run_dir
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    checkpoints = sorted(
        (p for p in run_dir.glob("checkpoint-*") if _checkpoint_number(p) >= 0), key=_checkpoint_number
    )
    candidates = [path / TRAINER_STATE_NAME for path in [run_dir, *checkpoints[-1:]]]
    candidates = [path for path in candidates if path.is_file()]
    if not candidates:
        raise FileNotFoundError(f"no {TRAINER_STATE_NAME} in {run_dir} or its checkpoint-* folders")
    return max(candidates, key=lambda path: json.loads(path.read_text()).get("global_step", 0))


def method_prefixes(log_history: Sequence[dict[str, Any]]) -> list[str]:
    """The credit methods whose metrics the log holds, in the order they first appear."""
    prefixes = {}
    for entry in log_history:
        for key in entry:
            prefix, _, metric = key.partition("/")
            if metric == _METHOD_MARKER and prefix != TRAINER_PREFIX:
                prefixes.setdefault(prefix, None)
    return list(prefixes)


def infer_method(log_history: Sequence[dict[str, Any]]) -> str:
    """The credit method (or `+`-joined stack) whose diagnostics were logged (`"grpo"` when none was)."""
    return "+".join(method_prefixes(log_history)) or "grpo"


def load_run(run_dir: str | Path, name: str | None = None) -> Run:
    """Read a run's log history; its name defaults to the run folder's (not a checkpoint's) name."""
    state_path = find_trainer_state(run_dir)
    folder = state_path.parent
    if _checkpoint_number(folder) >= 0:
        folder = folder.parent
    return Run(name=name or folder.resolve().name, log_history=json.loads(state_path.read_text())["log_history"])


def metric_series(log_history: Sequence[dict[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    """`(steps, values)` of the training-log entries that carry a finite `metric`."""
    steps, values = [], []
    for entry in log_history:
        value = entry.get(metric)
        if "step" in entry and isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(entry["step"])
            values.append(float(value))
    return steps, values


def diagnostic_metrics(log_history: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Credit diagnostics present in the log, grouped by prefix: `{"taco": ["taco/mean_weight", ...]}`."""
    prefixes = {*method_prefixes(log_history), TRAINER_PREFIX}
    groups: dict[str, list[str]] = {}
    for entry in log_history:
        for key in entry:
            prefix = key.split("/", 1)[0]
            if "/" in key and prefix in prefixes and key not in groups.setdefault(prefix, []):
                groups[prefix].append(key)
    return {prefix: sorted(keys) for prefix, keys in groups.items() if keys}


# --------------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_metric(ax, run: Run, color, metric: str, band: str | None = None, linestyle="-", label=None) -> bool:
    steps, values = metric_series(run.log_history, metric)
    if not steps:
        return False
    ax.plot(
        steps,
        values,
        color=color,
        linestyle=linestyle,
        marker="o" if len(steps) < 30 else None,
        markersize=3,
        label=label or run.label,
    )
    if band:
        band_steps, stds = metric_series(run.log_history, band)
        std_by_step = dict(zip(band_steps, stds))
        if std_by_step:
            paired = [(s, v, std_by_step[s]) for s, v in zip(steps, values) if s in std_by_step]
            ax.fill_between(
                [s for s, _, _ in paired],
                [v - d for _, v, d in paired],
                [v + d for _, v, d in paired],
                color=color,
                alpha=0.15,
                linewidth=0,
            )
    return True


def _finish(fig, ax_list, path: Path) -> Path:
    for ax in ax_list:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _plot_core_panel(panel: Panel, runs: Sequence[Run], colors, output_dir: Path) -> Path | None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    try:
        drawn = False
        for run, color in zip(runs, colors):
            drawn |= _draw_metric(ax, run, color, panel.metric, band=panel.band)
            if panel.extra_pattern:
                extras = sorted(
                    {k for entry in run.log_history for k in entry if re.fullmatch(panel.extra_pattern, k)}
                )
                for extra, linestyle in zip(extras, ["--", ":", "-."] * len(extras)):
                    drawn |= _draw_metric(ax, run, color, extra, linestyle=linestyle, label=f"{run.label} {extra}")
        if not drawn:
            return None
        ax.set_title(panel.title)
        return _finish(fig, [ax], output_dir / panel.filename)
    finally:
        plt.close(fig)


def _plot_diagnostics(prefix: str, metrics: Sequence[str], runs: Sequence[Run], colors, output_dir: Path) -> Path:
    plt = _pyplot()
    columns = min(3, len(metrics))
    rows = math.ceil(len(metrics) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    try:
        for ax, metric in zip(axes.flat, metrics):
            for run, color in zip(runs, colors):
                _draw_metric(ax, run, color, metric)
            ax.set_title(metric, fontsize=9)
        for ax in list(axes.flat)[len(metrics) :]:
            ax.set_visible(False)
        fig.suptitle(f"{prefix} diagnostics")
        return _finish(fig, list(axes.flat)[: len(metrics)], output_dir / f"{prefix}_diagnostics.png")
    finally:
        plt.close(fig)


def plot_runs(runs: Sequence[Run], output_dir: str | Path) -> list[Path]:
    """Write the core panels and one diagnostics figure per credit prefix; returns the written PNGs.

    A panel whose metric no run logged is skipped. Runs share a colour across all figures.
    """
    plt = _pyplot()
    output_dir = Path(output_dir)
    colors = [plt.get_cmap("tab10")(index % 10) for index in range(len(runs))]
    written = [_plot_core_panel(panel, runs, colors, output_dir) for panel in CORE_PANELS]
    groups: dict[str, list[str]] = {}
    for run in runs:
        for prefix, metrics in diagnostic_metrics(run.log_history).items():
            groups.setdefault(prefix, [])
            groups[prefix] += [metric for metric in metrics if metric not in groups[prefix]]
    written += [
        _plot_diagnostics(prefix, sorted(groups[prefix]), runs, colors, output_dir) for prefix in sorted(groups)
    ]
    return [path for path in written if path is not None]


def save_training_plots(
    log_history: Sequence[dict[str, Any]], output_dir: str | Path, run_name: str | None = None
) -> list[str]:
    """Plot one run's `trainer.state.log_history` into `{output_dir}/plots/`.

    Called by the trainer at the end of training (and before each model card is written).

    Returns:
        The PNG paths relative to `output_dir`, POSIX style (e.g. `"plots/reward.png"`), ready to be
        used as image links in the model card saved as `{output_dir}/README.md`.
    """
    output_dir = Path(output_dir)
    run = Run(name=run_name or output_dir.resolve().name, log_history=list(log_history))
    return [path.relative_to(output_dir).as_posix() for path in plot_runs([run], output_dir / PLOTS_DIRNAME)]

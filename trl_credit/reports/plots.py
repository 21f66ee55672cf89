"""Training curves from `trainer_state.json`: reward, entropy, completion length and method diagnostics.

One PNG per panel, several runs overlaid (one colour and one legend entry per run). The reward panel draws the mean
reward with a band of ± 1 std over the step's completions, clipped to the reward's range when the log establishes it
(`reward_range`); a reward function's own mean is drawn only where it differs from the reward. Method diagnostics are
the metrics of each credit method in the log (`name/...`: the trainer logs `name/mean_weight` for every method of a
stack, registered in this process or not) and the trainer's own `credit/...`; one figure per prefix with one subplot
per metric, so a new method's diagnostics appear without touching this file.
Figures are `matplotlib.figure.Figure` objects rendered by Agg without pyplot: no display, safe inside a training
job, and the caller's backend and open figures are left alone.
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
_REWARD_MEAN = re.compile(r"rewards/(.+)/mean")  # TRL's mean of one reward function


@dataclass(frozen=True)
class Panel:
    """One figure of a single quantity: `metric` (and optional `band` = its std) plus matching extras.

    An extra (a metric matching `extra_pattern`, labelled by its first group) is drawn dashed unless it equals
    `metric` at every step: with one reward function of weight 1, `rewards/<name>/mean` is the reward itself.
    """

    filename: str
    title: str
    metric: str
    band: str | None = None
    band_label: str = ""  # what the band is, for the axis label
    clip_to_reward_range: bool = False  # the band stays within each run's `reward_range`, when known
    extra_pattern: str | None = None  # regex for more metrics drawn dashed on the same axes


CORE_PANELS = (
    Panel(
        "reward.png",
        "Reward",
        "reward",
        band="reward_std",
        band_label="band: ± 1 std over the step's completions",
        clip_to_reward_range=True,
        extra_pattern=r"rewards/(.+)/mean",
    ),
    Panel("entropy.png", "Entropy (nats)", "entropy"),
    Panel("completion_length.png", "Mean completion length (tokens)", "completions/mean_length"),
)


@dataclass
class Run:
    """A run's name, method and per-step log history; `reward_range` bounds its reward (see `reward_range`)."""

    name: str
    log_history: list[dict[str, Any]]
    method: str = field(default="")
    reward_range: tuple[float, float] | None = None

    def __post_init__(self):
        if not self.method:
            self.method = infer_method(self.log_history)
        if self.reward_range is None:
            self.reward_range = reward_range(self.log_history)

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


def _same_series(first: tuple[list[int], list[float]], second: tuple[list[int], list[float]]) -> bool:
    return first[0] == second[0] and all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(first[1], second[1]))


def reward_range(log_history: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """The interval every completion's reward lies in, or None when the log does not establish one.

    TRL logs each reward function's mean (`rewards/<name>/mean`) and their weighted sum (`reward`). The range is the
    sum of the functions' declared ranges when every function is one of the package's and the logged `reward` equals
    the sum of their means at every step (all weights 1); a custom function or other weights leave it unknown, and
    the curves then draw the band unclipped rather than clip it to a guess. The observed curve is no source: a mean
    never reaches the bounds that single completions do.
    """
    names = sorted(
        {match.group(1) for entry in log_history for key in entry if (match := _REWARD_MEAN.fullmatch(key))}
    )
    from ..rewards import REWARD_RANGES as bounds

    if not names or any(name not in bounds for name in names):
        return None
    total = metric_series(log_history, "reward")
    means = [dict(zip(*metric_series(log_history, f"rewards/{name}/mean"))) for name in names]
    summed = [sum(mean.get(step, math.nan) for mean in means) for step in total[0]]
    if not total[0] or not _same_series(total, (total[0], summed)):
        return None
    return sum(bounds[name][0] for name in names), sum(bounds[name][1] for name in names)


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


def _figure(**kwargs):
    """A figure outside pyplot: pyplot's backend and figure list are process-wide, and a library leaves them alone."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _draw_metric(
    ax, run: Run, color, metric: str, band: str | None = None, linestyle="-", label=None, band_range=None
):
    """Draw `metric` of `run` (and `band` = its std around it, clipped to `band_range`); the handle for its legend
    entry (the line, or the line and its band), or None when the run did not log it."""
    steps, values = metric_series(run.log_history, metric)
    if not steps:
        return None
    (line,) = ax.plot(
        steps,
        values,
        color=color,
        linestyle=linestyle,
        marker="o" if len(steps) < 30 else None,
        markersize=3,
        label=label or run.label,
    )
    if band:
        std_by_step = dict(zip(*metric_series(run.log_history, band)))
        paired = [(s, v, std_by_step[s]) for s, v in zip(steps, values) if s in std_by_step]
        if paired:
            low, high = band_range if band_range is not None else (-math.inf, math.inf)
            filled = ax.fill_between(
                [s for s, _, _ in paired],
                [max(low, v - d) for _, v, d in paired],
                [min(high, v + d) for _, v, d in paired],
                color=color,
                alpha=0.15,
                linewidth=0,
            )
            return (line, filled)
    return line


def _run_colors(count: int) -> list:
    from matplotlib import colormaps

    return [colormaps["tab10"](index % 10) for index in range(count)]


def _decorate(ax, legend=None) -> None:
    """Step axis, grid and legend (`legend`: `(handles, labels)`; default: the axes' labelled artists)."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps, as TRL numbers them
    ax.grid(alpha=0.3)
    handles, labels = legend if legend is not None else ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=7, handler_map={tuple: HandlerTuple(ndivide=1)})


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def core_panel_figure(panel: Panel, runs: Sequence[Run], colors=None):
    """The figure of one core panel (the caller saves it), or None when no run logged its metric.

    One legend entry per run (its line, and its band when the panel has one), plus one per extra that differs
    from the metric.
    """
    colors = colors or _run_colors(len(runs))
    fig = _figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    handles, labels = [], []
    for run, color in zip(runs, colors):
        band_range = run.reward_range if panel.clip_to_reward_range else None
        handle = _draw_metric(ax, run, color, panel.metric, band=panel.band, band_range=band_range)
        if handle is not None:
            handles.append(handle)
            labels.append(run.label)
        if panel.extra_pattern:
            pattern = re.compile(panel.extra_pattern)
            main = metric_series(run.log_history, panel.metric)
            extras = sorted({k for entry in run.log_history for k in entry if pattern.fullmatch(k)})
            extras = [k for k in extras if not _same_series(metric_series(run.log_history, k), main)]
            for extra, linestyle in zip(extras, ["--", ":", "-."] * len(extras)):
                match = pattern.fullmatch(extra)
                label = f"{run.label}: {match.group(1) if match.groups() else extra}"
                handle = _draw_metric(ax, run, color, extra, linestyle=linestyle, label=label)
                if handle is not None:
                    handles.append(handle)
                    labels.append(label)
    if not handles:
        return None
    if panel.band_label:
        ranges = {run.reward_range for run in runs} if panel.clip_to_reward_range else {None}
        (clip_range,) = ranges if len(ranges) == 1 else (None,)
        clipped = (
            "" if clip_range is None else f", clipped to the reward's range [{clip_range[0]:g}, {clip_range[1]:g}]"
        )
        ax.set_title(panel.title, pad=16)
        ax.text(0.5, 1.02, f"{panel.band_label}{clipped}", transform=ax.transAxes, ha="center", fontsize=7)
    else:
        ax.set_title(panel.title)
    _decorate(ax, legend=(handles, labels))
    return fig


def _plot_core_panel(panel: Panel, runs: Sequence[Run], colors, output_dir: Path) -> Path | None:
    fig = core_panel_figure(panel, runs, colors)
    return None if fig is None else _save(fig, output_dir / panel.filename)


def _plot_diagnostics(prefix: str, metrics: Sequence[str], runs: Sequence[Run], colors, output_dir: Path) -> Path:
    columns = min(3, len(metrics))
    rows = math.ceil(len(metrics) / columns)
    fig = _figure(figsize=(4.2 * columns, 3.0 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        for run, color in zip(runs, colors):
            _draw_metric(ax, run, color, metric)
        ax.set_title(metric, fontsize=9)
        _decorate(ax)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(f"{prefix} diagnostics")
    return _save(fig, output_dir / f"{prefix}_diagnostics.png")


def plot_runs(runs: Sequence[Run], output_dir: str | Path) -> list[Path]:
    """Write the core panels and one diagnostics figure per credit prefix; returns the written PNGs.

    A panel whose metric no run logged is skipped. Runs share a colour across all figures.
    """
    output_dir = Path(output_dir)
    colors = _run_colors(len(runs))
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

"""The report of `trl-credit compare`: `report.md` and a self-contained `report.html` (inline SVG, no external asset).

Sections: learning curves (each method's mean over seeds per step, with the min-max band over seeds), the final
evaluation (mean ± 95 % t interval over seeds), the paired difference of each method to `grpo` on the same seed
(mean ± 95 % t interval of the per-seed differences), and cost (TRL's `step_time`, wall time, peak memory).
"""

from __future__ import annotations

import html
import io
import json
import re
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...reports.plots import diagnostic_metrics, find_trainer_state, metric_series
from .plan import BASELINE, DONE_MARKER, EVAL_SUMMARY, RunSpec
from .stats import Interval, paired_difference, t_interval

CORE_CURVES = (("reward", "Reward"), ("entropy", "Entropy (nats)"), ("completions/mean_length", "Completion length"))
TRAIN_REWARD = "train reward (last 10 steps)"


@dataclass
class RunResult:
    """What a finished (or partial) run left in its folder."""

    method: str
    seed: int
    log_history: list[dict]
    eval_summary: dict | None
    done: dict | None

    def series(self, metric: str) -> tuple[list[int], list[float]]:
        return metric_series(self.log_history, metric)

    def scalars(self) -> dict[str, float]:
        """The run's final numbers: the evaluation metrics and the mean training reward of the last 10 logged steps."""
        values = {}
        if self.eval_summary:
            for key, value in self.eval_summary.items():
                if key.startswith(("avg@", "pass@")) or key == "mean_completion_length":
                    values[key] = float(value)
        rewards = self.series("reward")[1]
        if rewards:
            values[TRAIN_REWARD] = statistics.fmean(rewards[-10:])
        return values


def collect_results(runs: Sequence[RunSpec]) -> list[RunResult]:
    """Read every run folder that has a log history, an evaluation or a completion marker.

    The log history is the run folder's `trainer_state.json` (saved by `trl-credit grpo` at the end of training),
    or its latest checkpoint's while the run is unfinished (the more advanced of the two; `find_trainer_state`).
    """
    results = []
    for spec in runs:
        try:
            log_history = json.loads(find_trainer_state(spec.output_dir).read_text()).get("log_history", [])
        except (FileNotFoundError, json.JSONDecodeError):
            log_history = []
        eval_path, done_path = spec.output_dir / EVAL_SUMMARY, spec.output_dir / DONE_MARKER
        eval_summary = json.loads(eval_path.read_text()) if eval_path.is_file() else None
        done = json.loads(done_path.read_text()) if done_path.is_file() else None
        if log_history or eval_summary or done:
            results.append(RunResult(spec.method, spec.seed, log_history, eval_summary, done))
    return results


# ---------------------------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------------------------


def _metric_order(key: str) -> tuple:
    kind, _, k = key.partition("@")
    rank = {"avg": 0, "pass": 1}.get(kind, 2 if key == "mean_completion_length" else 3)
    return (rank, int(k) if k.isdigit() else 0, key)


def final_metrics(results: Sequence[RunResult]) -> list[str]:
    return sorted({key for r in results for key in r.scalars()}, key=_metric_order)


def by_seed(results: Sequence[RunResult], method: str, metric: str) -> dict[int, float]:
    return {r.seed: r.scalars()[metric] for r in results if r.method == method and metric in r.scalars()}


def final_table(results: Sequence[RunResult], methods: Sequence[str]) -> dict[str, dict[str, Interval]]:
    """`{method: {metric: t interval over seeds}}`."""
    return {m: {k: t_interval(list(by_seed(results, m, k).values())) for k in final_metrics(results)} for m in methods}


def paired_table(results: Sequence[RunResult], methods: Sequence[str]) -> dict[str, dict[str, Interval]]:
    """`{method: {metric: t interval of (method - grpo) over the seeds both have}}`, methods other than `grpo`."""
    if BASELINE not in methods:
        return {}
    return {
        m: {
            k: paired_difference(by_seed(results, m, k), by_seed(results, BASELINE, k)) for k in final_metrics(results)
        }
        for m in methods
        if m != BASELINE
    }


def cost_table(results: Sequence[RunResult], methods: Sequence[str]) -> dict[str, dict[str, str]]:
    """Per method: median TRL `step_time` per run (mean ± CI over seeds), wall time per run, peak RSS."""
    table = {}
    for method in methods:
        runs = [r for r in results if r.method == method]
        step_times = [statistics.median(r.series("step_time")[1]) for r in runs if r.series("step_time")[1]]
        walls = [r.done["wall_seconds"] for r in runs if r.done]
        peaks = [r.done["peak_rss_mib"] for r in runs if r.done and r.done.get("peak_rss_mib") is not None]
        table[method] = {
            "step time (s, median per run)": t_interval(step_times).format(),
            "wall time per run (s)": t_interval(walls).format(),
            "peak RSS (MiB, max over runs)": f"{max(peaks):.0f}" if peaks else "–",
        }
    return table


def mean_band(results: Sequence[RunResult], method: str, metric: str):
    """`(steps, mean, low, high)` of `metric` over the seeds of `method`; the band is the min-max over seeds."""
    values_by_step: dict[int, list[float]] = {}
    for r in results:
        if r.method == method:
            for step, value in zip(*r.series(metric)):
                values_by_step.setdefault(step, []).append(value)
    steps = sorted(values_by_step)
    return (
        steps,
        [statistics.fmean(values_by_step[s]) for s in steps],
        [min(values_by_step[s]) for s in steps],
        [max(values_by_step[s]) for s in steps],
    )


def curve_metrics(results: Sequence[RunResult]) -> list[tuple[str, str]]:
    """The core curves, then every credit diagnostic logged (`plots.diagnostic_metrics`)."""
    diagnostics = sorted({key for r in results for keys in diagnostic_metrics(r.log_history).values() for key in keys})
    present = {key for r in results for entry in r.log_history for key in entry}
    return [(m, title) for m, title in CORE_CURVES if m in present] + [(d, d) for d in diagnostics]


# ---------------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------------


def curve_svg(results: Sequence[RunResult], methods: Sequence[str], metric: str, title: str) -> str | None:
    """One figure: each method's mean over seeds against the step, with its min-max band, as an SVG string."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    # A Figure outside pyplot: pyplot's backend and figure list are process-wide, and a library leaves them alone.
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.subplots()
    drawn = False
    for index, method in enumerate(methods):
        steps, mean, low, high = mean_band(results, method, metric)
        if not steps:
            continue
        color = colormaps["tab10"](index % 10)
        seeds = len({r.seed for r in results if r.method == method and r.series(metric)[0]})
        ax.plot(
            steps,
            mean,
            color=color,
            label=f"{method} ({seeds} seed{'s' if seeds != 1 else ''})",
            marker="o" if len(steps) < 20 else None,
            markersize=3,
        )
        ax.fill_between(steps, low, high, color=color, alpha=0.18, linewidth=0)
        drawn = True
    if not drawn:
        return None
    ax.set_title(f"{title}: mean over seeds, band min–max", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE: the SVG is inlined in HTML


def _slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


# ---------------------------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ReportTables:
    """The report's tables as `(caption, header, rows)`, rendered both as Markdown and as HTML."""

    tables: list[tuple[str, list[str], list[list[str]]]]


def build_tables(results: Sequence[RunResult], methods: Sequence[str]) -> ReportTables:
    metrics = final_metrics(results)
    seeds = {m: sorted(r.seed for r in results if r.method == m) for m in methods}
    finals = final_table(results, methods)
    tables = [
        (
            "Final results: mean ± half-width of the 95 % t interval over seeds (CI n/a with one seed)",
            ["method", "seeds", *metrics],
            [[m, ", ".join(map(str, seeds[m])) or "–", *(finals[m][k].format() for k in metrics)] for m in methods],
        )
    ]
    paired = paired_table(results, methods)
    if paired:
        rows = []
        for method, row in paired.items():
            cells = []
            for k in metrics:
                interval = row[k]
                cells.append(interval.format() + (" *" if interval.excludes_zero() else ""))
            rows.append([f"{method} − {BASELINE}", str(max((row[k].n for k in metrics), default=0)), *cells])
        tables.append(
            (
                f"Paired difference to {BASELINE} on the same seed: mean ± 95 % t interval over seeds "
                "(* the interval excludes 0)",
                ["difference", "pairs", *metrics],
                rows,
            )
        )
    costs = cost_table(results, methods)
    columns = list(next(iter(costs.values())).keys()) if costs else []
    tables.append(
        (
            "Cost: TRL's step_time (median per run, then mean ± 95 % CI over seeds), wall time of the training "
            "subprocess, and peak resident memory of its largest process (CPU RSS via os.wait4; GPU memory is not "
            "measured)",
            ["method", *columns],
            [[m, *costs[m].values()] for m in methods],
        )
    )
    return ReportTables(tables)


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    escape = lambda cell: str(cell).replace("|", "\\|")  # noqa: E731
    return [
        "| " + " | ".join(map(escape, header)) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(map(escape, row)) + " |" for row in rows),
    ]


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.curves { display: flex; flex-wrap: wrap; gap: 1em; }
.curve svg { width: 540px; height: auto; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def portable_command(command: str) -> str:
    """`command` with each absolute path given as its last part (`--output_dir /work/runs/cmp` -> `cmp`): a report
    names no folder of the machine it ran on."""

    def portable(word: str) -> str:
        flag, equals, value = word.rpartition("=") if word.startswith("--") else ("", "", word)
        return f"{flag}{equals}{Path(value).name}" if Path(value).is_absolute() else word

    return shlex.join(portable(word) for word in shlex.split(command))


def write_report(
    output_dir: str | Path, runs: Sequence[RunSpec], methods: Sequence[str], notes: Sequence[str], command: str
) -> tuple[Path, Path]:
    """Write `report.md` (SVG figures in `plots/`) and the self-contained `report.html`; return both paths."""
    output_dir = Path(output_dir)
    results = collect_results(runs)
    tables = build_tables(results, methods)
    figures = []
    for metric, title in curve_metrics(results):
        svg = curve_svg(results, methods, metric, title)
        if svg is not None:
            figures.append((metric, title, svg))
    plots_dir = output_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    for metric, _, svg in figures:
        (plots_dir / f"{_slug(metric)}.svg").write_text(svg)

    finished = sum(r.done is not None for r in results)
    summary = [
        f"Command: `{portable_command(command)}`",
        "",
        f"{finished} of {len(runs)} runs finished ({', '.join(methods)} × seeds "
        f"{', '.join(sorted({str(r.seed) for r in runs}, key=int))}).",
        *notes,
    ]
    markdown = ["# trl-credit compare", "", *summary, "", "## Learning curves", ""]
    markdown += [f"![{title}](plots/{_slug(metric)}.svg)" for metric, title, _ in figures] or ["No logged steps yet."]
    for caption, header, rows in tables.tables:
        markdown += ["", f"## {caption.split(':')[0]}", "", caption + ".", "", *_markdown_table(header, rows)]
    md_path = output_dir / "report.md"
    md_path.write_text("\n".join(markdown) + "\n")

    body = ["<h1>trl-credit compare</h1>"]
    body += [f"<p>{_inline_code(line)}</p>" for line in summary if line]
    body.append('<h2>Learning curves</h2><div class="curves">')
    body += [f'<figure class="curve" data-metric="{html.escape(metric)}">{svg}</figure>' for metric, _, svg in figures]
    body.append("</div>")
    for caption, header, rows in tables.tables:
        body += [
            f"<h2>{html.escape(caption.split(':')[0])}</h2>",
            f"<p>{html.escape(caption)}.</p>",
            _html_table(header, rows),
        ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>trl-credit compare</title>'
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    html_path = output_dir / "report.html"
    html_path.write_text(page)
    return md_path, html_path


def _inline_code(text: str) -> str:
    """Escape `text` for HTML and render its `code` spans."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))

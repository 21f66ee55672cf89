"""The lab's grid summarised and reported: per task and method, each metric's mean ± 95 % t interval over seeds, the
paired difference to `grpo` on the same seed, how many runs collapsed and, when the grid has `oracle` and `grpo`, the
fraction of the broadcast-to-oracle gap each method closes (`summarize`, `render_report`).
"""

from __future__ import annotations

import math

from ..compare.stats import paired_difference, t_interval
from .lab_config import LabConfig
from .metrics import (
    COLLAPSE_TOLERANCE,
    collapsed,
    gap_fraction,
)
from .oracle import CEILING
from .tasks import TASKS, get_task

BROADCAST = "grpo"  # the floor of the gap; the ceiling is the lab's oracle method (`CEILING`)


# ---------------------------------------------------------------------------------------------------------------
# The grid and its report
# ---------------------------------------------------------------------------------------------------------------

# (metric, label, the tasks it is reported for)
ALL, TAIL_TASKS = tuple(TASKS), ("rare", "hitch")
REPORTED_METRICS = (
    ("final_reward", "train reward, last 10 steps", ALL),
    ("mean_reward", "train reward, mean over all steps", ALL),
    ("steps_until_solved", "steps until solved", ALL),
    ("steps_until_solved_censored", "steps until solved (unsolved = budget + 1)", ALL),
    ("decisive_precision_pos", "credit precision, positive responses", ALL),
    ("decisive_lift_pos", "precision lift over uniform, positive", ALL),
    ("decisive_precision_neg", "credit precision, negative responses", ("fork", "mdp")),
    ("decisive_lift_neg", "precision lift over uniform, negative", ("fork", "mdp")),
    ("implausible_lift_pos", "credit lift on the rare token, positive", TAIL_TASKS),
    ("rare_prob_growth", "p(rare token) end / start, correct responses", TAIL_TASKS),
    ("entropy_end", "entropy, last 5 steps (nats)", ALL),
    ("avg@{n}", "avg@n", ALL),
    ("pass@{k}", "pass@k", ALL),
    ("grad_norm_cv", "micro-batch grad-norm CV", ALL),
    ("grad_norm_var", "micro-batch grad-norm variance", ALL),
)
# Metrics whose broadcast-to-oracle gap is reported.
GAP_METRICS = ("mean_reward", "final_reward", "steps_until_solved_censored", "avg@{n}")


def _metric_keys(config: LabConfig) -> list[tuple[str, str, tuple[str, ...]]]:
    keys = []
    for key, label, tasks in REPORTED_METRICS:
        if key == "avg@{n}":
            keys.append((f"avg@{config.eval_samples}", f"avg@{config.eval_samples}", tasks))
        elif key == "pass@{k}":
            keys += [(f"pass@{k}", f"pass@{k} (n={config.eval_samples})", tasks) for k in config.pass_k]
        else:
            keys.append((key, label, tasks))
    return keys


def _value(record: dict, key: str) -> float:
    value = record["metrics"].get(key)
    if key == "steps_until_solved" and value is None:
        return math.nan  # not solved: reported separately as a count
    return math.nan if value is None else float(value)


def collapse_counts(records: list[dict], task: str, methods: list[str], eval_samples: int) -> dict[str, dict]:
    """Per method, how many of its runs on `task` collapsed (`metrics.collapsed`): `{"mean": rate, "n", "text"}`."""
    floor = get_task(task).reward_floor
    counts = {}
    for method in methods:
        runs = [r for r in records if r["task"] == task and r["method"] == method]
        hits = sum(collapsed(_value(r, "final_reward"), _value(r, f"avg@{eval_samples}"), floor) for r in runs)
        counts[method] = {
            "mean": hits / len(runs) if runs else math.nan,
            "n": len(runs),
            "count": hits,
            "text": f"{hits}/{len(runs)}" if runs else "–",
        }
    return counts


def summarize(records: list[dict], config: LabConfig) -> dict:
    """`{task: {metric: {method: {"mean": .., "ci": .., "n": .., "vs_grpo": ..}}}}` over seeds."""
    summary: dict = {}
    for task in config.tasks:
        summary[task] = {
            "collapsed": {
                "label": f"collapsed runs (final reward or avg@{config.eval_samples} ≤ floor + {COLLAPSE_TOLERANCE})",
                "methods": collapse_counts(records, task, config.methods, config.eval_samples),
            }
        }
        for key, label, tasks in _metric_keys(config):
            if task not in tasks:
                continue
            by_method = {}
            for method in config.methods:
                values = {r["seed"]: _value(r, key) for r in records if r["task"] == task and r["method"] == method}
                interval = t_interval(list(values.values()))
                entry = {
                    "mean": interval.mean,
                    "half_width": interval.half_width,
                    "n": interval.n,
                    "text": interval.format(),
                }
                if key == "steps_until_solved":
                    entry["solved"] = f"{sum(not math.isnan(v) for v in values.values())}/{len(values)}"
                baseline = {
                    r["seed"]: _value(r, key) for r in records if r["task"] == task and r["method"] == BROADCAST
                }
                if method != BROADCAST and baseline:
                    difference = paired_difference(values, baseline)
                    entry["vs_grpo"] = {
                        "mean": difference.mean,
                        "half_width": difference.half_width,
                        "n": difference.n,
                        "text": difference.format(),
                        "excludes_zero": difference.excludes_zero(),
                    }
                by_method[method] = entry
            summary.setdefault(task, {})[key] = {"label": label, "methods": by_method}
        if {BROADCAST, CEILING} <= set(config.methods):
            for key, label in _gap_keys(config):
                by_method = {}
                per_method = {
                    m: {r["seed"]: _value(r, key) for r in records if r["task"] == task and r["method"] == m}
                    for m in config.methods
                }
                for method in config.methods:
                    interval = gap_fraction(per_method[method], per_method[BROADCAST], per_method[CEILING])
                    by_method[method] = {
                        "mean": interval.mean,
                        "half_width": interval.half_width,
                        "n": interval.n,
                        "text": interval.format(),
                    }
                summary[task][f"gap_closed:{key}"] = {
                    "label": f"fraction of the grpo→{CEILING} gap closed: {label}",
                    "methods": by_method,
                }
    return summary


def _gap_keys(config: LabConfig) -> list[tuple[str, str]]:
    labels = {key: label for key, label, _ in _metric_keys(config)}
    keys = [f"avg@{config.eval_samples}" if key == "avg@{n}" else key for key in GAP_METRICS]
    return [(key, labels[key]) for key in keys]


def render_report(summary: dict, config: LabConfig, records: list[dict], command: str) -> str:
    """`report.md`: one table per task, metrics as rows, methods as columns (mean ± 95 % CI; Δ vs grpo, paired)."""
    total = sum(r["wall_seconds"] for r in records)
    lines = [
        "# Credit lab results",
        "",
        f"Command: `{command}`",
        "",
        f"{len(records)} runs ({', '.join(config.methods)} × {', '.join(config.tasks)} × seeds "
        f"{', '.join(map(str, config.seeds))}), completions of {config.horizon} tokens"
        f"{f' with {config.decisive} decisive forks' if config.decisive != 1 else ''}, {config.max_steps} optimizer steps each, "
        f"{config.prompts_per_step} prompts × {config.num_generations} completions per step, "
        f"{config.micro_batches} micro-batches; {total / 60:.1f} min of wall time in all.",
        "Cells: mean ± half-width of the 95 % t interval over seeds; `Δ` is the paired difference to `grpo` on the "
        "same seed with its 95 % t interval (`*` when the interval excludes 0). `steps until solved` averages the "
        "solved runs only; the count of solved runs is shown beside it. The fraction of the gap closed is, per seed, "
        f"(method − grpo) / ({CEILING} − grpo) (seeds where the two are equal left out); 0 is GRPO, 1 the {CEILING}. "
        "`collapsed runs` counts the runs whose train reward over the last 10 steps or whose avg@n ends within "
        f"{COLLAPSE_TOLERANCE} of the task's floor (reward 0, a failure).",
        "",
    ]
    for task, metrics in summary.items():
        lines += [
            f"## {task}",
            "",
            "| metric | " + " | ".join(config.methods) + " |",
            "|---|" + "---|" * len(config.methods),
        ]
        for row in metrics.values():
            cells = []
            for method in config.methods:
                entry = row["methods"].get(method, {})
                text = entry.get("text", "–")
                if "solved" in entry:
                    text += f" [{entry['solved']} solved]"
                if "vs_grpo" in entry:
                    delta = entry["vs_grpo"]
                    text += f"<br>Δ {delta['text']}{' *' if delta['excludes_zero'] else ''}"
                cells.append(text)
            lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)

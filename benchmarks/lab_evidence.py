"""The lab's regime claims at 20 seeds, replicated on 20 disjoint seeds at a neighbouring configuration, in stages.

    python benchmarks/lab_evidence.py --list                 # the stages, their runs and estimated cost
    python benchmarks/lab_evidence.py --stages d-h32         # run one stage (finished runs are not repeated)
    python benchmarks/lab_evidence.py --next 2 --commit      # the next two unfinished stages, a git commit after each
    python benchmarks/lab_evidence.py --aggregate            # only re-render docs/lab_evidence/report.md

Seeds come from `benchmarks/lab_evidence_seeds.json`, committed before any stage ran: discovery stages (`d-*`)
use seeds 0-19, replication stages (`r-*`) seeds 1000-1019. Each stage is one `trl-credit lab` command with one
torch thread, whose results are one line of `results/lab_evidence.jsonl` and whose report is
`docs/lab_evidence/<folder>/report.md`; stages that share a folder add methods or seeds to it.
`results/lab_evidence_stages.json` records each finished stage's command, wall time, load average and commit.

`report.md` has one table per claim family (horizon, sparsity, group size, the methods at the longest horizon,
contamination) and one for the investigation of EAPO's collapses (its GRPO runs are `d-h128`'s). Each row is one
method against `grpo` at one level, paired on the seed, for two metrics (mean train reward over the first 40 steps,
avg@16 after training): the mean difference with its 95 % t interval, the effect size d_z (mean difference /
standard deviation of the differences), the two-sided paired t test's p-value Holm-adjusted over every row and metric
of the table, and each side's collapse count. A sweep's last row tests whether the gap changes along it (the gaps at
its last level minus those at its first: Welch's test, Cohen's d). A `grpo − 0` row tests GRPO's own change of the
metric (the contamination claim: GRPO raises `z`). A discovery row is a finding when its Holm-adjusted p < 0.05; it
is *replicated* when the replication table's row at the paired level has the same sign with Holm-adjusted p < 0.05,
*refuted* when it has the opposite sign with p < 0.05, and *not replicated* otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import _results  # noqa: E402

from trl_credit.experiments.compare.stats import paired_difference  # noqa: E402
from trl_credit.experiments.lab.metrics import (  # noqa: E402
    COLLAPSE_TOLERANCE,
    collapsed,
    effect_size,
    holm,
    paired_t_p_value,
    welch_difference,
)

OUTPUT = _common.REPO_ROOT / "docs" / "lab_evidence"
EXPERIMENT = "lab_evidence"  # results/lab_evidence.jsonl
STAGE_LOG = _results.RESULTS / "lab_evidence_stages.json"
SEEDS = json.loads((Path(__file__).resolve().parent / "lab_evidence_seeds.json").read_text())
MDP = ["--tasks", "mdp", "--warm_up_steps", "200", "--eval_samples", "16", "--pass_k", "1", "4"]
BUDGET = 40  # steps every stage runs at least: mean rewards are taken over these
ALPHA = 0.05


def _mdp(methods: list[str], horizon: int, steps: int = 60, **options) -> list[str]:
    """`trl-credit lab` arguments of an `mdp` stage; `options` are further lab options (`decisive=2`)."""
    extra = []
    for name, value in options.items():
        extra += [f"--{name}", str(value)]
    return ["--methods", *methods, *MDP, "--horizon", str(horizon), "--max_steps", str(steps), *extra]


FLOOR_AND_CEILING = ["grpo", "oracle"]
HITCH = ["--tasks", "hitch", "--max_steps", "100", "--eval_samples", "16", "--pass_k", "1", "4"]
HITCH_METHODS = ["grpo", "oracle", "taco", "stapo", "minp_support"]
KAPPA_LN2 = json.dumps({"eapo_kappa": round(math.log(2), 4)})
FORK_QUANTILES = json.dumps({"eapo_quantiles": [0.9, 0.999]})  # one fork in 128 tokens: the top 0.8 % are forks
# Folders whose GRPO runs are in another folder (same seeds and settings but the compared method's hyperparameters).
BASELINE_FOLDER = {"d-h128-eapo-k2": "d-h128", "d-h128-eapo-q": "d-h128"}

# name: (seed set, seed slice, folder, lab arguments, estimated seconds per run on one loaded core).
# Cheap and decisive stages first, so that a partial run is usable; each stage is sized for < 1 h on one core.
_FIRST, _SECOND, _ALL = slice(0, 10), slice(10, 20), slice(0, 20)
STAGES: dict[str, tuple[str, slice, str, list[str], float]] = {
    "d-h32": ("discovery", _ALL, "d-h32", _mdp(FLOOR_AND_CEILING, 32), 37),
    "d-h8": ("discovery", _ALL, "d-h8", _mdp(FLOOR_AND_CEILING, 8), 18),
    "d-h128": ("discovery", _ALL, "d-h128", _mdp(FLOOR_AND_CEILING, 128, steps=40), 33),
    "d-k2": ("discovery", _ALL, "d-k2", _mdp(FLOOR_AND_CEILING, 32, decisive=2), 54),
    "d-k4": ("discovery", _ALL, "d-k4", _mdp(FLOOR_AND_CEILING, 32, decisive=4), 70),
    "d-g4": ("discovery", _ALL, "d-g4", _mdp(FLOOR_AND_CEILING, 32, num_generations=4), 53),
    "d-g16": ("discovery", _ALL, "d-g16", _mdp(FLOOR_AND_CEILING, 32, num_generations=16), 80),
    "d-h128-taco": ("discovery", _ALL, "d-h128", _mdp(["taco"], 128, steps=40), 84),
    "d-h128-eapo-a": ("discovery", _FIRST, "d-h128", _mdp(["eapo"], 128, steps=40), 176),
    "d-h128-eapo-b": ("discovery", _SECOND, "d-h128", _mdp(["eapo"], 128, steps=40), 176),
    "d-h128-tide-a": ("discovery", _FIRST, "d-h128", _mdp(["tide"], 128, steps=40), 164),
    "d-h128-tide-b": ("discovery", _SECOND, "d-h128", _mdp(["tide"], 128, steps=40), 164),
    "d-hitch": ("discovery", _ALL, "d-hitch", ["--methods", *HITCH_METHODS, *HITCH, "--horizon", "16"], 30),
    # Why EAPO collapses at H = 128 (issue: kappa, the quantiles or a defect): EAPO with a smaller kappa, and with
    # quantiles that separate the fork from the fillers, on the discovery seeds, against d-h128's GRPO runs.
    "d-h128-eapo-k2": (
        "discovery",
        _ALL,
        "d-h128-eapo-k2",
        _mdp(["eapo"], 128, steps=40, credit_kwargs=KAPPA_LN2),
        50,
    ),
    "d-h128-eapo-q": (
        "discovery",
        _ALL,
        "d-h128-eapo-q",
        _mdp(["eapo"], 128, steps=40, credit_kwargs=FORK_QUANTILES),
        50,
    ),
    # Replication: disjoint seeds, a neighbouring configuration.
    "r-h24": ("replication", _ALL, "r-h24", _mdp(FLOOR_AND_CEILING, 24), 30),
    "r-h12": ("replication", _ALL, "r-h12", _mdp(FLOOR_AND_CEILING, 12), 20),
    "r-h96": ("replication", _ALL, "r-h96", _mdp(FLOOR_AND_CEILING, 96, steps=40), 28),
    "r-k2": ("replication", _ALL, "r-k2", _mdp(FLOOR_AND_CEILING, 24, decisive=2), 45),
    "r-k4": ("replication", _ALL, "r-k4", _mdp(FLOOR_AND_CEILING, 24, decisive=4), 55),
    "r-g6": ("replication", _ALL, "r-g6", _mdp(FLOOR_AND_CEILING, 24, num_generations=6), 45),
    "r-g12": ("replication", _ALL, "r-g12", _mdp(FLOOR_AND_CEILING, 24, num_generations=12), 65),
    "r-h96-tide-a": ("replication", _FIRST, "r-h96", _mdp(["tide"], 96, steps=40), 125),
    "r-h96-tide-b": ("replication", _SECOND, "r-h96", _mdp(["tide"], 96, steps=40), 125),
    "r-h96-taco": ("replication", _ALL, "r-h96", _mdp(["taco"], 96, steps=40), 65),
    "r-h96-eapo-a": ("replication", _FIRST, "r-h96", _mdp(["eapo"], 96, steps=40), 135),
    "r-h96-eapo-b": ("replication", _SECOND, "r-h96", _mdp(["eapo"], 96, steps=40), 135),
    "r-hitch-a": ("replication", _FIRST, "r-hitch", ["--methods", *HITCH_METHODS, *HITCH, "--horizon", "24"], 40),
    "r-hitch-b": ("replication", _SECOND, "r-hitch", ["--methods", *HITCH_METHODS, *HITCH, "--horizon", "24"], 40),
}

METRICS = (("mean_reward", f"mean train reward, steps 1–{BUDGET}"), ("avg@16", "avg@16 after training"))
ROW_NAMES = {"grpo": "grpo − 0", "trend": "oracle − grpo: the gap's change over the sweep"}
LOG_GROWTH = ("log_rare_growth", "ln(p(z) end / start) in fixed correct responses")

# Claim families: (title, methods compared with grpo, discovery levels, replication levels paired by position or None
# for an investigation, metrics). The method `grpo` is compared with 0: does the metric move under GRPO at all.
TABLES = (
    (
        "the oracle − grpo gap grows with the horizon",
        ["oracle"],
        [("H = 8", "d-h8"), ("H = 32", "d-h32"), ("H = 128", "d-h128")],
        [("H = 12", "r-h12"), ("H = 24", "r-h24"), ("H = 96", "r-h96")],
        METRICS,
    ),
    (
        "the gap grows as decisive tokens get sparser",
        ["oracle"],
        [("4 of 32", "d-k4"), ("2 of 32", "d-k2"), ("1 of 32", "d-h32")],
        [("4 of 24", "r-k4"), ("2 of 24", "r-k2"), ("1 of 24", "r-h24")],
        METRICS,
    ),
    (
        "the gap grows as the group shrinks",
        ["oracle"],
        [("G = 16", "d-g16"), ("G = 8", "d-h32"), ("G = 4", "d-g4")],
        [("G = 12, H = 24", "r-g12"), ("G = 8, H = 24", "r-h24"), ("G = 6, H = 24", "r-g6")],
        METRICS,
    ),
    (
        "TACO, EAPO, TIDE against GRPO at the longest horizon",
        ["oracle", "taco", "eapo", "tide"],
        [("H = 128", "d-h128")],
        [("H = 96", "r-h96")],
        METRICS,
    ),
    (
        "EAPO's collapses at H = 128: κ and the entropy quantiles (an investigation, not replicated)",
        ["eapo"],
        [
            ("κ = ln 4, quantiles (0.1, 0.9)", "d-h128"),
            ("κ = ln 2", "d-h128-eapo-k2"),
            ("quantiles (0.9, 0.999)", "d-h128-eapo-q"),
        ],
        None,
        METRICS,
    ),
    (
        "contamination (hitch)",
        ["grpo", "oracle", "taco", "stapo", "minp_support"],
        [("H = 16", "d-hitch")],
        [("H = 24", "r-hitch")],
        (LOG_GROWTH, *METRICS),
    ),
)


def stage_seeds(stage: str) -> list[int]:
    seed_set, part, *_ = STAGES[stage]
    return SEEDS[seed_set][part]


def stage_command(stage: str) -> list[str]:
    _, _, folder, args, _ = STAGES[stage]
    seeds = [str(s) for s in stage_seeds(stage)]
    return ["trl-credit", "lab", *args, "--seeds", *seeds, "--output_dir", f"docs/lab_evidence/{folder}"]


def _stage_log() -> dict:
    return json.loads(STAGE_LOG.read_text()) if STAGE_LOG.is_file() else {}


def run_stage(stage: str, commit: bool) -> None:
    import torch

    torch.set_num_threads(1)
    command = stage_command(stage)
    load_before, started = os.getloadavg(), time.monotonic()
    status = _results.run_stored_lab(EXPERIMENT, f"{command[-1]}/report.md", command[2:-2])
    if status:
        raise SystemExit(f"stage {stage}: trl-credit lab exited {status}")
    log = _stage_log()
    log[stage] = {
        "command": shlex.join(command),
        "wall_minutes": round((time.monotonic() - started) / 60, 1),
        "load_average_1min": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    STAGE_LOG.write_text(json.dumps(log, indent=1) + "\n")
    (OUTPUT / "report.md").write_text(aggregate())
    print(f"lab_evidence: stage {stage} took {log[stage]['wall_minutes']} min", flush=True)
    if commit:
        subprocess.run(["git", "add", str(OUTPUT), str(_results.RESULTS)], check=True)
        message = (
            f"lab_evidence: stage {stage} ({log[stage]['wall_minutes']} min, load {log[stage]['load_average_1min']})"
        )
        subprocess.run(["git", "commit", "-q", "-m", message], check=True)


# ---------------------------------------------------------------------------------------------- statistics


def _runs(folder: str) -> list[dict]:
    return _results.lab_runs(EXPERIMENT, f"docs/lab_evidence/{folder}/report.md")


def _metric(run: dict, metric: str) -> float:
    if metric == "mean_reward":
        return statistics.fmean(run["rewards"][:BUDGET])
    if metric == "log_rare_growth":
        return math.log(run["metrics"]["rare_prob_growth"])
    return float(run["metrics"][metric])


def _is_collapsed(run: dict) -> bool:
    return collapsed(run["metrics"]["final_reward"], run["metrics"]["avg@16"])


def _by_seed(runs: list[dict], method: str, metric: str) -> dict[int, float]:
    return {r["seed"]: _metric(r, metric) for r in runs if r["method"] == method}


def compare(folder: str, method: str, metric: str) -> dict | None:
    """The paired comparison of `method` with grpo in `folder`, or of grpo with 0 (None when either has no run)."""
    runs = _runs(folder)
    grpo_runs = _runs(BASELINE_FOLDER.get(folder, folder))
    values = _by_seed(runs, method, metric)
    baseline = dict.fromkeys(values, 0.0) if method == "grpo" else _by_seed(grpo_runs, "grpo", metric)
    seeds = sorted(set(values) & set(baseline))
    if not seeds:
        return None
    differences = [values[s] - baseline[s] for s in seeds]
    return {
        "interval": paired_difference(values, baseline),
        "p": paired_t_p_value(differences),
        "d_z": effect_size(differences),
        "collapsed": sum(_is_collapsed(r) for r in runs if r["method"] == method and r["seed"] in seeds),
        "collapsed_grpo": sum(_is_collapsed(r) for r in grpo_runs if r["method"] == "grpo" and r["seed"] in seeds),
        "n": len(seeds),
    }


def trend(first: str, last: str, metric: str) -> dict | None:
    """Whether the oracle − grpo gap differs between two levels of a sweep: the per-seed gaps at `last` minus those at
    `first`, Welch's interval and p-value (the levels are different tasks: their seeds are not paired)."""
    gaps = []
    for folder in (first, last):
        runs = _runs(folder)
        oracle, grpo = _by_seed(runs, "oracle", metric), _by_seed(runs, "grpo", metric)
        gaps.append([oracle[s] - grpo[s] for s in sorted(set(oracle) & set(grpo))])
    if not all(gaps):
        return None
    interval, p_value = welch_difference(*gaps)
    pooled_sd = math.sqrt((statistics.variance(gaps[0]) + statistics.variance(gaps[1])) / 2)
    return {
        "interval": interval,
        "p": p_value,
        "d_z": interval.mean / pooled_sd if pooled_sd else math.nan,  # Cohen's d: unpaired, so not d_z
        "collapsed": None,
        "n": f"{len(gaps[0])} + {len(gaps[1])}",
    }


def family(methods: list[str], levels: list[tuple[str, str]], metrics) -> dict:
    """`{(method, level index, metric): comparison}` with Holm-adjusted p-values over the whole family."""
    rows = {}
    for i, (_, folder) in enumerate(levels):
        for method in methods:
            for metric, _ in metrics:
                if method == "grpo" and metric != LOG_GROWTH[0]:
                    continue  # grpo against 0 only where 0 means "no change"
                result = compare(folder, method, metric)
                if result is not None:
                    rows[(method, i, metric)] = result
    if len(levels) > 1 and "oracle" in methods:
        for metric, _ in metrics:
            result = trend(levels[0][1], levels[-1][1], metric)
            if result is not None:
                rows[("trend", len(levels) - 1, metric)] = result
    for key, adjusted in zip(rows, holm([r["p"] for r in rows.values()])):
        rows[key]["p_holm"] = adjusted
    return rows


def verdict(discovery: dict | None, replication: dict | None, investigation: bool = False) -> str:
    if discovery is None or discovery["p_holm"] >= ALPHA:
        return "no finding"
    if investigation:
        return "finding, not replicated (an investigation)"
    if replication is None:
        return "not yet run"
    same_sign = (discovery["interval"].mean > 0) == (replication["interval"].mean > 0)
    if replication["p_holm"] < ALPHA:
        return "**replicated**" if same_sign else "refuted"
    return "not replicated"


def _cell(result: dict | None) -> str:
    if result is None:
        return "–"
    star = " *" if result["p_holm"] < ALPHA else ""
    size = "d" if result["collapsed"] is None else "d_z"
    collapses = (
        "" if result["collapsed"] is None else f", collapsed {result['collapsed']} vs {result['collapsed_grpo']}"
    )
    return (
        f"{result['interval'].format()}{star}<br>{size} {result['d_z']:.2f}, p_Holm {result['p_holm']:.3g}, "
        f"n {result['n']}{collapses}"
    )


def aggregate() -> str:
    lines = [
        "# The lab's claims at 20 seeds, with a replication",
        "",
        "Written by `python benchmarks/lab_evidence.py`. Discovery seeds 0–19, replication seeds 1000–1019 "
        "(`benchmarks/lab_evidence_seeds.json`, committed before any stage ran), the replication at a neighbouring "
        "configuration. Each cell: the paired difference method − grpo on the same seed, mean ± 95 % t "
        "half-width; d_z, the mean difference over the standard deviation of the differences; p_Holm, the two-sided "
        "paired t test's p-value Holm-adjusted over every cell of its table (discovery and replication tables "
        f"adjusted separately; `*` when < {ALPHA}); the number of seeds; collapsed runs (final train reward or avg@16 "
        f"≤ {COLLAPSE_TOLERANCE}), the method's vs grpo's. A discovery cell with p_Holm < {ALPHA} is a finding; "
        "`replicated` when the replication cell at the paired level has the same sign with p_Holm < "
        f"{ALPHA}, `refuted` when the opposite sign, `not replicated` otherwise. A `grpo − 0` row tests GRPO's own "
        "change of the metric against 0 (one-sample t test). The last row of a sweep tests the claim that the gap "
        "changes along it: the per-seed gaps at the sweep's last level minus those at its first, with Welch's "
        "interval and p-value and Cohen's d (the difference over the pooled standard deviation), since the two "
        "levels' runs are not paired.",
        "",
    ]
    for title, methods, discovery_levels, replication_levels, metrics in TABLES:
        investigation = replication_levels is None
        replication_levels = replication_levels or []
        discovery = family(methods, discovery_levels, metrics)
        replication = family(methods, replication_levels, metrics)
        lines += [
            f"## {title}",
            "",
            "| method | discovery level | metric | discovery | replication level | replication | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        rows = [  # (row, key in the families, discovery level, replication level)
            (method, i, label, replication_levels[i][0] if i < len(replication_levels) else "–")
            for i, (label, _) in enumerate(discovery_levels)
            for method in methods
        ]
        if len(discovery_levels) > 1:  # keyed by the last level: see `family`
            last = len(discovery_levels) - 1
            replication_label = (
                f"{replication_levels[-1][0]} vs {replication_levels[0][0]}" if replication_levels else "–"
            )
            rows.append(("trend", last, f"{discovery_levels[-1][0]} vs {discovery_levels[0][0]}", replication_label))
        for method, i, label, replication_label in rows:
            for metric, metric_label in metrics:
                d, r = discovery.get((method, i, metric)), replication.get((method, i, metric))
                if d is None and r is None:
                    continue
                lines.append(
                    f"| {ROW_NAMES.get(method, method)} | {label} | {metric_label} | {_cell(d)} | "
                    f"{replication_label} | {_cell(r)} | {verdict(d, r, investigation)} |"
                )
        lines.append("")
    log = _stage_log()
    lines += [
        "## Stages",
        "",
        "One torch thread per run, one run at a time. Wall time of the whole stage; the 1-minute load average "
        "of the machine (2 cores, shared) at its start and end.",
        "",
        "| stage | command | wall time | load | finished | commit |",
        "|---|---|---|---|---|---|",
    ]
    for stage in STAGES:
        entry = log.get(stage)
        if entry is None:
            lines.append(f"| {stage} | `{shlex.join(stage_command(stage))}` | not run | | | |")
        else:
            lines.append(
                f"| {stage} | `{entry['command']}` | {entry['wall_minutes']} min | {entry['load_average_1min']} | "
                f"{entry['finished']} | {entry['commit']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=[])
    parser.add_argument("--next", type=int, default=0, help="run the next N stages not yet in the stage log")
    parser.add_argument("--list", action="store_true", help="print the stages and their estimated cost")
    parser.add_argument("--aggregate", action="store_true", help="only re-render docs/lab_evidence/report.md")
    parser.add_argument("--commit", action="store_true", help="git commit the stage's results and reports")
    args = parser.parse_args()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    done = _stage_log()
    if args.list:
        for stage, (seed_set, _, _, stage_args, seconds) in STAGES.items():
            runs = len(stage_seeds(stage)) * len(_methods(stage_args))
            state = "done" if stage in done else "to run"
            print(f"{stage:15} {seed_set:11} {runs:4} runs  ~{runs * seconds / 60:4.0f} min  {state}")
        return
    stages = list(args.stages) + [s for s in STAGES if s not in done and s not in args.stages][: args.next]
    if not args.aggregate:
        for stage in stages:
            run_stage(stage, args.commit)
    (OUTPUT / "report.md").write_text(aggregate())


def _methods(args: list[str]) -> list[str]:
    start = args.index("--methods") + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    return args[start:end]


if __name__ == "__main__":
    main()

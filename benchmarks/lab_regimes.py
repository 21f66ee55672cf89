"""The credit lab in the regime the papers claim: horizon, sparsity and group size against an oracle ceiling.

    python benchmarks/lab_regimes.py                 # every stage, in order; finished runs are not repeated
    python benchmarks/lab_regimes.py --stages hitch  # one stage
    python benchmarks/lab_regimes.py --aggregate     # only re-render docs/lab_regimes/report.md

Each stage is one `trl-credit lab` command whose results are one line of `results/lab_regimes.jsonl` and whose report
is `docs/lab_regimes/<stage>/report.md`. The Figure-3 stages train `grpo` (broadcast credit, the floor) and `oracle` (the task's decisive
tokens only, the ceiling) on the `mdp` task; `report.md` here puts their gaps side by side: per seed the paired
difference oracle - grpo, its 95 % t interval over seeds, and the difference between the two ends of each sweep
(Welch's 95 % interval), and the commands with their wall times.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import _results  # noqa: E402

from trl_credit.experiments.compare.stats import paired_difference, t_interval  # noqa: E402
from trl_credit.experiments.lab.metrics import gap_fraction, steps_until_solved, welch_difference  # noqa: E402

OUTPUT = _common.REPO_ROOT / "docs" / "lab_regimes"
EXPERIMENT = "lab_regimes"  # results/lab_regimes.jsonl
SEEDS = ["--seeds", "0", "1", "2", "3", "4"]
MDP = ["--tasks", "mdp", "--warm_up_steps", "200", "--eval_samples", "16", "--pass_k", "1", "4"]
STEPS = ["--max_steps", "60"]
STEPS_128 = ["--max_steps", "40"]  # the longest horizon costs 4x per step; both methods have settled by step 30
FLOOR_AND_CEILING = ["--methods", "grpo", "oracle"]

# (stage, lab arguments), in the order they run: the cheap and decisive ones first, so a partial run is usable.
STAGES = {
    "h8": [*FLOOR_AND_CEILING, *MDP, *STEPS, "--horizon", "8", *SEEDS],
    "h32": [*FLOOR_AND_CEILING, *MDP, *STEPS, "--horizon", "32", *SEEDS],
    "h128": [*FLOOR_AND_CEILING, *MDP, *STEPS_128, "--horizon", "128", *SEEDS],
    "hitch": [
        "--methods",
        "grpo",
        "oracle",
        "taco",
        "stapo",
        "minp_support",
        "--tasks",
        "hitch",
        "--horizon",
        "16",
        "--max_steps",
        "100",
        "--eval_samples",
        "16",
        "--pass_k",
        "1",
        "4",
        *SEEDS,
    ],
    "k2": [*FLOOR_AND_CEILING, *MDP, *STEPS, "--horizon", "32", "--decisive", "2", *SEEDS],
    "k4": [*FLOOR_AND_CEILING, *MDP, *STEPS, "--horizon", "32", "--decisive", "4", *SEEDS],
    "g4": [*FLOOR_AND_CEILING, *MDP, *STEPS, "--horizon", "32", "--num_generations", "4", *SEEDS],
    "g16": [*FLOOR_AND_CEILING, *MDP, *STEPS, "--horizon", "32", "--num_generations", "16", *SEEDS],
    # The same runs as h128 plus the three methods: run_lab reuses h128's grpo and oracle runs.
    "h128_methods": [
        "--methods",
        "grpo",
        "oracle",
        "taco",
        "eapo",
        "tide",
        *MDP,
        *STEPS_128,
        "--horizon",
        "128",
        *SEEDS,
    ],
}
STAGE_DIRS = {"h128_methods": "h128"}

# Each sweep of TACO's Figure 3: (claim, [(level label, stage)], the end at which the claim says the gap is larger).
SWEEPS = (
    ("the gap grows with the horizon H", [("H = 8", "h8"), ("H = 32", "h32"), ("H = 128", "h128")], "last"),
    (
        "the gap grows as decisive tokens get sparser (fewer of H = 32)",
        [("4 decisive", "k4"), ("2 decisive", "k2"), ("1 decisive", "h32")],
        "last",
    ),
    ("the gap grows as the group shrinks (H = 32)", [("G = 16", "g16"), ("G = 8", "h32"), ("G = 4", "g4")], "last"),
)
BUDGET = 40  # steps every stage ran: the gaps are taken over these
SOLVED_THRESHOLD, SOLVED_WINDOW = 0.8, 5  # the lab's defaults
CLOSING_STAGE, CLOSING_HORIZON, CLOSING_METHODS = "h128", 128, ("taco", "eapo", "tide")
GAP_METRICS = (
    ("mean_reward", f"mean train reward, steps 1-{BUDGET}", 1),
    ("steps_until_solved", f"steps until solved (unsolved by step {BUDGET} = {BUDGET + 1})", -1),
)
CLOSING_METRICS = (*GAP_METRICS, ("avg@16", "avg@16 after training (4 prompts × 16 samples)", 1))


def stage_page(stage: str) -> str:
    """The report page of `stage`'s folder, which names its line in results/lab_regimes.jsonl."""
    return f"docs/lab_regimes/{STAGE_DIRS.get(stage, stage)}/report.md"


def stage_runs(stage: str) -> list[dict]:
    """Every run stored in `stage`'s folder."""
    return _results.lab_runs(EXPERIMENT, stage_page(stage))


def run_stage(stage: str) -> None:
    status = _results.run_stored_lab(EXPERIMENT, stage_page(stage), STAGES[stage])
    if status:
        raise SystemExit(f"stage {stage}: trl-credit lab exited {status}")


def _values(stage: str, method: str, metric: str) -> dict[int, float]:
    """`{seed: metric}` over the first `BUDGET` steps of each run, so that stages with more steps compare."""
    values = {}
    for run in stage_runs(stage):
        if run["method"] != method or run["task"] != "mdp":
            continue
        rewards = run["rewards"][:BUDGET]
        if metric in run["metrics"] and metric not in ("mean_reward", "steps_until_solved"):
            values[run["seed"]] = float(run["metrics"][metric])  # measured after training, not over a budget
        elif metric == "mean_reward":
            values[run["seed"]] = statistics.fmean(rewards)
        else:
            solved = steps_until_solved(rewards, SOLVED_THRESHOLD, SOLVED_WINDOW)
            values[run["seed"]] = float(solved if solved is not None else BUDGET + 1)
    return values


def aggregate() -> str:
    lines = [
        "# The credit lab against an oracle: horizon, sparsity, group size",
        "",
        "Written by `python benchmarks/lab_regimes.py`. Every gap is taken over the first "
        f"{BUDGET} optimizer steps (the budget of the H = 128 stages; the others ran 60). Gap = oracle − grpo on the same seed (for steps until "
        "solved, grpo − oracle, so a positive gap always means the oracle is better); mean ± 95 % t half-width "
        "over seeds; `end − start` is the difference of the gaps at the two ends of a sweep with Welch's 95 % "
        "interval; `*` marks an interval that excludes 0.",
        "",
    ]
    for claim, levels, _ in SWEEPS:
        lines += [
            f"## {claim}",
            "",
            "| metric | " + " | ".join(label for label, _ in levels) + " | end − start |",
            "|---|" + "---|" * (len(levels) + 1),
        ]
        for metric, label, sign in GAP_METRICS:
            cells, per_level = [], []
            for _, stage in levels:
                oracle, grpo = _values(stage, "oracle", metric), _values(stage, "grpo", metric)
                difference = paired_difference(oracle, grpo) if sign > 0 else paired_difference(grpo, oracle)
                gaps = [sign * (oracle[s] - grpo[s]) for s in sorted(set(oracle) & set(grpo))]
                per_level.append(gaps)
                g, o = t_interval(list(grpo.values())), t_interval(list(oracle.values()))
                star = " *" if difference.n > 1 and difference.excludes_zero() else ""
                cells.append(f"{difference.format()}{star} (grpo {g.format()}, oracle {o.format()})")
            welch, _ = welch_difference(per_level[0], per_level[-1])
            end = "–" if welch.half_width is None else welch.format() + (" *" if welch.excludes_zero() else "")
            lines.append(f"| gap in {label} | " + " | ".join(cells) + f" | {end} |")
        lines.append("")
    lines += [
        f"## Fraction of the gap each method closes (H = {CLOSING_HORIZON}, one decisive fork, G = 8)",
        "",
        "Per seed (method − grpo) / (oracle − grpo), mean ± 95 % t half-width over the seeds with a gap; 0 is "
        "GRPO, 1 the oracle. Below each, the method's own value and its paired difference to GRPO.",
        "",
        "| method | " + " | ".join(label for _, label, _ in CLOSING_METRICS) + " |",
        "|---|" + "---|" * len(CLOSING_METRICS),
    ]
    for method in CLOSING_METHODS:
        cells = []
        for metric, _, _ in CLOSING_METRICS:
            values = {m: _values(CLOSING_STAGE, m, metric) for m in ("grpo", "oracle", method)}
            fraction = gap_fraction(values[method], values["grpo"], values["oracle"])
            delta = paired_difference(values[method], values["grpo"])
            star = " *" if delta.n > 1 and delta.excludes_zero() else ""
            cells.append(
                f"{fraction.format()}<br>({t_interval(list(values[method].values())).format()}; "
                f"Δ grpo {delta.format()}{star})"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += contamination()
    lines += [
        "## Commands and wall time",
        "",
        "Wall time: the sum of the stage's runs (`wall_seconds` in results/lab_regimes.jsonl: warm-up, training, "
        "evaluation), on the 2 shared CPU cores.",
        "",
        "| stage | command | runs | wall time |",
        "|---|---|---|---|",
    ]
    for stage, args in STAGES.items():
        command = shlex.join(
            ["trl-credit", "lab", *args, "--output_dir", f"docs/lab_regimes/{STAGE_DIRS.get(stage, stage)}"]
        )
        runs = _stage_runs(stage, args)
        seconds = sum(r["wall_seconds"] for r in runs)
        lines.append(f"| {stage} | `{command}` | {len(runs)} | {seconds / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def contamination() -> list[str]:
    """The `hitch` stage: the probability of `z` in correct responses, per method, against GRPO's."""
    runs = stage_runs("hitch")
    if not runs:
        return []
    methods = _methods(STAGES["hitch"])
    series = {m: {r["seed"]: [p for _, p in r["rare_probability"]] for r in runs if r["method"] == m} for m in methods}
    metrics = {
        "p(z) at the start": lambda ps: ps[0],
        "p(z) end / start": lambda ps: ps[-1] / ps[0],
        "p(z) peak / start": lambda ps: max(ps) / ps[0],
    }
    accuracy = {m: {r["seed"]: r["metrics"]["avg@16"] for r in runs if r["method"] == m} for m in methods}
    lines = [
        "## Positive-credit contamination (`hitch`, H = 16, 100 steps)",
        "",
        "`z` (never rewarded, in TACO's tail) makes the key, and so success, likely. Probability of `z` in a "
        "fixed set of correct responses, probed every 10 steps; mean ± 95 % t half-width over seeds, `Δ` paired "
        "to GRPO on the same seed.",
        "",
        "| method | " + " | ".join(metrics) + " | avg@16 |",
        "|---|" + "---|" * (len(metrics) + 1),
    ]
    for method in methods:
        cells = []
        for name, metric in metrics.items():
            values = {seed: metric(ps) for seed, ps in series[method].items()}
            base = {seed: metric(ps) for seed, ps in series["grpo"].items()}
            text = t_interval(list(values.values())).format()
            if method != "grpo" and name != "p(z) at the start":
                delta = paired_difference(values, base)
                text += f"<br>Δ {delta.format()}{' *' if delta.n > 1 and delta.excludes_zero() else ''}"
            cells.append(text)
        acc = t_interval(list(accuracy[method].values())).format()
        if method != "grpo":
            delta = paired_difference(accuracy[method], accuracy["grpo"])
            acc += f"<br>Δ {delta.format()}{' *' if delta.n > 1 and delta.excludes_zero() else ''}"
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {acc} |")
    return lines + [""]


def _methods(args: list[str]) -> list[str]:
    start = args.index("--methods") + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    return args[start:end]


def _stage_runs(stage: str, args: list[str]) -> list[dict]:
    """The runs of `stage`."""
    methods = set(_methods(args))
    if stage in STAGE_DIRS:  # a stage adding methods to another stage's folder counts only its additions
        methods -= set(_methods(STAGES[STAGE_DIRS[stage]]))
    return [r for r in stage_runs(stage) if r["method"] in methods]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    parser.add_argument("--aggregate", action="store_true", help="only re-render docs/lab_regimes/report.md")
    args = parser.parse_args()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    if not args.aggregate:
        import torch

        torch.set_num_threads(1)
        for stage in args.stages:
            started = time.monotonic()
            run_stage(stage)
            (OUTPUT / "report.md").write_text(aggregate())
            print(f"lab_regimes: stage {stage} took {(time.monotonic() - started) / 60:.1f} min", flush=True)
    (OUTPUT / "report.md").write_text(aggregate())


if __name__ == "__main__":
    main()

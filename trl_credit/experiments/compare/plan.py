"""The plan of `trl-credit compare`: its configuration, one training run per (method, seed), and each run's state.

A run is `python -m trl_credit.cli.grpo [--config RECIPE] --method M --seed S --output_dir OUT/runs/M-seedS [flags]`,
the same flags for every run. TRL seeds the prompt sampler (`RepeatSampler(seed=args.seed)`) and `trl-credit grpo`
seeds its data subsample from `--seed`, so every method sees the same prompts in the same order for the same seed.

A run folder is in one of three states (`run_state`): `done` (`.done` exists, written by compare after a
successful exit), `resume` (a `checkpoint-*` folder exists: the run restarts with `--resume_from_checkpoint` on the
latest) or `fresh`. `run.json` records the arguments a run was started with; a run is never resumed with others.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...methods import DEFAULT_COMPARISON

DONE_MARKER = ".done"
RUN_RECORD = "run.json"
EVAL_SUMMARY = "eval.json"  # picked up by model cards (`trl_credit.reports.model_card.load_eval_summaries`)
BASELINE = "grpo"
# Flags compare sets itself for each run; passing them through would make every run identical or unresumable.
OWNED_FLAGS = {
    "--method": "--methods",
    "--seed": "--seeds",
    "--output_dir": "--output_dir (compare's folder; each run gets OUTPUT_DIR/runs/METHOD-seedSEED)",
    "--resume_from_checkpoint": "nothing: compare resumes interrupted runs from their latest checkpoint itself",
}
# Measured for the quick start (`trl-credit grpo --method taco`, configs/quickstart.yaml) in a fresh clone on the 2-core
# CPU machine: SmolLM2-135M, 30 steps of 8 completions of <= 48 tokens in 228 s, model loading included.
QUICKSTART_SECONDS_PER_STEP = 228 / 30
QUICKSTART_TOKENS_PER_STEP = 8 * 48


class CompareUsageError(Exception):
    """A bad `trl-credit compare` command line: one line, exit code 2, before any training."""


@dataclass
class CompareConfig:
    """Configuration of `trl-credit compare`. Flags not listed here are passed to every `trl-credit grpo` run.

    Parameters that select the runs:
        methods (`list[str]`, *optional*, defaults to `["grpo", "taco", "eapo", "tide"]`): methods, each passed as
            `trl-credit grpo --method NAME`; differences are reported against `grpo` when it is among them.
        seeds (`list[int]`, *optional*, defaults to `[0, 1, 2]`): one run per method and seed (`--seed`).
        config (`str`, *optional*): recipe passed to every run as `--config`; without it `trl-credit grpo` uses
            its packaged quick start.
        output_dir (`str`, *optional*, defaults to `"compare_results"`): runs go to `OUTPUT_DIR/runs/M-seedS`, the
            report to `OUTPUT_DIR/report.md` and `OUTPUT_DIR/report.html`.
        dry_run (`bool`, *optional*, defaults to `False`): print the plan and its estimated cost, then exit.

    Parameters of the held-out evaluation (`trl-credit eval` on each final model):
        skip_eval (`bool`, *optional*, defaults to `False`): report training curves and costs only.
        eval_dataset_name (`str`, *optional*): defaults to the training data set, whose `test` split is then used.
        eval_split (`str`, *optional*): defaults to the held-out split, as `trl-credit eval`'s `dataset_split`.
        eval_num_problems (`int`, *optional*, defaults to `100`): seeded subset, the same for every run.
        eval_n (`int`, *optional*, defaults to `4`), eval_k (`list[int]`, *optional*): samples per problem and
            the k of pass@k (default 1, 2, 4, ..., n).
        eval_temperature, eval_top_p, eval_max_new_tokens, eval_seed, eval_batch_size, eval_backend: as
            `trl-credit eval`'s options; `eval_max_new_tokens` defaults to the runs' `max_completion_length`.
    """

    methods: list[str] = field(
        default_factory=lambda: list(DEFAULT_COMPARISON),
        metadata={"help": "Methods to compare, each passed to `trl-credit grpo --method`."},
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds; one run per method each."})
    config: str | None = field(default=None, metadata={"help": "Recipe passed to every run as --config."})
    output_dir: str = field(default="compare_results", metadata={"help": "Folder of the runs and the report."})
    dry_run: bool = field(default=False, metadata={"help": "Print the plan and its estimated cost; train nothing."})
    skip_eval: bool = field(default=False, metadata={"help": "Do not evaluate the final models."})
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Held-out data set; defaults to the training data set's test split."}
    )
    eval_split: str | None = field(default=None, metadata={"help": "Held-out split (default: test)."})
    eval_num_problems: int = field(default=100, metadata={"help": "Problems evaluated (seeded subset, same for all)."})
    eval_n: int = field(default=4, metadata={"help": "Samples per problem."})
    eval_k: list[int] | None = field(default=None, metadata={"help": "k of pass@k; default 1, 2, 4, ..., n."})
    eval_temperature: float = field(default=0.6, metadata={"help": "Sampling temperature of the evaluation."})
    eval_top_p: float = field(default=0.95, metadata={"help": "Nucleus mass of the evaluation."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Tokens per evaluation completion; default: max_completion_length."}
    )
    eval_seed: int = field(default=0, metadata={"help": "Seed of the evaluation problems and sampling."})
    eval_batch_size: int = field(default=8, metadata={"help": "Prompts per generate call."})
    eval_backend: Literal["transformers", "vllm"] = field(default="transformers", metadata={"help": "Eval backend."})

    def __post_init__(self):
        for name in ("methods", "seeds"):
            values = getattr(self, name)
            if not values:
                raise CompareUsageError(f"--{name} needs at least one value")
            duplicates = sorted({v for v in values if values.count(v) > 1}, key=str)
            if duplicates:
                raise CompareUsageError(f"--{name} lists {', '.join(map(str, duplicates))} more than once")
        bad = [m for m in self.methods if not m.strip() or m.startswith("-")]
        if bad:
            raise CompareUsageError(f"--methods: {bad[0]!r} is not a method name")
        if self.eval_num_problems < 1 or self.eval_n < 1:
            raise CompareUsageError(
                f"--eval_num_problems and --eval_n must be >= 1, got {self.eval_num_problems} and {self.eval_n}"
            )


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------


def run_name(method: str, seed: int) -> str:
    """`taco-seed0`; characters unsafe in a folder name become `_` (`eapo+taco` stays as it is)."""
    return f"{re.sub(r'[^A-Za-z0-9._+-]', '_', method)}-seed{seed}"


@dataclass(frozen=True)
class RunSpec:
    """One training run of the comparison."""

    method: str
    seed: int
    output_dir: Path
    config: str | None
    passthrough: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.output_dir.name

    def grpo_argv(self) -> list[str]:
        """The `trl-credit grpo` arguments of this run (without any resume flag)."""
        recipe = ["--config", self.config] if self.config else []
        return [
            *recipe,
            "--method",
            self.method,
            "--seed",
            str(self.seed),
            "--output_dir",
            str(self.output_dir),
            *self.passthrough,
        ]

    def command(self, resume_from: Path | None = None) -> list[str]:
        """The subprocess command line; `resume_from` adds `--resume_from_checkpoint`."""
        resume = ["--resume_from_checkpoint", str(resume_from)] if resume_from is not None else []
        return [sys.executable, "-m", "trl_credit.cli.grpo", *self.grpo_argv(), *resume]


# The quick start saves the final model only; without a recipe of its own, a comparison keeps a resume point per run.
RESUMABLE = ("--save_strategy", "steps", "--save_steps", "10", "--save_total_limit", "1")


def build_runs(config: CompareConfig, passthrough: list[str]) -> list[RunSpec]:
    """One `RunSpec` per (method, seed), seeds outermost so that early results already pair every method."""
    runs_dir = Path(config.output_dir) / "runs"
    sets_saving = any(arg.replace("-", "_").startswith("__save_strategy") for arg in passthrough)
    if config.config is None and not sets_saving:
        passthrough = [*RESUMABLE, *passthrough]
    return [
        RunSpec(method, seed, runs_dir / run_name(method, seed), config.config, tuple(passthrough))
        for seed in config.seeds
        for method in config.methods
    ]


def check_passthrough(passthrough: list[str]) -> None:
    """Refuse flags compare owns and unknown `--eval_*` flags (the others are `trl-credit grpo`'s to judge)."""
    for arg in passthrough:
        if not arg.startswith("--"):
            continue
        flag = "--" + arg[2:].split("=", 1)[0].replace("-", "_")  # argparse also accepts `--output-dir`
        if flag in OWNED_FLAGS:
            raise CompareUsageError(f"{flag} is set by compare for each run; use {OWNED_FLAGS[flag]}")
        if flag.startswith("--eval_"):
            raise CompareUsageError(f"unknown evaluation option {flag}; see trl-credit compare --help")


def _checkpoint_number(path: Path) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(match.group(1)) if match and path.is_dir() else -1


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The `checkpoint-N` folder of `run_dir` with the largest `N`, or `None`."""
    checkpoints = [p for p in run_dir.glob("checkpoint-*") if _checkpoint_number(p) >= 0]
    return max(checkpoints, key=_checkpoint_number) if checkpoints else None


RunStateName = Literal["done", "resume", "fresh"]


def run_state(run_dir: Path) -> tuple[RunStateName, Path | None]:
    """`("done", None)`, `("resume", latest checkpoint)` or `("fresh", None)` for a run folder."""
    if (run_dir / DONE_MARKER).is_file():
        return "done", None
    checkpoint = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    return ("resume", checkpoint) if checkpoint is not None else ("fresh", None)


def check_recorded_arguments(spec: RunSpec) -> None:
    """Refuse to continue a run folder that was started with other arguments (`run.json`)."""
    record_path = spec.output_dir / RUN_RECORD
    if not record_path.is_file():
        return
    recorded = json.loads(record_path.read_text()).get("grpo_argv")
    if recorded is not None and recorded != spec.grpo_argv():
        raise CompareUsageError(
            f"{spec.output_dir} was started with other arguments ({shlex.join(recorded)}); use another "
            "--output_dir or delete that run folder"
        )


# ---------------------------------------------------------------------------------------------------------------
# Cost
# ---------------------------------------------------------------------------------------------------------------


def measured_step_seconds(runs_dir: Path) -> tuple[float | None, int]:
    """Mean TRL `step_time` over every logged step of the runs already in `runs_dir`, and the number of steps."""
    from ...reports.plots import find_trainer_state, metric_series

    times: list[float] = []
    for run_dir in sorted(p for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []:
        try:
            state = json.loads(find_trainer_state(run_dir).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        times += metric_series(state.get("log_history", []), "step_time")[1]
    return (sum(times) / len(times), len(times)) if times else (None, 0)


def estimate_cost(
    runs: list[RunSpec],
    states: dict[str, tuple[str, Path | None]],
    training_args,
    model_name: str,
    num_eval_samples: int | None,
) -> list[str]:
    """Lines describing the plan's cost: steps, completions, evaluation samples and a rough time, with its basis."""
    max_steps = training_args.max_steps
    completions_per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    remaining = [run for run in runs if states[run.name][0] != "done"]
    lines = [f"runs: {len(runs)} ({len(runs) - len(remaining)} done, {len(remaining)} to train)"]
    if max_steps <= 0:
        lines.append("steps: set by num_train_epochs (max_steps is not set): not estimated")
        return lines
    steps_left = 0
    for run in remaining:
        checkpoint = states[run.name][1]
        steps_left += max_steps - (_checkpoint_number(checkpoint) if checkpoint is not None else 0)
    lines.append(
        f"optimizer steps: {max_steps} per run x {len(runs)} runs = {max_steps * len(runs)}; {steps_left} left, "
        f"{completions_per_step} completions of <= {training_args.max_completion_length} tokens each per process"
    )
    if num_eval_samples:
        lines.append(f"evaluation: {num_eval_samples} sampled completions per run")
    seconds, measured_steps = measured_step_seconds(runs[0].output_dir.parent)
    if seconds is not None:
        basis = f"mean TRL step_time of {measured_steps} steps already logged in this output folder"
    elif model_name.lower() == "smollm2-135m-instruct" and training_args.use_cpu:
        tokens = completions_per_step * training_args.max_completion_length
        seconds = QUICKSTART_SECONDS_PER_STEP * tokens / QUICKSTART_TOKENS_PER_STEP
        basis = (
            f"the quick start's measurement ({QUICKSTART_SECONDS_PER_STEP:.1f} s/step on 2 CPU cores), scaled by "
            "completion tokens per step"
        )
    else:
        lines.append("time: no estimate until one step has run on this machine (rerun --dry_run after the first run)")
        return lines
    hours = steps_left * seconds / 3600
    lines.append(
        f"time: roughly {hours:.2f} h of training ({seconds:.2f} s/step x {steps_left} steps), from {basis}; "
        "model loading and evaluation come on top. A rough estimate: step times vary with completion lengths."
    )
    return lines

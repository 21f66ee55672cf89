"""The plan of `trl-credit compare`: its configuration, one training run per (method, seed), and each run's state.

A run is `python -m trl_credit.cli.grpo [--config RECIPE] --method M --seed S --output_dir OUT/runs/M-seedS [flags]`.
Every run gets the same flags, except a method's own hyperparameters (`--taco_alpha 0.05`, or the entries of
`--credit_kwargs`), which go to the runs whose method stack has that method only (`route_method_settings`). The
settings that the single-method recipes change (`COMMON_SETTINGS`: TRL's clip-higher bound `epsilon_high`) are passed
to every run with one value unless the user sets them, so that the method is the only difference between runs.
TRL seeds the prompt sampler (`RepeatSampler(seed=args.seed)`) and `trl-credit grpo` seeds its data subsample from
`--seed`, so every method sees the same prompts in the same order for the same seed.

A run folder is in one of three states (`run_state`): `done` (`.done` exists, written by compare after a
successful exit, when the run's checkpoints are deleted: its final model is in the run folder), `resume` (a
`checkpoint-*` folder exists: the run restarts with `--resume_from_checkpoint` on the latest) or `fresh`. `run.json` records the arguments a run was started with; a run is never resumed with others.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...cli import UsageError
from ...cli.grpo_arguments import _given_options, _normalise_options
from ...cli.parsing import read_recipe
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


class CompareUsageError(UsageError):
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
# Settings whose default differs between the configs `trl-credit grpo --method NAME` trains with (a method's
# single-method config may carry its paper's recipe), passed to every run with one value unless the flags or the
# recipe set them. `epsilon_high`: the method configs with a paper recipe use DAPO's clip-higher bound 0.28, the plain
# config TRL's default (unset: the upper bound is `epsilon`, 0.2). 0.28 keeps each method's own recipe and gives the
# baseline the same clipping; `check_same_settings` refuses any other setting that would differ between methods.
COMMON_SETTINGS = {"epsilon_high": "0.28"}


def _option_names(args: list[str]) -> set[str]:
    """The option names among `args`, spelt as `trl-credit grpo` reads them (`--taco-alpha=0.05` -> `taco_alpha`)."""
    return _given_options(_normalise_options(args))


def _option_groups(argv: list[str]) -> list[list[str]]:
    """`["--a", "1", "--b", "x", "y", "--c"]` -> `[["--a", "1"], ["--b", "x", "y"], ["--c"]]`: each option with the
    values that follow it (as argparse reads them: up to the next `--` option)."""
    groups: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def _method_stack(method: str):
    from ...methods import CREDIT_METHODS, get_credit_method, parse_credit_methods
    from ...trainer.pairs import trainable_methods

    try:
        names = parse_credit_methods(method)
        trainable = trainable_methods()
        for name in names:  # a method registered for another trainer (the lab's `oracle`) is no run of compare
            if name in CREDIT_METHODS and name not in trainable:
                raise ValueError(
                    f"{name} is registered for another trainer than trl-credit grpo's; trainable: grpo, "
                    f"{', '.join(sorted(trainable))}"
                )
        return [get_credit_method(name) for name in names]
    except ValueError as error:  # an unknown name: the same words as `trl-credit grpo --method` would print
        message = str(error).split("; registered: ", 1)[0]
        if message != str(error):
            message += f"; trainable: grpo, {', '.join(sorted(trainable_methods()))}"
        raise CompareUsageError(f"the {method} runs would fail: --method {method!r}: {message}") from error


def route_method_settings(methods: list[str], passthrough: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Split the flags passed through into the ones every run gets and each method's own.

    A flag naming a method's hyperparameter (`--taco_alpha 0.05`) goes to the runs whose stack has that method only,
    and `--credit_kwargs JSON` gives each run the entries its stack owns (as `trl-credit lab` does). A name that no
    compared method owns is refused: it would be an error in every run, or silently read by none.
    """
    from ...methods import CREDIT_METHODS
    from ...trainer.config import parse_credit_kwargs
    from ..lab.lab_runs import method_credit_kwargs

    stacks = {method: _method_stack(method) for method in methods}
    shared: list[str] = []
    own: dict[str, list[str]] = {method: [] for method in methods}
    for group in _option_groups(passthrough):
        name = next(iter(_option_names(group[:1])), "")
        if name == "credit_kwargs":
            raw = group[0].split("=", 1)[1] if "=" in group[0] else " ".join(group[1:])
            try:
                credit_kwargs = parse_credit_kwargs(raw) or {}
                routed = {method: method_credit_kwargs(method, credit_kwargs) for method in methods}
            except ValueError as error:
                raise CompareUsageError(f"--credit_kwargs: {error}") from error
            orphans = [key for key in credit_kwargs if not any(key in entries for entries in routed.values())]
            if orphans:
                raise CompareUsageError(
                    f"--credit_kwargs: {orphans[0]!r} is not a hyperparameter of the compared methods "
                    f"({', '.join(methods)})"
                )
            for method, entries in routed.items():
                if entries:
                    own[method] += ["--credit_kwargs", json.dumps(entries)]
            continue
        owners = {h: m.name for m in CREDIT_METHODS.values() for h in m.argument_names}
        hyperparameter = name[3:] if name not in owners and name.startswith("no_") else name  # `--no_x`: x false
        owner = owners.get(hyperparameter)
        if owner is None:
            shared += group
            continue
        receivers = [m for m in methods if any(hyperparameter in part.argument_names for part in stacks[m])]
        if not receivers:
            raise CompareUsageError(
                f"--{name} is an option of {owner}, which none of the compared methods ({', '.join(methods)}) has"
            )
        for method in receivers:
            own[method] += group
    return shared, own


def _recipe_keys(recipe: str | None) -> set[str]:
    """The keys of the recipe (a file or a packaged name), or none when it cannot be read (`trl-credit grpo` then
    reports why)."""
    if recipe is None:
        return set()
    try:
        return set(read_recipe(recipe)[2])
    except UsageError:
        return set()


def common_settings(config: CompareConfig, shared: list[str]) -> dict[str, str]:
    """The `COMMON_SETTINGS` that neither the flags passed through nor the recipe set: compare passes these."""
    given = _option_names(shared) | _recipe_keys(config.config)
    return {name: value for name, value in COMMON_SETTINGS.items() if name not in given}


def build_runs(config: CompareConfig, passthrough: list[str]) -> list[RunSpec]:
    """One `RunSpec` per (method, seed), seeds outermost so that early results already pair every method."""
    runs_dir = Path(config.output_dir) / "runs"
    shared, own = route_method_settings(config.methods, passthrough)
    given = _option_names(shared)
    if config.config is None and "save_strategy" not in given:  # a resume point, in the settings the flags leave
        pairs = zip(RESUMABLE[::2], RESUMABLE[1::2])
        shared = [*(arg for name, value in pairs if name[2:] not in given for arg in (name, value)), *shared]
    pinned = [arg for name, value in common_settings(config, shared).items() for arg in (f"--{name}", value)]
    return [
        RunSpec(method, seed, runs_dir / run_name(method, seed), config.config, (*pinned, *shared, *own[method]))
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


def checkpoint_number(path: Path) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(match.group(1)) if match and path.is_dir() else -1


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The `checkpoint-N` folder of `run_dir` with the largest `N`, or `None`."""
    checkpoints = [p for p in run_dir.glob("checkpoint-*") if checkpoint_number(p) >= 0]
    return max(checkpoints, key=checkpoint_number) if checkpoints else None


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


# Names that differ between the runs of a comparison by design: the method, its own hyperparameters, the run folder.
_PER_RUN = {"method", "credit_method", "credit_kwargs", "output_dir", "logging_dir", "run_name"}


def _settings(script_args, training_args, model_args) -> dict:
    from dataclasses import asdict

    from ...methods import CREDIT_METHODS

    per_run = _PER_RUN | {name for m in CREDIT_METHODS.values() for name in m.argument_names}
    settings = {**asdict(script_args), **training_args.to_dict(), **asdict(model_args)}
    return {name: value for name, value in settings.items() if name not in per_run}


def check_same_settings(parsed: dict[str, tuple]) -> None:
    """Refuse a comparison whose runs would differ in anything but the method: `parsed` maps each method to its run's
    `(script_args, training_args, model_args)` as `trl-credit grpo` parses them."""
    (first, first_args), *others = ((method, _settings(*args[:3])) for method, args in parsed.items())
    for method, args in others:
        for name in sorted(set(first_args) | set(args)):
            if first_args.get(name) != args.get(name):
                raise CompareUsageError(
                    f"the {first} and {method} runs would differ in {name} ({first_args.get(name)!r} and "
                    f"{args.get(name)!r}): pass --{name} to set it for every run"
                )


def settings_lines(config: CompareConfig, passthrough: list[str], runs: list[RunSpec], training_args) -> list[str]:
    """What the runs share and what is a method's own, for the plan and the report."""
    shared, own = route_method_settings(config.methods, passthrough)
    pinned = common_settings(config, shared)
    upper = training_args.epsilon_high if training_args.epsilon_high is not None else training_args.epsilon
    if "epsilon_high" in pinned:
        origin = f"epsilon_high {pinned['epsilon_high']} is compare's common value; --epsilon_high sets another"
    elif "epsilon_high" in _option_names(shared):
        origin = "as --epsilon_high sets it"
    else:
        origin = f"as the recipe {config.config} sets it"
    lines = [
        f"Clipping: epsilon {training_args.epsilon:g}, epsilon_high {upper:g} in every run ({origin}).",
        "Every other setting is the same in every run, checked on each method's parsed arguments: the runs of a seed "
        "differ only in the method" + (" and its own hyperparameters:" if any(own.values()) else "."),
    ]
    lines += [f"{method} runs only: {shlex.join(flags)}" for method, flags in own.items() if flags]
    return lines

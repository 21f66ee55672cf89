"""`trl-credit compare`: train several credit methods over several seeds, evaluate them, and report with CIs.

    trl-credit compare --methods grpo taco eapo tide --seeds 0 1 2 --max_steps 30 --dry_run
    trl-credit compare --methods grpo taco --seeds 0 1 --config taco_qwen3_1.7b_base \
        --accelerate_config zero3 --eval_dataset_name math500 --eval_num_problems 200

Every flag that is not one of compare's own (`trl-credit compare --help`) is passed to each `trl-credit grpo` run,
except a method's hyperparameters (`--taco_alpha 0.05`, `--credit_kwargs JSON`), which go to that method's runs only.
The runs differ in nothing else: settings that single-method recipes change (the clip-higher bound `epsilon_high`)
get one value for every run unless set. Each run's arguments are checked by `trl-credit grpo`'s own parser, and the
evaluation data is loaded, before any training: bad input exits with status 2 and one line. Runs that finished are skipped and interrupted runs resume
from their latest checkpoint, so the same command can be repeated after an interruption.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import nullcontext

from ..experiments.compare.cost import estimate_cost, estimate_disk
from ..experiments.compare.plan import (
    CompareConfig,
    CompareUsageError,
    build_runs,
    check_passthrough,
    check_recorded_arguments,
    check_same_settings,
    run_state,
    settings_lines,
)
from . import one_line, owned_folder, run_command
from .outputs import check_output_folder
from .parsing import CommandParser, require_scipy

PROG = "trl-credit compare"


def parse(argv: list[str]) -> tuple[CompareConfig, list[str]]:
    """Compare's own options and the flags passed through to every run."""
    parser = CommandParser(
        CompareConfig,
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog="Any other flag is passed to every `trl-credit grpo` run (see `trl-credit grpo --method NAME --help`).",
    )
    config, passthrough = parser.parse_config(argv, passthrough=True)
    check_passthrough(passthrough)
    return config, passthrough


def validate_runs(config: CompareConfig, passthrough: list[str]):
    """Parse each method's run with `trl-credit grpo`'s parser, check that the runs differ only in the method, and
    return the first method's parsed arguments."""
    from .grpo import UsageError, parse_arguments

    parsed = {}
    for spec in build_runs(config, passthrough)[: len(config.methods)]:  # the first seed's runs: one per method
        try:
            parsed[spec.method] = parse_arguments(spec.grpo_argv())
        except UsageError as error:
            raise CompareUsageError(f"the {spec.method} runs would fail: {one_line(error)}") from error
    check_same_settings(parsed)
    return parsed[config.methods[0]]


def evaluation_settings(config: CompareConfig, script_args, training_args) -> dict:
    """The `EvalConfig` fields shared by every run, with a held-out split; raises `CompareUsageError` otherwise."""
    from ..data import SOURCES
    from ..experiments.evaluation import held_out_split

    dataset = config.eval_dataset_name or script_args.dataset_name
    same_data = dataset == script_args.dataset_name
    try:
        split = config.eval_split or held_out_split(dataset)
    except ValueError as error:
        raise CompareUsageError(f"evaluation: {one_line(error)}: pass --eval_split") from error
    if same_data:
        train_split = script_args.dataset_train_split or (SOURCES[dataset].splits[0] if dataset in SOURCES else None)
        if split is None or split == train_split:
            raise CompareUsageError(
                f"no held-out split of {dataset!r} to evaluate on (training uses split {train_split or 'train'}): "
                "pass --eval_dataset_name and/or --eval_split, or --skip_eval"
            )
    return {
        "dataset_name": dataset,
        "dataset_split": split,
        "prompt_column": script_args.prompt_column if same_data else None,
        "answer_column": script_args.answer_column if same_data else None,
        "system_prompt": script_args.system_prompt,
        "num_problems": config.eval_num_problems,
        "n": config.eval_n,
        "k": config.eval_k,
        "temperature": config.eval_temperature,
        "top_p": config.eval_top_p,
        "max_new_tokens": config.eval_max_new_tokens or training_args.max_completion_length,
        "seed": config.eval_seed,
        "batch_size": config.eval_batch_size,
        "backend": config.eval_backend,
    }


def check_evaluation(settings: dict) -> int:
    """Build the evaluation config and load its problems now, so that bad values fail before training."""
    from ..experiments.evaluation import EvalConfig, check_backend_available, prepare_eval_data

    try:
        eval_config = EvalConfig(model_name_or_path="unused", **settings)
        check_backend_available(eval_config.backend)
        return len(prepare_eval_data(eval_config).dataset)
    except ValueError as error:
        raise CompareUsageError(f"evaluation: {one_line(error)}") from error
    except Exception as error:  # noqa: BLE001 - an unknown Hub id, the Hub unreachable offline, an unreadable file
        raise CompareUsageError(f"evaluation: cannot load {settings['dataset_name']!r}: {one_line(error)}") from error


def main(argv: list[str] | None = None) -> int:
    """Run `trl-credit compare` with `argv` (without the command name); return the exit status."""
    return run_command(PROG, _compare, sys.argv[1:] if argv is None else list(argv))


def _compare(argv: list[str]) -> int:
    command = shlex.join(["trl-credit", "compare", *argv])
    config, passthrough = parse(argv)
    check_output_folder("compare", config.output_dir)
    # A comparison owns its folder while it runs (its runs own theirs); a dry run writes nothing.
    with nullcontext() if config.dry_run else owned_folder(config.output_dir):
        return _plan_and_execute(config, passthrough, command)


def _plan_and_execute(config: CompareConfig, passthrough: list[str], command: str) -> int:
    script_args, training_args, model_args, _ = validate_runs(config, passthrough)
    runs = build_runs(config, passthrough)
    eval_settings = None if config.skip_eval else evaluation_settings(config, script_args, training_args)
    num_problems = check_evaluation(eval_settings) if eval_settings else 0
    states = {}
    for spec in runs:
        states[spec.name] = run_state(spec.output_dir)
        check_recorded_arguments(spec)
    if not config.dry_run:
        require_scipy()  # the report's intervals: say so before training, not after
    num_eval_samples = num_problems * eval_settings["n"] if eval_settings else None
    print(f"{PROG}: plan ({len(runs)} runs; same seed = same prompts in the same order for every method)")
    for spec in runs:
        state, checkpoint = states[spec.name]
        label = {"done": "done, skipped", "fresh": "train"}.get(state) or f"resume from {checkpoint.name}"
        print(f"  {spec.name:<24} {label:<28} {shlex.join(spec.command(checkpoint))}")
    settings = settings_lines(config, passthrough, runs, training_args)
    for line in settings:
        print(f"  {line}")
    for line in estimate_cost(runs, states, training_args, model_args.model_name_or_path, num_eval_samples):
        print(f"  {line}")
    print(f"  {estimate_disk(runs, training_args, model_args)}")
    if training_args.save_strategy == "no":
        print("  warning: --save_strategy no: runs save no checkpoint, so an interrupted run restarts from scratch")
    if config.dry_run:
        return 0
    return execute(config, runs, eval_settings, script_args, command, settings)


def execute(
    config: CompareConfig, runs, eval_settings: dict | None, script_args, command: str, settings: list[str]
) -> int:
    from ..experiments.compare.compare_report import write_report
    from ..experiments.compare.runner import RunFailed, evaluate_run, execute_run
    from .grpo import training_dataset

    failures, overlaps, train_problems = [], [], {}
    for spec in runs:
        print(f"{PROG}: {spec.name}: {run_state(spec.output_dir)[0]}", flush=True)
        try:
            execute_run(spec)
        except RunFailed as error:
            print(f"{PROG}: {error}", file=sys.stderr)
            failures.append(spec.name)
            continue
        if eval_settings is None:
            continue
        if spec.seed not in train_problems:  # what the run trained on, as `trl-credit grpo` loads it
            train_problems[spec.seed] = set(training_dataset(script_args, spec.seed)["problem"])
        summary = evaluate_run(spec, eval_settings, train_problems[spec.seed])
        overlaps.append((summary.get("train_overlap"), summary["num_problems"]))
        metrics = {k: round(v, 4) for k, v in summary.items() if k.startswith(("avg@", "pass@"))}
        print(f"{PROG}: {spec.name}: evaluation {metrics}", flush=True)

    notes = list(settings)
    if eval_settings is not None:
        notes.append(
            f"Evaluation: {eval_settings['dataset_name']} (split {eval_settings['dataset_split'] or 'the file'}), "
            f"{eval_settings['num_problems']} problems (the same for every run), n={eval_settings['n']} samples "
            f"at temperature {eval_settings['temperature']}, at most {eval_settings['max_new_tokens']} new tokens."
        )
        known = [o for o in overlaps if o[0] is not None]
        if known and any(o[0] for o in known):
            notes.append(
                f"Held-out check: {min(o[0] for o in known)}-{max(o[0] for o in known)} of the evaluated problems "
                "also occur verbatim in a run's training data (a small procedural task repeats problems)."
            )
    if failures:
        notes.append(f"Failed runs (not in the tables): {', '.join(failures)}.")
    md_path, html_path = write_report(config.output_dir, runs, config.methods, notes, command)
    print(f"{PROG}: report written to {md_path} and {html_path}")
    if failures:
        print(
            f"{PROG}: {len(failures)} run(s) failed: {', '.join(failures)}; run the same command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command line of `trl-credit grpo`: one parser over the script's, the method's, TRL's model and the stack's
arguments, read from a YAML recipe and flags, each value checked and, when wrong, named as it was given.

Arguments are parsed with TRL's `TrlParser` over `CreditScriptArguments`, the method's config (`TACOConfig`, ...),
`ModelConfig`, and the hyperparameter dataclass of every method of the stack, whose values go to `credit_kwargs`:
YAML values are defaults and flags override them. `--config` is a file or a packaged recipe by name
(`trl_credit.resources`); without it, the packaged quick start (`configs/quickstart.yaml`) supplies the defaults.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from dataclasses import dataclass, field

from ..command_line import given_options, normalise_options, read_recipe
from . import UsageError  # the one usage error of every sub-command
from .grpo_checks import check_lora, check_no_evaluation, check_trainable, check_writable
from .grpo_launch import as_launched, launched_processes, stays_in_this_process
from .parsing import parse_with_recipe, refuse_repeated_options


@dataclass
class CreditScriptArguments:
    """Arguments of `trl-credit grpo` that are not training hyperparameters."""

    method: str | None = field(
        default=None,
        metadata={
            "help": "Credit method: grpo, a registered method (listed below), `package.module:name` to import "
            "a user method, or a '+'-separated stack of them. Defaults to the config's "
            "`method`/`credit_method`, else grpo.",
        },
    )
    dataset_name: str = field(
        default="chain_sum",
        metadata={
            "help": "Named source (gsm8k, math, math500, minerva, dapo-math-17k, aime24, aime25, amc23, "
            "olympiadbench, chain_sum), a Hub data set id, or a local .jsonl/.json/.parquet file."
        },
    )
    dataset_train_split: str | None = field(default=None, metadata={"help": "Split to train on (source default)."})
    prompt_column: str | None = field(default=None, metadata={"help": "Column holding the problem text."})
    answer_column: str | None = field(default=None, metadata={"help": "Column holding the gold answer."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system message for every prompt."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on this many rows (seeded sample)."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy"],
        metadata={"help": "Reward functions: accuracy, format, overlong, or dotted paths `pkg.module:func`."},
    )
    accelerate_config: str | None = field(
        default=None,
        metadata={
            "help": "Launch through `accelerate launch` with this config: a file or a packaged name "
            "(single_gpu, multi_gpu, zero2, zero3, fsdp2); `none` runs in this process, whatever the recipe names."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into an --output_dir that holds a finished run, replacing its model, card and state; "
            "without it such a folder is refused, also to a --resume_from_checkpoint."
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={"help": "Check every argument, the recipe and the accelerate config; then exit, loading nothing."},
    )

    def __post_init__(self):
        # YAML values reach here unconverted (`dataset_name: null`, `reward_funcs: accuracy`): refuse what no flag
        # could give, naming the argument (`parse_arguments` says whether it was a flag or a YAML key).
        from ..data import check_num_samples
        from ..methods import SettingError

        if isinstance(self.reward_funcs, str):  # `reward_funcs: accuracy`: the one reward function
            self.reward_funcs = [self.reward_funcs]
        if not isinstance(self.dataset_name, str) or not self.dataset_name:
            raise SettingError("dataset_name", f"must name a data set, got {self.dataset_name!r}")
        for name in ("dataset_train_split", "prompt_column", "answer_column", "system_prompt", "accelerate_config"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise SettingError(name, f"must be a string, got {getattr(self, name)!r}")
        if isinstance(self.accelerate_config, str) and stays_in_this_process(self.accelerate_config):
            self.accelerate_config = None
        if not (self.reward_funcs and isinstance(self.reward_funcs, list) and all(map(_is_name, self.reward_funcs))):
            raise SettingError("reward_funcs", f"must be a list of reward function names, got {self.reward_funcs!r}")
        twice = sorted({name for name in self.reward_funcs if self.reward_funcs.count(name) > 1})
        if twice:  # TRL would add its reward twice
            raise SettingError("reward_funcs", f"names {', '.join(twice)} more than once: give each function once")
        check_num_samples(self.dataset_name, self.max_train_samples, "max_train_samples")


def _is_name(value) -> bool:
    return isinstance(value, str) and bool(value)


def _peek_option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _resolve_method(argv: list[str], config: dict, config_path: str) -> str:
    """The method stack to train: `--method`, or its other name `--credit_method` (the config field it sets), else the
    config's `method`/`credit_method`, else grpo; each source named as given when it is bad or they disagree."""
    from ..methods import CREDIT_METHODS, get_credit_method, parse_credit_methods

    for flag in ("--method", "--credit_method"):
        if flag in argv and (argv[-1] == flag or argv[argv.index(flag) + 1].startswith("--")):
            raise UsageError(
                f"{flag} needs a value: grpo, {', '.join(CREDIT_METHODS)}, a '+'-separated stack of them, or "
                "package.module:name (`trl-credit grpo --help` describes each)"
            )
    flags = {
        f"--{name}": value
        for name in ("method", "credit_method")
        if (value := _peek_option(argv, f"--{name}")) is not None
    }
    in_config = {
        f"{key} (in {config_path})": _method_spec(config[key], f"{key} (in {config_path})")
        for key in ("method", "credit_method")
        if config.get(key) is not None
    }
    for given in (flags, in_config):
        if len(set(given.values())) > 1:
            raise UsageError(" and ".join(f"{k} {v!r}" for k, v in given.items()) + " differ: give the method once")
    if flags:
        origin, method = next(iter(flags.items()))
        if in_config and method not in in_config.values():
            raise UsageError(f"{origin} {method} was given with a config for method {next(iter(in_config.values()))}")
    else:
        origin, method = next(iter(in_config.items()), ("--method", "grpo"))
    try:
        for name in parse_credit_methods(method):
            get_credit_method(name)  # imports `package.module:name` modules, which register their methods
    except ValueError as error:
        raise UsageError(f"{origin} {method!r}: {error}") from error
    return method


def _method_spec(value, origin: str) -> str:
    """A method from YAML: a name, a '+'-separated stack, or a list of names."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise UsageError(f"{origin} must be a method name, a '+'-separated stack or a list of names, got {value!r}")
    return "+".join(str(v) for v in value)


def _stack(method: str):
    from ..methods import get_credit_method, parse_credit_methods

    return [get_credit_method(name) for name in parse_credit_methods(method)]


def _method_argument_classes(method: str) -> list[type]:
    """The hyperparameter dataclasses of the stack's methods: the parser converts their flags and YAML keys."""
    return [m.arguments for m in _stack(method) if m.arguments is not None]


def build_parser(method: str, method_given: bool = True, processes: int | None = None):
    """The parser of `trl-credit grpo --method METHOD`; its `--help` lists the stack's options first. With
    `processes`, the config is checked as that many launched processes will build it (`as_launched`)."""
    from trl import ModelConfig, TrlParser

    from ..resources import QUICK_START, recipes, yaml_names
    from ..trainer import trainer_pair
    from .parsing import read_negative_numbers_as_values

    config_class = trainer_pair(method)[0]
    if processes is not None:
        config_class = as_launched(config_class, processes)
    dataclass_types = (
        CreditScriptArguments,
        config_class,
        ModelConfig,
        *_method_argument_classes(method),
    )
    parser = TrlParser(
        dataclass_types,
        prog="trl-credit grpo",
        usage=f"%(prog)s {f'--method {method}' if method_given else '[--method METHOD]'} [--config CONFIG] [OPTIONS]",
        epilog=_methods_epilog(),
        formatter_class=_HelpFormatter,
        allow_abbrev=False,  # `--taco_alph` is a typo, not `--taco_alpha`
    )
    read_negative_numbers_as_values(parser)
    stack_options = {name for step in _stack(method) for name in step.argument_names}
    if stack_options:  # a group of its own, listed before TRL's hundreds of options
        group = parser.add_argument_group(f"options of {method}")
        for action in [a for a in parser._optionals._group_actions if a.dest in stack_options]:
            parser._optionals._group_actions.remove(action)
            group._group_actions.append(action)
        parser._action_groups.insert(0, parser._action_groups.pop())
    # The config field `--method` sets: accepted as its other name (`_resolve_method`), with the resolved default.
    credit_method = parser._option_string_actions["--credit_method"]
    credit_method.default = method
    credit_method.help = (
        "Another name for --method (the config field it sets); giving both with different values is an error."
    )
    # TrlParser reads `--config` itself; declared here only so that `--help` lists it.
    parser.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="YAML recipe of argument values (flags override them): a file, or a packaged recipe by name "
        f"({', '.join(yaml_names(recipes()))}). Without it, the packaged {QUICK_START} supplies the defaults shown here.",
    )

    def one_line_error(message: str):
        raise UsageError(message)

    parser.error = one_line_error  # argparse prints usage and a message; we want one clear line
    return parser


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help, as `HfArgumentParser`, and the methods list kept one per line."""


def _methods_epilog() -> str:
    from ..methods import CREDIT_METHODS
    from ..methods.names import label

    lines = [f"  {m.name:<14} {label(m)}: {m.summary}" for m in CREDIT_METHODS.values()]
    return "credit methods (`--method NAME --help` shows a method's options):\n" + "\n".join(lines)


class _Sources:
    """Where each argument of a command line came from, to name it in errors as the user wrote it."""

    def __init__(self, argv: list[str], config: dict, config_path: str | None):
        from ..trainer.config import parse_credit_kwargs

        self.flags, self.config, self.config_path = given_options(argv), config, config_path
        raw = _peek_option(argv, "--credit_kwargs")
        self.credit_kwargs_origin = "--credit_kwargs" if raw is not None else f"credit_kwargs in {config_path}"
        if raw is None:
            raw = config.get("credit_kwargs")
        try:
            self.credit_kwargs = parse_credit_kwargs(raw) or {}
        except ValueError as error:
            raise UsageError(f"{self.credit_kwargs_origin}: {error}") from None

    def flagged(self, name: str) -> bool:
        return name in self.flags or f"no_{name}" in self.flags  # `--no_x` sets a boolean x

    def given(self, name: str) -> bool:
        return self.flagged(name) or name in self.config

    def describe(self, name: str) -> str:
        if self.flagged(name):
            return f"--{name}"
        if name in self.config:
            return f"{name} (in {self.config_path})"
        if name in self.credit_kwargs:
            return f"{name} (in {self.credit_kwargs_origin})"
        return name


def _check_names(parser, method: str, sources: _Sources) -> None:
    """Refuse, with the close matches, flags and YAML keys that no option of this command has."""
    from ..methods import CREDIT_METHODS

    options = {s[2:] for s in parser._option_string_actions if s.startswith("--") and "-" not in s[2:]}
    given = [(f"--{name}", name) for name in sorted(sources.flags)]
    given += [(f"{key} (in {sources.config_path})", key) for key in sources.config if key != "env"]
    for shown, name in given:
        owner = next((m.name for m in CREDIT_METHODS.values() if name in m.argument_names), None)
        if owner is not None and owner not in {m.name for m in _stack(method)}:
            raise UsageError(f"{shown}: {name} is an option of {owner}, which is not in the method stack {method!r}")
        if name in options:
            continue
        close = difflib.get_close_matches(name, sorted(options), n=3, cutoff=0.75)
        hint = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
        raise UsageError(f"unknown option {shown}{hint} (`--method {method} --help` lists the options)")
    for name in sources.credit_kwargs:
        if sources.given(name):
            raise UsageError(f"{name} is given both as {sources.describe(name)} and in {sources.credit_kwargs_origin}")


def _merge_method_arguments(training_args, method_args: list, sources: _Sources) -> None:
    """Move the hyperparameters of the stack's methods given as YAML keys or flags (converted by the parser) into
    `credit_kwargs`, beside those given there, and resolve and check the whole stack again."""
    kwargs = dict(sources.credit_kwargs)
    for arguments in method_args:
        kwargs.update({name: value for name, value in vars(arguments).items() if sources.given(name)})
    training_args.credit_kwargs = kwargs
    training_args.validate_credit_fields()


def _safe_method_name(method: str) -> str:
    """A stack as a folder name: registered names only (`examples/m.py:boost` -> `boost`)."""
    from ..methods import parse_credit_methods

    names = [name.rsplit(":", 1)[-1] for name in parse_credit_methods(method)] or ["grpo"]
    return re.sub(r"[^A-Za-z0-9._+-]", "-", "+".join(names))


def parse_arguments(argv: list[str]):
    """Parse and validate the command line; return `(script_args, training_args, model_args, argv)`.

    `argv` comes back normalised (`--taco-alpha` -> `--taco_alpha`); its `--config` (none: the packaged quick start)
    stays as given, so that a process `accelerate launch` starts with it finds the same recipe.
    """
    from ..methods import SettingError

    argv = normalise_options(argv)
    refuse_repeated_options(argv)
    recipe, config_path, config = read_recipe(_peek_option(argv, "--config"))
    method = _resolve_method(argv, config, config_path)
    given = any(_peek_option(argv, f"--{key}") or config.get(key) for key in ("method", "credit_method"))
    processes = launched_processes(_peek_option(argv, "--accelerate_config") or config.get("accelerate_config"))
    parser = build_parser(method, method_given=given, processes=processes)
    sources = _Sources(argv, config, config_path)

    def argparse_error(message: str):  # "argument --x/--X: invalid float value: 'a lot'", maybe from the YAML
        found = re.match(r"argument --(\w+)\S*: (.*)", message)
        raise UsageError(f"{sources.describe(found[1])}: {found[2]}" if found else message)

    parser.error = argparse_error
    try:
        _check_names(parser, method, sources)
        script_args, training_args, model_args, *method_args = parse_with_recipe(
            parser, recipe, [*argv, "--credit_method", method]
        )
        training_args.credit_method = script_args.method = method
        _merge_method_arguments(training_args, method_args, sources)
        check_trainable(method, training_args)
    except SettingError as error:  # a value given as a flag, a YAML key or in credit_kwargs: name it as given
        problem = error.problem
        for name in error.mentions:
            problem = re.sub(rf"\b{name}\b", sources.describe(name), problem, count=1)
        raise UsageError(f"{sources.describe(error.name)} {problem}") from error
    except ValueError as error:  # dataclass validation (TRL's own, or the credit stack's order)
        raise UsageError(str(error).splitlines()[0]) from error
    if model_args.model_name_or_path is None:
        raise UsageError("--model_name_or_path is required (a Hub id, a local folder, or smollm2-135m-instruct)")
    if not sources.given("output_dir"):  # TRL's default, `trainer_output`, is one folder for every run
        model_name = model_args.model_name_or_path.rstrip("/").split("/")[-1]
        training_args.output_dir = os.path.join("outputs", f"{model_name}-{_safe_method_name(method)}")
    _check_against_the_run(script_args, training_args, model_args, sources)
    return script_args, training_args, model_args, argv


def _check_against_the_run(script_args, training_args, model_args, sources: _Sources) -> None:
    """What the config alone cannot check: the reward weights against the reward functions, the completion length
    against the model's context (read from its config.json, when it is on disk), the folders the run writes to and
    resumes from, evaluation (without evaluation data) and the LoRA settings (`grpo_checks.py`)."""
    from ..data.models import model_context_length
    from ..trainer.run_record import checkpoint_problem

    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(script_args.reward_funcs):
        raise UsageError(
            f"{sources.describe('reward_weights')} gives {len(weights)} weights for {len(script_args.reward_funcs)} "
            f"reward functions ({', '.join(script_args.reward_funcs)}): give one weight per function"
        )
    context = model_context_length(model_args.model_name_or_path, model_args.model_revision)
    if context is not None and training_args.max_completion_length >= context[0]:
        raise UsageError(
            f"{sources.describe('max_completion_length')} {training_args.max_completion_length} leaves no room for "
            f"the prompt in the model's context of {context[0]} positions (max_position_embeddings in {context[1]})"
        )
    if sources.given("save_steps") and training_args.save_strategy == "no":  # transformers would save nothing
        raise UsageError(
            f"{sources.describe('save_steps')} {training_args.save_steps:g} has no effect: "
            f"{sources.describe('save_strategy')} is 'no'; add --save_strategy steps to save checkpoints"
        )
    check_writable(training_args.output_dir, sources.describe("output_dir"))
    check_no_evaluation(training_args, sources)
    check_lora(model_args, sources)
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None and (problem := checkpoint_problem(checkpoint)):
        raise UsageError(f"{sources.describe('resume_from_checkpoint')} {checkpoint}: {problem}")

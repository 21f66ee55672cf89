"""`trl-credit grpo`: GRPO training with a token-level credit method, mirroring `trl grpo`.

    trl-credit grpo --method taco                                   # the offline CPU quickstart
    trl-credit grpo --config configs/taco_qwen3_1.7b_base.yaml      # a paper recipe on GPUs
    trl-credit grpo --method eapo --config my.yaml --learning_rate 2e-6 --accelerate_config zero3

Arguments are parsed with TRL's `TrlParser` over `CreditScriptArguments`, the method's config
(`TACOConfig`, ...), `ModelConfig`, and the hyperparameter dataclass of every other method of the stack, whose
values go to `credit_kwargs`: YAML values are defaults and flags override them. Without
`--config`, the packaged `configs/quickstart.yaml` supplies the defaults. With `--accelerate_config NAME|PATH`
(or `accelerate_config:` in the YAML) the command re-launches this module through `accelerate launch`.
Every argument is checked, and the data set is loaded, before any model is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field

import yaml

_LAUNCHED_ENV = "TRL_CREDIT_LAUNCHED"  # set in processes started by `accelerate launch` from this command


class UsageError(Exception):
    """A bad command line or config: reported as one line, exit code 2, before any model is loaded."""


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
            "(single_gpu, multi_gpu, zero2, zero3, fsdp2)."
        },
    )


def _peek_option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _read_yaml(path: str) -> dict:
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle) or {}
    except OSError as error:
        raise UsageError(f"cannot read --config {path!r}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise UsageError(f"--config {path!r} is not valid YAML: {error}".splitlines()[0]) from error
    if not isinstance(config, dict):
        raise UsageError(f"--config {path!r} must hold a YAML mapping of argument names to values")
    return config


def _resolve_method(argv: list[str], config: dict) -> str:
    from ..methods import get_credit_method, parse_credit_methods

    flag = _peek_option(argv, "--method")
    in_config = {_method_spec(config[k]) for k in ("method", "credit_method") if config.get(k) is not None}
    if len(in_config) > 1:
        raise UsageError(f"the config sets method and credit_method to different values: {sorted(in_config)}")
    method = flag or next(iter(in_config), "grpo")
    if flag and in_config and flag not in in_config:
        raise UsageError(f"--method {flag} was given with a config for method {next(iter(in_config))}")
    try:
        for name in parse_credit_methods(method):
            get_credit_method(name)  # imports `package.module:name` modules, which register their methods
    except ValueError as error:
        raise UsageError(f"--method {method!r}: {error}") from error
    return method


def _method_spec(value) -> str:
    """A method from YAML: a name, a '+'-separated stack, or a list of names."""
    return value if isinstance(value, str) else "+".join(str(v) for v in value)


def _stack(method: str):
    from ..methods import get_credit_method, parse_credit_methods

    return [get_credit_method(name) for name in parse_credit_methods(method)]


def _method_argument_classes(method: str, config_class) -> list[type]:
    """The hyperparameter dataclasses of the stack's methods that `config_class` does not declare as fields."""
    declared = set(config_class.__dataclass_fields__)
    return [m.arguments for m in _stack(method) if m.arguments is not None and not set(m.argument_names) <= declared]


def _check_other_methods_fields(method: str, config: dict, argv: list[str]) -> None:
    """Refuse hyperparameters of a method that is not in the stack: they would be silently ignored."""
    from ..methods import CREDIT_METHODS

    selected = {m.name for m in _stack(method)}
    for other in CREDIT_METHODS.values():
        if other.name in selected:
            continue
        for name in other.argument_names:
            if name in config or _peek_option(argv, f"--{name}") is not None:
                raise UsageError(f"{name} is an option of {other.name}, which is not in the method stack {method!r}")


def build_parser(method: str):
    from trl import ModelConfig, TrlParser

    from ..trainer import trainer_pair

    config_class = trainer_pair(method)[0]
    dataclass_types = (
        CreditScriptArguments,
        config_class,
        ModelConfig,
        *_method_argument_classes(method, config_class),
    )
    parser = TrlParser(
        dataclass_types,
        prog=f"trl-credit grpo --method {method}",
        epilog=_methods_epilog(),
        formatter_class=_HelpFormatter,
    )

    def one_line_error(message: str):
        raise UsageError(message)

    parser.error = one_line_error  # argparse prints usage and a message; we want one clear line
    return parser


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help, as `HfArgumentParser`, and the methods list kept one per line."""


def _methods_epilog() -> str:
    from ..methods import CREDIT_METHODS

    lines = [f"  {m.name:<14} {m.summary}" for m in CREDIT_METHODS.values()]
    return "credit methods (`--method NAME --help` shows a method's options):\n" + "\n".join(lines)


def _merge_method_arguments(training_args, method_args: list, config: dict, argv: list[str]) -> None:
    """Move the hyperparameters given as YAML keys or flags of the stack's methods into `credit_kwargs`, and check
    the whole stack again."""
    kwargs = dict(training_args.credit_kwargs or {})
    for arguments in method_args:
        for name, value in vars(arguments).items():
            if name not in config and not {f"--{name}", f"--no_{name}"} & {arg.split("=")[0] for arg in argv}:
                continue  # not given: the method's default applies
            if name in kwargs and kwargs[name] != value:
                raise UsageError(
                    f"{name} is given both as an option ({value!r}) and in credit_kwargs ({kwargs[name]!r})"
                )
            kwargs[name] = value
    training_args.credit_kwargs = kwargs or None
    try:
        training_args.validate_credit_fields()
    except ValueError as error:
        raise UsageError(str(error)) from error


def parse_arguments(argv: list[str]):
    """Parse and validate the command line; return `(script_args, training_args, model_args, argv)`.

    `argv` comes back with the quickstart config inserted when none was given.
    """
    from ..resources import packaged_dir

    config_path = _peek_option(argv, "--config")
    if config_path is None and not ({"-h", "--help"} & set(argv)):
        config_path = str(packaged_dir("configs") / "quickstart.yaml")
        argv = ["--config", config_path, *argv]
    config = _read_yaml(config_path) if config_path else {}
    method = _resolve_method(argv, config)
    parser = build_parser(method)
    try:
        # The config validates the whole stack (its order, its methods' credit_kwargs) as it is built.
        _check_other_methods_fields(method, config, argv)
        script_args, training_args, model_args, *method_args = parser.parse_args_and_config(
            [*argv, "--credit_method", method]
        )
    except ValueError as error:  # unknown flags or YAML keys, dataclass validation (e.g. taco_alpha range)
        message = str(error).splitlines()[0]
        message = message.replace("Some specified arguments are not used by the HfArgumentParser", "unknown arguments")
        raise UsageError(message) from error
    training_args.credit_method = script_args.method = method
    _merge_method_arguments(training_args, method_args, config, argv)
    if model_args.model_name_or_path is None:
        raise UsageError("--model_name_or_path is required (a Hub id, a local folder, or smollm2-135m-instruct)")
    if training_args.output_dir in (None, "trainer_output"):
        model_name = model_args.model_name_or_path.rstrip("/").split("/")[-1]
        training_args.output_dir = os.path.join("outputs", f"{model_name}-{method}")
    return script_args, training_args, model_args, argv


def launch_with_accelerate(accelerate_config: str, argv: list[str]) -> int:
    """Re-run this module under `accelerate launch`, as `trl grpo` does with its own script."""
    from ..resources import accelerate_config_path

    try:
        config_file = accelerate_config_path(accelerate_config)
    except ValueError as error:
        raise UsageError(str(error)) from error
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config_file),
        "-m",
        "trl_credit.cli.grpo",
        *argv,
    ]
    print(f"trl-credit: launching {' '.join(command)}", flush=True)
    return subprocess.call(command, env={**os.environ, _LAUNCHED_ENV: "1"})


def training_dataset(script_args, seed: int):
    """The prompts a run with these script arguments and seed trains on."""
    from ..data import load_math_dataset

    return load_math_dataset(
        script_args.dataset_name,
        script_args.dataset_train_split,
        prompt_column=script_args.prompt_column,
        answer_column=script_args.answer_column,
        system_prompt=script_args.system_prompt,
        num_samples=script_args.max_train_samples,
        seed=seed,
    )


def load_training_data(script_args, training_args):
    try:
        return training_dataset(script_args, training_args.seed)
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(str(error).splitlines()[0]) from error


def reward_summary(log_history: list[dict]) -> str:
    """Mean reward over the first and last third of the logged steps, and whether it went up."""
    rewards = [entry["reward"] for entry in log_history if "reward" in entry]
    if len(rewards) < 2:
        return "reward: not enough logged steps to compare"
    third = max(1, len(rewards) // 3)
    start, end = sum(rewards[:third]) / third, sum(rewards[-third:]) / third
    verdict = "improved" if end > start else "did not improve"
    return (
        f"reward {verdict}: mean {start:.3f} over the first {third} logged steps -> "
        f"{end:.3f} over the last {third} (change {end - start:+.3f}, {len(rewards)} steps)"
    )


def train(script_args, training_args, model_args) -> None:
    import torch
    from trl import get_peft_config, get_quantization_config

    from ..data import hub_dataset_id
    from ..models import resolve_model_path
    from ..rewards import get_reward_funcs
    from ..trainer import trainer_pair

    dataset = load_training_data(script_args, training_args)
    try:
        reward_funcs = get_reward_funcs(
            script_args.reward_funcs, max_completion_length=training_args.max_completion_length
        )
    except ValueError as error:
        raise UsageError(str(error)) from error
    if training_args.use_cpu:
        torch.set_num_threads(os.cpu_count() or 1)

    model_path = resolve_model_path(model_args.model_name_or_path)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }
    trainer_class = trainer_pair(script_args.method)[1]
    trainer = trainer_class(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.accelerator.print(
        f"trl-credit: {script_args.method} on {script_args.dataset_name} ({len(dataset)} prompts), "
        f"model {model_args.model_name_or_path}, output {training_args.output_dir}"
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json in the output folder: the curves, whether or not checkpoints were saved
    dataset_name = hub_dataset_id(script_args.dataset_name) or script_args.dataset_name
    trainer.create_model_card(dataset_name=dataset_name)
    trainer.accelerator.print(f"trl-credit: {reward_summary(trainer.state.log_history)}")
    trainer.accelerator.print(f"trl-credit: model, model card and plots saved to {training_args.output_dir}")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        script_args, training_args, model_args, argv = parse_arguments(argv)
        if script_args.accelerate_config and not os.environ.get(_LAUNCHED_ENV):
            return launch_with_accelerate(script_args.accelerate_config, argv)
        train(script_args, training_args, model_args)
    except UsageError as error:
        print(f"trl-credit grpo: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

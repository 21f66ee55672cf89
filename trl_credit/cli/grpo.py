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
import difflib
import importlib.util
import os
import re
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


def _given_options(argv: list[str]) -> set[str]:
    """The option names on the command line, without `--` (`--taco_alpha=0.05` -> `taco_alpha`)."""
    return {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--")}


def _normalise_options(argv: list[str]) -> list[str]:
    """`--taco-alpha 0.05` -> `--taco_alpha 0.05` and `--config=x` -> `--config x`: `HfArgumentParser` accepts
    both spellings, and every later step looks an option up by its underscore name."""
    normalised = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, equals, value = arg[2:].partition("=")
            arg = "--" + name.replace("-", "_") + equals + value
            if name == "config" and equals:
                normalised += ["--config", value]
                continue
        normalised.append(arg)
    return normalised


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
        allow_abbrev=False,  # `--taco_alph` is a typo, not `--taco_alpha`
    )
    # TrlParser reads `--config` itself; declared here only so that `--help` lists it.
    parser.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="YAML file of argument values (flags override them). Without it, the packaged quick start "
        "(configs/quickstart.yaml) supplies the defaults shown here.",
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


class _Sources:
    """Where each argument of a command line came from, to name it in errors as the user wrote it."""

    def __init__(self, argv: list[str], config: dict, config_path: str | None):
        from ..trainer.config import parse_credit_kwargs

        self.flags, self.config, self.config_path = _given_options(argv), config, config_path
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
    """Move the hyperparameters of the stack's methods given as YAML keys or flags into `credit_kwargs`, and
    resolve and check the whole stack again."""
    # Entries the config declares as fields (`TACOConfig.taco_alpha`) were merged into them when it was built.
    declared = type(training_args).__dataclass_fields__
    kwargs = {name: value for name, value in sources.credit_kwargs.items() if name not in declared}
    for arguments in method_args:
        kwargs.update({name: value for name, value in vars(arguments).items() if sources.given(name)})
    training_args.credit_kwargs = kwargs
    training_args.validate_credit_fields()


def _safe_method_name(method: str) -> str:
    """A stack as a folder name: registered names only (`examples/m.py:boost` -> `boost`)."""
    from ..methods import parse_credit_methods

    names = [name.rsplit(":", 1)[-1] for name in parse_credit_methods(method)] or ["grpo"]
    return re.sub(r"[^A-Za-z0-9._+-]", "-", "+".join(names))


def check_before_loading(training_args, model_args) -> None:
    """What can be checked before any model or data set is loaded: the model reference and vLLM."""
    from ..data.models import check_model_reference

    try:
        check_model_reference(model_args.model_name_or_path)
    except ValueError as error:
        raise UsageError(f"--model_name_or_path: {error}") from error
    if training_args.use_vllm and importlib.util.find_spec("vllm") is None:
        raise UsageError(
            "--use_vllm true needs vLLM, which is not installed: pip install 'trl-credit[vllm]' (a GPU machine; "
            "vLLM 0.22-0.31 with transformers 5.17)"
        )


def parse_arguments(argv: list[str]):
    """Parse and validate the command line; return `(script_args, training_args, model_args, argv)`.

    `argv` comes back normalised (`--taco-alpha` -> `--taco_alpha`), with the quick-start config inserted when none
    was given.
    """
    from ..methods.registry import SettingError
    from ..resources import packaged_dir

    argv = _normalise_options(argv)
    config_path = _peek_option(argv, "--config")
    if config_path is None:
        config_path = str(packaged_dir("configs") / "quickstart.yaml")
        argv = ["--config", config_path, *argv]
    config = _read_yaml(config_path)
    method = _resolve_method(argv, config)
    parser = build_parser(method)
    sources = _Sources(argv, config, config_path)

    def argparse_error(message: str):  # "argument --x/--X: invalid float value: 'a lot'", maybe from the YAML
        found = re.match(r"argument --(\w+)\S*: (.*)", message)
        raise UsageError(f"{sources.describe(found[1])}: {found[2]}" if found else message)

    parser.error = argparse_error
    try:
        _check_names(parser, method, sources)
        script_args, training_args, model_args, *method_args = parser.parse_args_and_config(
            [*argv, "--credit_method", method]
        )
        training_args.credit_method = script_args.method = method
        _merge_method_arguments(training_args, method_args, sources)
    except SettingError as error:  # a value given as a flag, a YAML key or in credit_kwargs: name it as given
        raise UsageError(f"{sources.describe(error.name)} {error.problem}") from error
    except ValueError as error:  # dataclass validation (TRL's own, or the credit stack's order)
        raise UsageError(str(error).splitlines()[0]) from error
    if model_args.model_name_or_path is None:
        raise UsageError("--model_name_or_path is required (a Hub id, a local folder, or smollm2-135m-instruct)")
    if training_args.output_dir in (None, "trainer_output"):
        model_name = model_args.model_name_or_path.rstrip("/").split("/")[-1]
        training_args.output_dir = os.path.join("outputs", f"{model_name}-{_safe_method_name(method)}")
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


def _check_hub_dataset(source: str) -> None:
    """Fail fast when the data set would come from a Hub that cannot be reached (`datasets` retries for ~30 s)."""
    from huggingface_hub import constants, dataset_info

    from ..data import SOURCES, hub_dataset_id

    spec = SOURCES.get(source)
    repo = spec.location if spec is not None and spec.kind == "hub" else None if spec else hub_dataset_id(source)
    if repo is None or constants.HF_HUB_OFFLINE:  # offline, `datasets` reads its cache without retrying
        return
    try:
        dataset_info(repo, timeout=10)
    except Exception as error:  # noqa: BLE001 - not found, private, no network: the data cannot be fetched
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise UsageError(
            f"--dataset_name {source}: cannot fetch {repo} from the Hugging Face Hub ({reason})"
        ) from None


def load_training_data(script_args, training_args):
    _check_hub_dataset(script_args.dataset_name)
    try:
        return training_dataset(script_args, training_args.seed)
    except (ValueError, FileNotFoundError) as error:  # unknown source, bad split, missing column
        raise UsageError(str(error).splitlines()[0]) from error
    except Exception as error:  # noqa: BLE001 - `datasets` reports a Hub id missing from an offline cache so
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise UsageError(f"--dataset_name {script_args.dataset_name}: cannot load it ({reason})") from error


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
    from ..data.models import resolve_model_path
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
        check_before_loading(training_args, model_args)
        if training_args.use_cpu:  # else DeepSpeed, imported by accelerate whenever installed, announces its guess
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if script_args.accelerate_config and not os.environ.get(_LAUNCHED_ENV):
            return launch_with_accelerate(script_args.accelerate_config, argv)
        train(script_args, training_args, model_args)
    except UsageError as error:
        print(f"trl-credit grpo: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

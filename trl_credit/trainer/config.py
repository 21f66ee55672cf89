"""Configuration of the credit-assignment GRPO trainer."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments
from trl import GRPOConfig

from ..methods import (
    CREDIT_METHODS,
    GENERATION_STATISTICS,
    LOSS_FORWARD_STATISTICS,
    POLICY_LOGIT_GAP,
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    CreditMethod,
    SettingError,
    get_credit_method,
    parse_credit_methods,
    stack_hyperparameters,
)
from ..methods.stack import StackStep
from .batch_layout import statistic_key
from .field_domains import check_trl_fields, is_integer
from .owner_checks import SAMPLING_FLOATS, check_with_owners

# transformers 5.23 renamed `gradient_checkpointing` to `activation_checkpointing` (the old name stays an alias).
_TRANSFORMERS_NAMES_ACTIVATION_CHECKPOINTING = "activation_checkpointing" in {
    f.name for f in dataclasses.fields(TrainingArguments)
}


@dataclass
class CreditGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`CreditGRPOTrainer`]: every [`~trl.GRPOConfig`] parameter plus the token-level credit
    method and its hyperparameters. A method's hyperparameters are the fields of its `arguments` dataclass (in its
    file under `trl_credit/methods/`, with the papers' defaults); they live in `credit_kwargs`, whichever way they
    were given (Python, YAML keys, `--flags`, `TACOConfig(taco_alpha=...)`).

    Parameters:
        > Parameters that select the credit method

        credit_method (`str` or `list[str]`, *optional*, defaults to `"grpo"`):
            How the sequence advantage is spread over tokens: `"grpo"` (uniformly), a registered method (`"taco"`,
            `"eapo"`, `"tide"`, or one added with `register_credit_method`), `"package.module:name"` to import the
            module that registers `name`, or a stack such as `"eapo+taco"` / `["eapo", "taco"]`: methods apply in
            order, each reshaping the token advantages the previous one returned. Methods that read the generation
            batch must come before methods that read the training forward.
        credit_kwargs (`dict` or `str`, *optional*):
            Hyperparameters of the methods of the stack, e.g. `{"taco_alpha": 0.05, "eapo_kappa": 1.0}` (a JSON
            string on the command line); unset ones keep their defaults. Every hyperparameter starts with its
            method's name, so no two methods and no field of TRL's config share one. Values are converted to the
            declared types (`"5e-2"` -> `0.05`) and checked when the config is built. Afterwards this holds every
            hyperparameter of the stack, defaults included: the one record of what trains.

        > Parameters that control how statistics are computed

        statistics_token_chunk_size (`int`, *optional*, defaults to `1024`):
            Token positions per block when streaming the LM heads for deviation statistics.
        statistics_vocab_chunk_size (`int`, *optional*, defaults to `16384`):
            Vocabulary rows per block when streaming the LM heads (online log-sum-exp).

        > Parameters that control the token-credit log

        log_token_credit (`bool`, *optional*, defaults to `False`):
            Append per-token credit records of a few completions to `output_dir/token_credit.jsonl` at each logging
            step, for `trl-credit inspect`.
        token_credit_samples (`int`, *optional*, defaults to `4`):
            Completions recorded per logging step when `log_token_credit=True`.

        > Parameters that control resuming

        resume_with_other_method (`bool`, *optional*, defaults to `False`):
            Resume a checkpoint whose method stack or method hyperparameters (recorded in its `_trl_credit_run.json`)
            differ from this config's; the model card then lists which steps trained with which. Off, such a
            resume is refused before it loads.
    """

    credit_method: str = field(
        default="grpo",
        metadata={
            "help": "Token-level credit method: grpo, a registered method (`trl-credit grpo --help` lists them), "
            "'package.module:name', or a '+'-separated stack of them."
        },
    )
    credit_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Hyperparameters of the methods of the stack, e.g. '{\"taco_alpha\": 0.05}' (a JSON object)."
        },
    )
    statistics_token_chunk_size: int = field(
        default=1024,
        metadata={"help": "Token positions per block when streaming the LM heads (deviation statistics)."},
    )
    statistics_vocab_chunk_size: int = field(
        default=16384, metadata={"help": "Vocabulary rows per block when streaming the LM heads."}
    )
    # TRL's configs default the deprecated `gradient_checkpointing` to True, so transformers warns on every config that
    # sets neither name; unset here, and TRL's default applied under transformers' current name (`__post_init__`).
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated name of `activation_checkpointing`, which is on unless either is set false."},
    )
    if not _TRANSFORMERS_NAMES_ACTIVATION_CHECKPOINTING:
        # transformers < 5.23 (the releases vLLM 0.31/0.32 need) knows only `gradient_checkpointing`: the current
        # name is declared here so that one spelling works in Python, YAML and flags on every supported release.
        activation_checkpointing: bool | None = field(
            default=None,
            metadata={"help": "Recompute activations in the backward pass to save memory (TRL's default: on)."},
        )
    log_token_credit: bool = field(
        default=False,
        metadata={
            "help": "Write per-token credit of a few completions to output_dir/token_credit.jsonl when logging."
        },
    )
    token_credit_samples: int = field(
        default=4, metadata={"help": "Completions recorded per logging step when log_token_credit is on."}
    )
    resume_with_other_method: bool = field(
        default=False,
        metadata={
            "help": "Resume a checkpoint trained with another method stack or other method hyperparameters, "
            "continuing it with this config's; the model card lists which steps trained with which. Off: refused."
        },
    )

    def __post_init__(self):
        # Credit fields are checked first so that a bad value is reported before anything else is set up.
        if not isinstance(self.credit_method, str):  # a list from Python or YAML
            self.credit_method = "+".join(str(name) for name in self.credit_method)
        self.credit_kwargs = parse_credit_kwargs(self.credit_kwargs)
        self.validate_credit_fields()
        for name in SAMPLING_FLOATS:  # YAML's `temperature: 1` is an int; transformers' sampling wants the float
            if is_integer(getattr(self, name)):
                setattr(self, name, float(getattr(self, name)))
        self.validate_trl_fields()
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True  # TRL's default
        if None not in (self.activation_checkpointing, self.gradient_checkpointing) and (
            self.activation_checkpointing != self.gradient_checkpointing
        ):  # transformers would silently train with the new name's value
            raise SettingError(
                "activation_checkpointing",
                f"is {self.activation_checkpointing!r} but gradient_checkpointing, its older name, is "
                f"{self.gradient_checkpointing!r}: set one of them",
            )
        if not _TRANSFORMERS_NAMES_ACTIVATION_CHECKPOINTING:
            if self.activation_checkpointing is None:
                self.activation_checkpointing = self.gradient_checkpointing
            self.gradient_checkpointing = self.activation_checkpointing  # the name these releases read
        given_generation_batch = (self.generation_batch_size, self.steps_per_generation)
        try:
            super().__post_init__()
        except ValueError:
            if given_generation_batch == (None, None):
                self._check_generation_batch()
            raise
        check_with_owners(self)

    def _check_generation_batch(self) -> None:
        """The generation batch TRL derived (`GRPOConfig.__post_init__`) holds a partial group: say so in the fields
        the user set, not in `generation_batch_size`, which TRL derived from them."""
        if self.generation_batch_size is not None and self.generation_batch_size % self.num_generations:
            processes = self.generation_batch_size // (self.per_device_train_batch_size * self.steps_per_generation)
            raise SettingError(
                "per_device_train_batch_size",
                f"{self.per_device_train_batch_size} is not divisible by num_generations {self.num_generations}: "
                f"a generation batch (per_device_train_batch_size x gradient_accumulation_steps "
                f"{self.gradient_accumulation_steps} x {processes} processes = {self.generation_batch_size} completions) "
                "must hold whole groups",
                mentions=("num_generations", "gradient_accumulation_steps"),
            )

    @property
    def credit_stack(self) -> tuple[StackStep, ...]:
        """The stack as it trains, in the order it applies (empty for plain GRPO): each method with its
        hyperparameters as `credit_kwargs` holds them (resolved when the config was built) and the statistics they
        make it read."""
        return tuple(method.step(self.method_hyperparameters(method)) for method in self._stack_methods())

    def _stack_methods(self) -> tuple[CreditMethod, ...]:
        return tuple(get_credit_method(name) for name in parse_credit_methods(self.credit_method))

    def method_hyperparameters(self, method: CreditMethod) -> dict[str, Any]:
        """`method`'s hyperparameters as they train: its entries of `credit_kwargs`, which holds every hyperparameter
        of the stack once the config is built."""
        resolved = self.credit_kwargs or {}
        return {name: resolved[name] for name in method.argument_names}

    def validate_credit_fields(self) -> None:
        """Resolve and check every credit setting; raise `ValueError` naming the first bad one.

        Afterwards `credit_kwargs` holds every hyperparameter of the stack, converted to its declared type, defaults
        included (so `to_dict()` records what trains), or None when the stack has none.
        """
        try:
            stack = self._stack_methods()
        except ValueError as error:
            raise ValueError(f"credit_method: {error}") from None
        trl_fields = {f.name for f in dataclasses.fields(CreditGRPOConfig)}
        for method in stack:
            taken = sorted(set(method.argument_names) & trl_fields)
            if taken:
                raise ValueError(
                    f"credit method {method.name!r} declares {taken}, which {CreditGRPOConfig.__name__} (TRL's "
                    "GRPOConfig) also declares: rename the method's hyperparameters"
                )
        resolved = stack_hyperparameters(list(stack), self.credit_kwargs or {})
        self.credit_kwargs = {name: value for m in stack for name, value in resolved[m.name].items()} or None
        check_stack_order(self.credit_method, stack, resolved)
        for name in ("statistics_token_chunk_size", "statistics_vocab_chunk_size", "token_credit_samples"):
            if not (is_integer(getattr(self, name)) and getattr(self, name) >= 1):  # Python skips the parser's types
                raise SettingError(name, f"must be an integer >= 1, got {getattr(self, name)!r}")

    def __getattr__(self, name: str):
        # Reached only for a missing attribute: name where a method's hyperparameter lives.
        if any(name in method.argument_names for method in CREDIT_METHODS.values()):
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}: a method's hyperparameters are entries of "
                f"credit_kwargs (config.credit_kwargs[{name!r}])"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def validate_trl_fields(self) -> None:
        """Refuse values of TRL's own fields that no library checks before the model has loaded, or that transformers
        silently reinterprets (`field_domains.check_trl_fields`); the owners' checks (`check_with_owners`) run after
        TRL's `__post_init__`. `SettingError` names the field."""
        check_trl_fields(self)

    def credit_hyperparameters(self) -> dict:
        """The method stack and every method's hyperparameters, e.g. for model cards and run names."""
        values = {"credit_method": self.credit_method}
        for step in self.credit_stack:
            values.update(step.hyperparameters)
        return values


def parse_credit_kwargs(value: Any) -> dict[str, Any] | None:
    """`credit_kwargs` as given (a mapping, a JSON object string from YAML or the command line, or None) as a dict;
    `ValueError` naming what is wrong otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"credit_kwargs must be a JSON object, got {value!r} ({error})") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"credit_kwargs must be a mapping of hyperparameter names to values, got {value!r}")
    return value


def check_stack_order(spec: str, stack: tuple[CreditMethod, ...], hyperparameters: dict[str, dict]) -> None:
    """An advantage estimator comes first, and methods that read the generation batch before those that read the
    training forward; `ValueError` naming the stack otherwise."""
    late_estimators = [m.name for m in stack[1:] if m.estimates_advantages]
    if late_estimators:
        raise ValueError(
            f"credit_method {spec!r}: {', '.join(late_estimators)} computes the token advantages from the rewards, "
            "replacing what came before it: it must come first in the stack"
        )
    in_forward = [m.reads_training_forward(hyperparameters[m.name]) for m in stack]
    if in_forward != sorted(in_forward):
        stages = ", ".join(
            f"{m.name}: {'training forward' if f else 'generation batch'}" for m, f in zip(stack, in_forward)
        )
        raise ValueError(
            f"credit_method {spec!r}: methods that read the generation batch must come before methods that read the "
            f"training forward ({stages})"
        )


@dataclass(frozen=True)
class StagePlan:
    """Where each method of a stack runs and what the trainer gathers for it, decided once when a trainer is built.

    Args:
        generation: the methods that read only the generation batch, run once per generation batch.
        training_forward: the methods that read the current policy, run in the forward of each loss.
        generation_statistics: the statistics the trainer computes when a batch is generated.
        batch_statistics: the statistics that travel with the batch (those, and any a subclass puts there), by name:
            each one's batch key.
        deviation: the deviation statistic of the stack, whose reference model the trainer keeps (None if none).
        records_hidden: whether the training forward's final hidden states are recorded (`policy_logit_gap`).
        drops_tokens_in_forward: whether a method of the training forward may return a loss mask.
    """

    generation: tuple[StackStep, ...]
    training_forward: tuple[StackStep, ...]
    generation_statistics: tuple[str, ...]
    batch_statistics: dict[str, str]
    deviation: str | None
    records_hidden: bool
    drops_tokens_in_forward: bool


def plan_stages(args: CreditGRPOConfig, supplied_statistics: tuple[str, ...], trainer_name: str) -> StagePlan:
    """The stages of `args.credit_stack` for a trainer that supplies `supplied_statistics`; `ValueError` naming a
    statistic it does not supply, or a second deviation reference."""
    stack = args.credit_stack
    requested = [name for step in stack for name in step.statistics]
    for step in stack:
        missing = [name for name in step.statistics if name not in supplied_statistics]
        if missing:
            raise ValueError(
                f"credit method {step.method.name!r} reads {missing}, which {trainer_name} does not compute "
                f"(it supplies {list(supplied_statistics)})"
            )
    deviations = sorted({name for name in requested if name in (REFERENCE_DEVIATION, PREVIOUS_POLICY_DEVIATION)})
    if len(deviations) > 1:
        raise ValueError(f"credit_method {args.credit_method!r} needs two deviation references: {deviations}")
    in_forward = [step.method.reads_training_forward(step.hyperparameters) for step in stack]
    training_forward = tuple(step for step, forward in zip(stack, in_forward) if forward)
    return StagePlan(
        generation=tuple(step for step, forward in zip(stack, in_forward) if not forward),
        training_forward=training_forward,
        generation_statistics=tuple(name for name in GENERATION_STATISTICS if name in requested),
        batch_statistics={name: statistic_key(name) for name in requested if name not in LOSS_FORWARD_STATISTICS},
        deviation=deviations[0] if deviations else None,
        records_hidden=POLICY_LOGIT_GAP in requested,
        drops_tokens_in_forward=any(step.method.drops_tokens for step in training_forward),
    )

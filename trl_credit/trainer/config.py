"""Configuration of the credit-assignment GRPO trainer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from ..methods import get_credit_method
from ..methods.registry import CreditMethod, parse_credit_methods


@dataclass
class CreditGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`CreditGRPOTrainer`]: every [`~trl.GRPOConfig`] parameter plus the token-level credit
    method and its hyperparameters. A method's hyperparameters are the fields of its `arguments` dataclass (in its
    file under `trl_credit/methods/`, with the papers' defaults); they are set through `credit_kwargs`, or as fields
    of the single-method configs (`TACOConfig(taco_alpha=...)`).

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
            string on the command line); unset ones keep their defaults. A hyperparameter that this config declares
            as a field (`TACOConfig.taco_alpha`) is set there, not here.

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
    log_token_credit: bool = field(
        default=False,
        metadata={
            "help": "Write per-token credit of a few completions to output_dir/token_credit.jsonl when logging."
        },
    )
    token_credit_samples: int = field(
        default=4, metadata={"help": "Completions recorded per logging step when log_token_credit is on."}
    )

    def __post_init__(self):
        # Credit fields are checked first so that a bad value is reported before anything else is set up.
        if not isinstance(self.credit_method, str):  # a list from Python or YAML
            self.credit_method = "+".join(str(name) for name in self.credit_method)
        if isinstance(self.credit_kwargs, str):
            try:
                self.credit_kwargs = json.loads(self.credit_kwargs)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"credit_kwargs must be a JSON object, got {self.credit_kwargs!r} ({error})"
                ) from None
        if self.credit_kwargs is not None and not isinstance(self.credit_kwargs, dict):
            raise ValueError(
                f"credit_kwargs must be a mapping of hyperparameter names to values, got {self.credit_kwargs!r}"
            )
        self.validate_credit_fields()
        super().__post_init__()

    @property
    def credit_methods(self) -> tuple[CreditMethod, ...]:
        """The stack, in the order it applies (empty for plain GRPO)."""
        return tuple(get_credit_method(name) for name in parse_credit_methods(self.credit_method))

    def method_hyperparameters(self, method: CreditMethod) -> dict[str, Any]:
        return method.hyperparameters(self, self.credit_kwargs)

    def validate_credit_fields(self) -> None:
        """Raise `ValueError` naming the first credit setting outside its allowed range."""
        try:
            stack = self.credit_methods
        except ValueError as error:
            raise ValueError(f"credit_method: {error}") from None
        shadowed = sorted(name for name in self.credit_kwargs or {} if name in self.__dataclass_fields__)
        if shadowed:
            raise ValueError(
                f"credit_kwargs names {shadowed}, which {type(self).__name__} declares as fields: set "
                + ", ".join(f"{type(self).__name__}({name}=...)" for name in shadowed)
                + " instead"
            )
        known = {name for method in stack for name in method.argument_names}
        unknown = sorted(set(self.credit_kwargs or {}) - known)
        if unknown:
            raise ValueError(f"credit_kwargs names {unknown}, which no method of {self.credit_method!r} reads")
        for method in stack:
            method.check(self.method_hyperparameters(method))
        in_forward = [m.reads_training_forward(self.method_hyperparameters(m)) for m in stack]
        if in_forward != sorted(in_forward):
            raise ValueError(
                f"credit_method {self.credit_method!r}: methods that read the generation batch must come before "
                "methods that read the training forward ("
                + ", ".join(
                    f"{m.name}: {'training forward' if f else 'generation batch'}" for m, f in zip(stack, in_forward)
                )
                + ")"
            )
        for name in ("statistics_token_chunk_size", "statistics_vocab_chunk_size", "token_credit_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    def credit_hyperparameters(self) -> dict:
        """The method stack and every method's hyperparameters, e.g. for model cards and run names."""
        values = {"credit_method": self.credit_method}
        for method in self.credit_methods:
            values.update(self.method_hyperparameters(method))
        return values

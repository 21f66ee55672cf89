"""The credit-method interface: the statistics a method may read, what it returns, and the registry.

A credit method is one file holding three things:

* its hyperparameters, a dataclass of config fields with `help` and the paper's defaults;
* the per-token statistics it reads (names below);
* a pure function from a [`CreditBatch`] to a [`CreditResult`]: new `(B, T)` token advantages and, where the
  official method drops tokens from the loss, a per-token loss mask.

`@register_credit_method` makes it available as `credit_method="name"` in Python, YAML and the CLI. Methods stack
(`"eapo+taco"`): each sees the token advantages the previous one returned. Nothing here imports TRL.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Per-token statistics a method can ask for. Each is `(B, T)` float32, aligned with the completion tokens, zero
# at masked positions. The trainer computes each requested statistic once per batch from TRL's own forward
# (the model's full output transform, the sampling temperature, multimodal inputs).
POLICY_LOGPS = "policy_logps"  # log p of the sampled token under the current policy, from the training forward
POLICY_ENTROPY = "policy_entropy"  # full-vocabulary entropy (nats) of the current policy, from the training forward
# log p of the current policy's most likely token, so `policy_logps - policy_max_logprob = z_y - max_v z_v` (logits at
# the sampling temperature): the LM head streamed over the training forward's final hidden states
POLICY_MAX_LOGPROB = "policy_max_logprob"
ROLLOUT_LOGPS = "rollout_logps"  # the same for the policy that generated the batch, once per generation batch
ROLLOUT_ENTROPY = "rollout_entropy"
REFERENCE_DEVIATION = "reference_deviation"  # squared Hellinger distance to the frozen initial model
PREVIOUS_POLICY_DEVIATION = "previous_policy_deviation"  # ... to the policy of the previous generation batch
# 1.0 on the tokens the task's ground truth marks as deciding the reward, else 0. The trainer cannot compute it: only a
# trainer that knows the task supplies it (the credit lab's `LabTrainer`).
TASK_DECISIVE = "task_decisive"

LOSS_FORWARD_STATISTICS = (POLICY_LOGPS, POLICY_ENTROPY, POLICY_MAX_LOGPROB)
GENERATION_STATISTICS = (ROLLOUT_LOGPS, ROLLOUT_ENTROPY, REFERENCE_DEVIATION, PREVIOUS_POLICY_DEVIATION)
STATISTICS = LOSS_FORWARD_STATISTICS + GENERATION_STATISTICS + (TASK_DECISIVE,)


def _local(values_N: torch.Tensor) -> torch.Tensor:
    return values_N


@dataclass(frozen=True)
class CreditBatch:
    """What a credit method sees of a batch.

    Args:
        advantages_BT: incoming token advantages: `A_i` on every valid token for the first method of a stack,
            else the previous method's output. Zero at masked positions.
        sequence_advantages_B: GRPO's sequence advantages `A_i`, whatever ran before.
        mask_BT: bool, the valid completion positions (completion mask x tool mask).
        statistics: the statistics the method asked for, by name.
        vocab_size: rows of the policy's LM head.
        step: the optimizer step (`trainer.state.global_step`), for schedules.
        gather: returns the values of every process, concatenated (a collective: call it on every process). At
            generation it spans the whole generation batch; in the training forward, the micro-batches of one step.
        clip_range: `(epsilon_low, epsilon_high)` of the loss's PPO clip, for methods that must know which tokens
            the clipped objective already silences (Clip-Cov).
    """

    advantages_BT: torch.Tensor
    sequence_advantages_B: torch.Tensor
    mask_BT: torch.Tensor
    statistics: Mapping[str, torch.Tensor] = field(default_factory=dict)
    vocab_size: int | None = None
    step: int = 0
    gather: Callable[[torch.Tensor], torch.Tensor] = _local
    clip_range: tuple[float, float] = (0.2, 0.2)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.statistics:
            raise KeyError(f"statistic {name!r} was not requested; the method's `statistics` must list it")
        return self.statistics[name]

    @classmethod
    def from_sequence_advantages(cls, advantages_B: torch.Tensor, mask_BT: torch.Tensor, **kwargs) -> CreditBatch:
        """The batch a stack starts from: every valid token carries its response's advantage, as in GRPO."""
        mask_BT = mask_BT.bool()
        advantages_B = advantages_B.float()
        return cls(advantages_B.unsqueeze(1) * mask_BT, advantages_B, mask_BT, **kwargs)


# A per-token metric: a `(B, T)` tensor averaged over valid tokens, a `(numerator_BT, denominator_BT)` pair of
# masks whose sums give a ratio, or a float that is already the same on every process.
Metric = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | float


@dataclass
class CreditResult:
    """What a credit method returns.

    Args:
        advantages_BT: the new `(B, T)` token advantages.
        loss_mask_BT: optional `(B, T)` weights in `[0, 1]` that multiply the loss mask, as the official code of
            some baselines multiplies verl's `response_mask`: a dropped token also leaves the loss normaliser.
        metrics: diagnostics, logged as `<method>/<name>` and reduced over every process.
        statistic_BT: the per-token statistic shown in the token-credit view.
    """

    advantages_BT: torch.Tensor
    loss_mask_BT: torch.Tensor | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    statistic_BT: torch.Tensor | None = None


# A check of one hyperparameter: a predicate and the allowed values in words ("in (0, 1]").
Check = tuple[Callable[[Any], bool], str]


@dataclass(frozen=True, eq=False)
class CreditMethod:
    """A registered credit method. Build it with [`register_credit_method`]."""

    name: str
    function: Callable[..., CreditResult | torch.Tensor]
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]]
    arguments: type | None = None
    checks: Mapping[str, Check] = field(default_factory=dict)
    paper: Mapping[str, str] | None = None
    drops_tokens: bool = False

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.arguments)) if self.arguments else ()

    def hyperparameters(self, config: Any = None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The method's hyperparameters: config attributes of the same name, else `overrides`, else the defaults."""
        overrides = overrides or {}
        values = {}
        for f in dataclasses.fields(self.arguments) if self.arguments else ():
            if hasattr(config, f.name):
                values[f.name] = getattr(config, f.name)
            elif f.name in overrides:
                values[f.name] = overrides[f.name]
            else:
                values[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        return values

    def check(self, hyperparameters: Mapping[str, Any]) -> None:
        """Raise `ValueError` naming the first hyperparameter outside its allowed range."""
        for name, (ok, allowed) in self.checks.items():
            value = hyperparameters[name]
            if not ok(value):
                raise ValueError(f"{name} must be {allowed}, got {value!r}")

    def statistics_for(self, hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
        statistics = self.statistics(dict(hyperparameters)) if callable(self.statistics) else self.statistics
        return tuple(statistics)

    def reads_training_forward(self, hyperparameters: Mapping[str, Any]) -> bool:
        """Whether the method runs in the training forward (it reads the current policy) or at generation."""
        return any(name in LOSS_FORWARD_STATISTICS for name in self.statistics_for(hyperparameters))

    def __call__(self, batch: CreditBatch, hyperparameters: Mapping[str, Any]) -> CreditResult:
        result = self.function(batch, **hyperparameters)
        return result if isinstance(result, CreditResult) else CreditResult(advantages_BT=result)


CREDIT_METHODS: dict[str, CreditMethod] = {}


def register_credit_method(
    name: str,
    *,
    statistics: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = (),
    arguments: type | None = None,
    checks: Mapping[str, Check] | None = None,
    paper: Mapping[str, str] | None = None,
    drops_tokens: bool = False,
):
    """Register `function(batch: CreditBatch, **hyperparameters) -> CreditResult | Tensor` as credit method `name`.

    Args:
        name: what `credit_method` / `--method` calls it; its diagnostics are logged as `name/...`.
        statistics: the statistics it reads (the constants of this module), or a function of its
            hyperparameters returning them.
        arguments: a dataclass of its hyperparameters (config fields with `help` and defaults). Fields that
            `CreditGRPOConfig` does not declare are set through its `credit_kwargs`.
        checks: `{hyperparameter: (predicate, allowed values in words)}`, checked before training starts.
        paper: `{"title", "id" (arXiv id), "citation" (BibTeX)}`, for the model card.
        drops_tokens: whether it may return a `loss_mask_BT`.

    Registering a second, different function under an existing name is an error.
    """
    if not name.isidentifier():
        raise ValueError(f"credit method names must be Python identifiers (they prefix metrics), got {name!r}")
    if not callable(statistics):
        unknown = [s for s in statistics if s not in STATISTICS]
        if unknown:
            raise ValueError(f"unknown statistics {unknown} for credit method {name!r}; choose from {STATISTICS}")

    def decorator(function):
        method = CreditMethod(
            name, function, statistics if callable(statistics) else tuple(statistics), arguments,
            dict(checks or {}), paper, drops_tokens,
        )
        existing = CREDIT_METHODS.get(name)
        if existing is not None and _qualname(existing.function) != _qualname(function):
            raise ValueError(f"credit method {name!r} is already registered by {_qualname(existing.function)}")
        CREDIT_METHODS[name] = method
        return function

    return decorator


def _qualname(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def get_credit_method(name: str) -> CreditMethod:
    """The method registered as `name`; `"package.module:name"` imports the module first (it registers the method)."""
    if ":" in name:
        module_name, name = name.rsplit(":", 1)
        try:
            _import_user_module(module_name)
        except (ImportError, OSError) as error:
            raise ValueError(f"cannot import credit-method module {module_name!r}: {error}") from error
    if name not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {name!r}; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}")
    return CREDIT_METHODS[name]


def _import_user_module(module: str) -> None:
    """Import a dotted module name, or a `.py` file by path (e.g. `examples/custom_credit_method.py`)."""
    if not module.endswith(".py"):
        importlib.import_module(module)
        return
    path = Path(module).resolve()
    name = f"trl_credit_user_{path.stem}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise ImportError(f"no such file: {module}")
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])


def parse_credit_methods(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`"eapo+taco"` or `["eapo", "taco"]` -> `("eapo", "taco")`; `"grpo"` (no reshaping) drops out of a stack."""
    parts = spec.split("+") if isinstance(spec, str) else [p for s in spec for p in str(s).split("+")]
    parts = [p.strip() for p in parts]
    if not parts or any(not p for p in parts):
        raise ValueError(f"credit_method must name one method or a '+'-separated stack, got {spec!r}")
    names = tuple(p for p in parts if p != "grpo")
    if len(set(names)) != len(names):
        raise ValueError(f"credit_method lists a method twice: {spec!r}")
    return names

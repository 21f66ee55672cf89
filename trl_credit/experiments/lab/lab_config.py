"""The configuration of `trl-credit lab` (`LabConfig`) and how its `credit_kwargs` are shared out among the compared
methods (`method_credit_kwargs`, which `trl-credit compare` uses too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...methods import DEFAULT_COMPARISON, get_credit_method, parse_credit_methods
from ...methods.registry import resolve_stack
from ...trainer.config import parse_credit_kwargs
from .oracle import CEILING
from .tasks import COMPLETION_LENGTH, TASKS, get_task


@dataclass
class LabConfig:
    """Configuration of `trl-credit lab`.

    Parameters that select the runs:
        methods (`list[str]`, *optional*, defaults to `["grpo", "taco", "eapo", "tide"]`): credit methods, passed as
            `CreditGRPOConfig(credit_method=...)`; `oracle` (the lab's ground-truth credit) is the ceiling.
        tasks (`list[str]`, *optional*, defaults to `needle`, `fork`, `rare`): lab tasks (also `mdp`, `hitch`).
        horizon (`int`, *optional*, defaults to `8`): completion length in tokens, for every task.
        decisive (`int`, *optional*, defaults to `1`): number of decisive positions (forks) of `fork` and `mdp`;
            the other tasks take 1.
        seeds (`list[int]`, *optional*, defaults to `[0, 1, 2]`): one run per seed; the seed sets the initial
            model, the warm-up, the prompt order and sampling, identically for every method.

    Parameters that control training:
        max_steps (`int`, *optional*, defaults to `300`): optimizer steps per run.
        learning_rate (`float`, *optional*, defaults to `2e-3`): Adam learning rate of the RL phase.
        num_generations (`int`, *optional*, defaults to `8`): completions per prompt (the GRPO group size G), >= 2.
        prompts_per_step (`int`, *optional*, defaults to `4`): prompts per optimizer step.
        micro_batches (`int`, *optional*, defaults to `2`): gradient-accumulation micro-batches per step, between
            which the gradient-norm spread is measured.
        warm_up_steps (`int`, *optional*, defaults to `300`): distillation steps into the task's prior before RL.
        credit_kwargs (`dict` or `str`, *optional*): hyperparameters of the compared methods, by name (a JSON object
            on the command line); each run gets its own method's entries, the others keep the papers' defaults.

    Parameters that control measurement:
        solved_threshold (`float`, *optional*, defaults to `0.8`), solved_window (`int`, *optional*, defaults to
            `5`): a task is solved at the first step where the mean training reward of the last `solved_window`
            steps reaches `solved_threshold`.
        eval_samples (`int`, *optional*, defaults to `32`): completions sampled per prompt after training for avg@n
            and pass@k.
        pass_k (`list[int]`, *optional*, defaults to `[1, 8]`): the k of pass@k (each <= eval_samples).
        output_dir (`str`, *optional*, defaults to `"lab_results"`): where `results.json` and `report.md` go.
        overwrite_output_dir (`bool`, *optional*, defaults to `False`): replace the runs of a `results.json` that
            were trained with other settings (else such a folder is refused: `previous_records`).
    """

    methods: list[str] = field(
        default_factory=lambda: list(DEFAULT_COMPARISON),
        metadata={
            "help": "Credit methods to compare: CreditGRPOConfig.credit_method values, and the lab's "
            f"{CEILING!r} (the task's ground truth, the ceiling)."
        },
    )
    tasks: list[str] = field(
        default_factory=lambda: ["needle", "fork", "rare"], metadata={"help": f"Lab tasks: {', '.join(TASKS)}."}
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds; one run per seed."})
    horizon: int = field(
        default=COMPLETION_LENGTH,
        metadata={"help": "Horizon H: completion length in tokens of every task, 1 to 512."},
    )
    decisive: int = field(
        default=1,
        metadata={
            "help": "Sparsity: number of decisive positions (forks) of fork and mdp, 1 to H; other tasks take 1."
        },
    )
    max_steps: int = field(default=300, metadata={"help": "Optimizer steps per run."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Learning rate of the RL phase."})
    num_generations: int = field(default=8, metadata={"help": "Group size G: completions per prompt, >= 2."})
    prompts_per_step: int = field(default=4, metadata={"help": "Prompts per optimizer step."})
    micro_batches: int = field(default=2, metadata={"help": "Gradient-accumulation micro-batches per step."})
    warm_up_steps: int = field(default=300, metadata={"help": "Distillation steps into the task's prior before RL."})
    solved_threshold: float = field(default=0.8, metadata={"help": "Trailing mean reward that counts as solved."})
    solved_window: int = field(default=5, metadata={"help": "Steps in the trailing mean of `solved_threshold`."})
    eval_samples: int = field(default=32, metadata={"help": "Completions per prompt for avg@n and pass@k at the end."})
    pass_k: list[int] = field(default_factory=lambda: [1, 8], metadata={"help": "k of pass@k (<= eval_samples)."})
    output_dir: str = field(default="lab_results", metadata={"help": "Folder for results.json and report.md."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace the runs of an output_dir whose results.json holds runs with other settings."},
    )
    credit_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": 'Hyperparameters of the compared methods, as a JSON object (`{"eapo_kappa": 0.69}`); the '
            "others keep the papers' defaults. Each run gets its own method's entries; a name that no compared "
            "method owns is an error."
        },
    )

    def __post_init__(self):
        for name in ("methods", "tasks", "seeds"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name} must not be empty")
            duplicates = sorted({v for v in values if values.count(v) > 1})
            if duplicates:
                raise ValueError(f"{name} has duplicates: {duplicates}")
        self.credit_kwargs = parse_credit_kwargs(self.credit_kwargs)
        owners = {method: method_credit_kwargs(method, self.credit_kwargs) for method in self.methods}
        orphans = [k for k in self.credit_kwargs or {} if not any(k in owned for owned in owners.values())]
        if orphans:
            raise ValueError(
                f"credit_kwargs[{orphans[0]!r}] is not a hyperparameter of the compared methods {self.methods}"
            )
        for task in self.tasks:
            get_task(task, self.horizon, self.decisive)
        counts = ("max_steps", "num_generations", "prompts_per_step", "micro_batches", "eval_samples", "solved_window")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a group of two or more), got {self.num_generations}")
        if (self.prompts_per_step * self.num_generations) % self.micro_batches:
            raise ValueError(
                f"prompts_per_step * num_generations = {self.prompts_per_step * self.num_generations} completions "
                f"must split into micro_batches={self.micro_batches} equal micro-batches"
            )
        if not 0 < self.solved_threshold <= 1:  # every task's reward is 1.0 for a success, else 0.0: never solved
            raise ValueError(f"solved_threshold must be in (0, 1] (rewards are 0 or 1), got {self.solved_threshold}")
        if self.warm_up_steps < 0:
            raise ValueError(f"warm_up_steps must be >= 0, got {self.warm_up_steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        bad = [k for k in self.pass_k if not 1 <= k <= self.eval_samples]
        if bad:
            raise ValueError(f"every pass_k must be between 1 and eval_samples={self.eval_samples}; got {bad[0]}")


def method_credit_kwargs(method: str, credit_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The entries of `credit_kwargs` that `method` (a name or a `+` stack) owns, coerced and checked by it."""
    stack = [get_credit_method(name) for name in parse_credit_methods(method)]
    owned = {k: v for k, v in (credit_kwargs or {}).items() if any(k in m.argument_names for m in stack)}
    resolve_stack(stack, owned)  # a bad value fails here, before any run trains
    return owned

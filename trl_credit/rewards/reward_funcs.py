r"""Reward functions for math RL, in TRL's reward-function convention.

Every reward function has the signature `f(completions, solution, **kwargs) -> list[float | None]`, with one
value per completion. `completions` are conversational (`[[{"role": "assistant", "content": ...}], ...]`) or
plain strings; `solution` holds bare gold answers as produced by `trl_credit.data` (`"18"`, `"\frac{9}{7}"`).

- `accuracy`: 1.0 when the completion's answer equals the gold answer under Math-Verify (LaTeX and numeric
  equivalence: `\frac{1}{2}` = `0.5`, `1,000` = `1000`), else 0.0; `None` when the gold answer cannot be parsed.
  The answer is the last `\boxed{...}` of the completion, or, when there is none, its last number.
- `format`: 1.0 when the completion puts a non-empty answer in `\boxed{...}`, else 0.0.
- `overlong`: DAPO's soft overlong punishment (https://huggingface.co/papers/2503.14476, Eq. 13).

Answers are checked by `answer_checks.check_answers` (Math-Verify in a worker process with a time limit). A reward
function never raises on a bad completion: timeouts and parse failures score 0.0 and are counted by the reward object
that checked them (`AccuracyReward.unscored`), whose counts the trainer logs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from .answer_checks import DEFAULT_VERIFY_TIMEOUT_S, RewardStats, check_answers
from .answers import completion_text, last_boxed

# ---------------------------------------------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------------------------------------------


class AccuracyReward:
    r"""Math-Verify accuracy of the final answer (last `\boxed{}`, else last number): 1.0, 0.0, or `None`.

    `None` (gold answer unparseable) tells TRL to skip the sample for this reward. A callable class rather than
    a closure so that it pickles (TRL's async rollout worker sends reward functions to a spawned process).

    Args:
        timeout_s (`float`, *optional*, defaults to `5.0`): seconds one answer check may take.

    Attributes:
        unscored (`RewardStats`): answers this reward could not check normally, which `CreditGRPOTrainer` logs.
    """

    __name__ = "accuracy_reward"  # TRL logs rewards as `rewards/<__name__>/mean`

    def __init__(self, timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.unscored = RewardStats()

    def __call__(
        self, completions: list, solution: list[str], log_extra: Callable | None = None, **kwargs
    ) -> list[float | None]:
        checks = check_answers(
            [completion_text(c) for c in completions], solution, timeout_s=self.timeout_s, stats=self.unscored
        )
        if log_extra is not None:  # shown in TRL's completions table
            log_extra("extracted_answer", [check.extracted or "" for check in checks])
        return [None if check.status == "gold_unparseable" else float(check.correct) for check in checks]


accuracy_reward = AccuracyReward()


def format_reward(completions: list, **kwargs) -> list[float]:
    r"""1.0 when the completion has a closed, non-empty `\boxed{...}`, else 0.0."""
    return [float(last_boxed(completion_text(c)) is not None) for c in completions]


DAPO_MAX_COMPLETION_LENGTH = 20480
DAPO_OVERLONG_BUFFER = 4096


def soft_overlong_punishment(
    max_completion_length: int = DAPO_MAX_COMPLETION_LENGTH, overlong_buffer: int = DAPO_OVERLONG_BUFFER
) -> Callable:
    r"""DAPO's soft overlong punishment (https://huggingface.co/papers/2503.14476, Eq. 13), paper defaults.

    With `L = max_completion_length` and `B = overlong_buffer`, a completion of `|y|` tokens (read from the
    `completion_ids` TRL passes to reward functions) gets 0 for `|y| <= L - B`, `(L - B - |y|) / B` up to `L`,
    and -1 beyond. Delegates to TRL's picklable implementation, after checking the arguments.
    """
    if max_completion_length <= 0 or not 0 <= overlong_buffer < max_completion_length:
        raise ValueError(
            f"soft_overlong_punishment needs max_completion_length > 0 and 0 <= overlong_buffer < "
            f"max_completion_length; got {max_completion_length} and {overlong_buffer}"
        )
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len=max_completion_length, soft_punish_cache=overlong_buffer)


REWARD_FUNCS = {"accuracy": AccuracyReward, "format": format_reward, "overlong": soft_overlong_punishment}
"""Reward names accepted by `get_reward_funcs`. `accuracy` is built anew for each call (it counts its own unscored
answers), `overlong` from the trainer's max length."""

REWARD_RANGES = {
    accuracy_reward.__name__: (0.0, 1.0),  # 1 when the answer is right, else 0
    format_reward.__name__: (0.0, 1.0),  # 1 when the answer is boxed, else 0
    soft_overlong_punishment().__name__: (-1.0, 0.0),  # 0 within the length budget, down to -1 beyond it
}
"""The value range of each reward function above, by the name TRL logs it under (`rewards/<name>/mean`)."""


def _import_reward(path: str) -> Callable:
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        reward = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"cannot import reward function {path!r}: {error}") from error
    if not callable(reward):
        raise ValueError(f"reward function {path!r} is not callable")
    return reward


def get_reward_funcs(
    names: Sequence[str], *, max_completion_length: int | None = None, overlong_buffer: int | None = None
) -> list[Callable]:
    """Reward functions by name (`REWARD_FUNCS`) or dotted path (`pkg.module:func` or `pkg.module.func`).

    Args:
        names: e.g. `["accuracy", "format"]` or `["my_rewards:length_bonus"]`.
        max_completion_length: The trainer's completion budget; needed by `overlong`.
        overlong_buffer: Width of `overlong`'s linear zone; defaults to the paper's 4096 tokens, capped at a fifth
            of `max_completion_length` (the paper's ratio, 4096 / 20480) so that short runs keep a penalty-free zone.

    Raises:
        ValueError: an unknown name (listing the valid ones), an import failure, or `overlong` without a length.
    """
    funcs = []
    for name in names:
        if name == "overlong":
            if max_completion_length is None:
                raise ValueError("the 'overlong' reward needs max_completion_length")
            buffer = (
                min(DAPO_OVERLONG_BUFFER, max_completion_length // 5) if overlong_buffer is None else overlong_buffer
            )
            funcs.append(soft_overlong_punishment(max_completion_length, buffer))
        elif name == "accuracy":
            funcs.append(AccuracyReward())
        elif name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif "." in name or ":" in name:
            funcs.append(_import_reward(name))
        else:
            raise ValueError(
                f"unknown reward {name!r}; choose from {', '.join(REWARD_FUNCS)} or give a dotted path `pkg.module:func`"
            )
    return funcs

"""Reward functions for math RL in TRL's convention, and the Math-Verify answer checks behind them.

`answers` reads a completion's final answer (pure string functions), `answer_checks` checks it against the gold
answer with Math-Verify in a worker process with a time limit (`verify_worker.py`), and `reward_funcs` holds the
reward functions the CLI names (`accuracy`, `format`, `overlong`) and `get_reward_funcs`.
"""

from .answer_checks import DEFAULT_VERIFY_TIMEOUT_S, AnswerCheck, RewardStats, check_answers, parseable_golds, tally
from .answers import completion_text, extract_answer, last_boxed, normalize_answer
from .reward_funcs import (
    DAPO_MAX_COMPLETION_LENGTH,
    DAPO_OVERLONG_BUFFER,
    REWARD_FUNCS,
    REWARD_RANGES,
    AccuracyReward,
    accuracy_reward,
    format_reward,
    get_reward_funcs,
    soft_overlong_punishment,
)

__all__ = [
    "DAPO_MAX_COMPLETION_LENGTH",
    "DAPO_OVERLONG_BUFFER",
    "DEFAULT_VERIFY_TIMEOUT_S",
    "REWARD_FUNCS",
    "REWARD_RANGES",
    "AccuracyReward",
    "AnswerCheck",
    "RewardStats",
    "accuracy_reward",
    "check_answers",
    "completion_text",
    "extract_answer",
    "format_reward",
    "get_reward_funcs",
    "last_boxed",
    "normalize_answer",
    "parseable_golds",
    "soft_overlong_punishment",
    "tally",
]

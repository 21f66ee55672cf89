"""Reward functions: Math-Verify accuracy, format, DAPO overlong, registry, time limits off the main thread."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trl_credit import rewards
from trl_credit.rewards import (
    REWARD_FUNCS,
    AccuracyReward,
    RewardStats,
    accuracy_reward,
    check_answers,
    extract_answer,
    format_reward,
    get_reward_funcs,
    last_boxed,
    soft_overlong_punishment,
)

# sympy cannot finish comparing this tower with 5 (Math-Verify's own timeout exists for such inputs).
PATHOLOGICAL = r"The answer is \boxed{9^{9^{9^{9}}}}"


def conversational(texts):
    return [[{"role": "assistant", "content": text}] for text in texts]


def test_extraction():
    assert last_boxed(r"so \boxed{\frac{1}{2}} then \boxed{3}.") == "3"
    assert last_boxed(r"\boxed{a^{2}} and an unclosed \boxed{x") == "a^{2}"
    assert last_boxed(r"put it in \boxed{} please") is None
    assert last_boxed(r"\fbox{7}") == "7"
    assert extract_answer(r"I get \boxed{ 1,000 }.") == "1,000"
    assert extract_answer("3 + 4 = 7, then 7 * 2 = 14.") == "14"
    assert extract_answer("0 - 4 = -4") == "-4"
    assert extract_answer("5-3 is what we need") == "3"  # subtraction, not the number -3
    assert extract_answer("He paid $1,250.50 in total") == "1,250.50"
    assert extract_answer("no digits at all") is None


def test_accuracy_correct_wrong_and_equivalent():
    completions = [
        r"Half of one is \boxed{\frac{1}{2}}.",  # gold 0.5: LaTeX vs decimal
        "The total is 1,000 apples",  # gold 1000: thousands separator, no box: last number
        r"\boxed{\dfrac{9}{7}}",  # gold \frac{9}{7}
        r"\boxed{\left(3, \frac{\pi}{2}\right)}",  # gold (3, pi/2) as written in MATH-500
        r"So x = \boxed{4.5 \times 10^{33}}",  # gold 4.5e33 (Minerva style)
        r"\boxed{3}",  # gold 4: wrong
        "I think it is 12, no wait, 13",  # gold 12: the last number is 13
    ]
    golds = ["0.5", "1000", r"\frac{9}{7}", r"\left( 3, \frac{\pi}{2} \right)", "4.5e33", "4", "12"]
    accuracy = AccuracyReward()
    assert accuracy(conversational(completions), golds) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert accuracy(completions, golds) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]  # plain completions
    assert accuracy.unscored.snapshot_and_reset() == {
        "rewards/timeouts": 0,
        "rewards/parse_failures": 0,
        "rewards/no_answer": 0,
    }


def test_accuracy_malformed_answers_score_zero_and_are_counted():
    completions = ["no answer here", r"\boxed{\frac{}{}", r"\boxed{)(}", r"\boxed{7}"]
    logged = {}
    accuracy, other = AccuracyReward(), AccuracyReward()
    scores = accuracy(conversational(completions), ["7", "7", "7", "7"], log_extra=logged.__setitem__)
    assert scores == [0.0, 0.0, 0.0, 1.0]
    assert logged["extracted_answer"] == ["", "", ")(", "7"]
    stats = accuracy.unscored.snapshot_and_reset()
    assert stats["rewards/no_answer"] == 2 and stats["rewards/parse_failures"] == 1
    # A gold answer Math-Verify cannot read: the reward is undefined, TRL skips it.
    assert accuracy(conversational([r"\boxed{7}"]), [r"\frac{"]) == [None]
    assert accuracy.unscored.snapshot_and_reset()["rewards/parse_failures"] == 1
    assert set(other.unscored.snapshot_and_reset().values()) == {0}  # counts belong to the reward that counted
    assert pickle.loads(pickle.dumps(accuracy))(["7"], ["7"]) == [1.0]  # TRL's rollout workers get a copy
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        check_answers(["1", "2"], ["1"])


def test_format_reward():
    texts = [r"so \boxed{5}", "so 5", r"\boxed{}", r"\boxed{5"]
    assert format_reward(conversational(texts)) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward(texts) == [1.0, 0.0, 0.0, 0.0]


def test_timeout_in_main_thread_then_worker_restarts():
    started = time.monotonic()
    stats = RewardStats()
    checks = check_answers([PATHOLOGICAL, r"\boxed{5}"], ["5", "5"], timeout_s=1.0, stats=stats)
    assert [c.status for c in checks] == ["timeout", "ok"] and checks[1].correct
    assert time.monotonic() - started < 15  # 1 s limit + worker restart, not the minutes sympy would take
    assert stats.snapshot_and_reset()["rewards/timeouts"] == 1


def test_timeout_from_a_thread():
    results, errors = [], []
    accuracy = AccuracyReward(timeout_s=1.0)

    def score():
        try:
            results.append(accuracy(conversational([PATHOLOGICAL, "7"]), ["5", "7"]))
        except BaseException as error:  # noqa: BLE001 - the assertion below reports it
            errors.append(error)

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(timeout=60)
    assert not errors and results == [[0.0, 1.0]]
    assert accuracy.unscored.snapshot_and_reset()["rewards/timeouts"] == 1


def _score_in_child(_):
    # Runs in a daemonic pool worker forked from a process whose verifier worker is already running.
    checks = check_answers([PATHOLOGICAL, r"\boxed{\frac{1}{2}}"], ["5", "0.5"], timeout_s=1.0)
    return [c.status for c in checks], checks[1].correct


def test_timeout_inside_a_worker_process():
    check_answers(["1"], ["1"])  # the parent's verifier is up: the child must not reuse its pipes
    with multiprocessing.get_context("fork").Pool(1) as pool:
        statuses, correct = pool.map(_score_in_child, [0])[0]
    assert statuses == ["timeout", "ok"] and correct
    assert check_answers(["2"], ["2"])[0].correct  # the parent's worker still answers


def test_the_math_verify_worker_outlives_ctrl_c_and_ends_quietly_when_its_input_ends():
    # Started as the parent starts it. A Ctrl-C, or a Jupyter kernel's shutdown, signals the whole process group.
    worker = Path(rewards.__file__).with_name("verify_worker.py")
    process = subprocess.Popen(
        [sys.executable, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert json.loads(process.stdout.readline()) == {"ready": True}
    process.send_signal(signal.SIGINT)
    process.stdin.write(json.dumps({"gold": "1/2", "pred": "0.5"}) + "\n")
    process.stdin.flush()
    assert json.loads(process.stdout.readline()) == {"status": "ok", "correct": True}
    process.stdin.close()  # as when the parent closes it, or exits
    assert process.wait(timeout=30) == 0
    assert process.stderr.read() == ""


def test_normal_checks_are_cheap():
    check_answers(["1"], ["1"])  # worker started
    texts = [rf"so the answer is \boxed{{\frac{{{i}}}{{7}}}}" for i in range(100)]
    started = time.monotonic()
    assert all(c.correct for c in check_answers(texts, [rf"\frac{{{i}}}{{7}}" for i in range(100)]))
    per_check_ms = (time.monotonic() - started) * 10
    assert per_check_ms < 50, f"{per_check_ms:.1f} ms per check"


def test_soft_overlong_punishment_paper_defaults_and_values():
    default = soft_overlong_punishment()
    assert (default.max_completion_len, default.soft_punish_cache) == (20480, 4096)
    overlong = soft_overlong_punishment(max_completion_length=100, overlong_buffer=20)
    lengths = [10, 80, 90, 100, 101]
    assert overlong(completion_ids=[[0] * n for n in lengths]) == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="overlong_buffer < max_completion_length"):
        soft_overlong_punishment(max_completion_length=10, overlong_buffer=10)


def test_get_reward_funcs_by_name_and_path():
    accuracy, fmt, overlong = get_reward_funcs(["accuracy", "format", "overlong"], max_completion_length=48)
    assert isinstance(accuracy, AccuracyReward) and fmt is format_reward
    assert get_reward_funcs(["accuracy"])[0] is not accuracy  # each trainer's reward counts its own answers
    assert (overlong.max_completion_len, overlong.soft_punish_cache) == (48, 9)  # buffer capped at a fifth
    assert get_reward_funcs(["overlong"], max_completion_length=30000)[0].soft_punish_cache == 4096
    assert get_reward_funcs(["trl_credit.rewards:format_reward", "trl_credit.rewards.format_reward"]) == [
        format_reward,
        format_reward,
    ]
    with pytest.raises(ValueError, match="unknown reward 'acc'; choose from accuracy, format, overlong"):
        get_reward_funcs(["acc"])
    with pytest.raises(ValueError, match="cannot import reward function 'no_such_module:f'"):
        get_reward_funcs(["no_such_module:f"])
    with pytest.raises(ValueError, match="is not callable"):
        get_reward_funcs(["trl_credit.rewards:DEFAULT_VERIFY_TIMEOUT_S"])
    with pytest.raises(ValueError, match="needs max_completion_length"):
        get_reward_funcs(["overlong"])
    assert set(REWARD_FUNCS) == {"accuracy", "format", "overlong"}


def test_reward_functions_pickle_and_have_trl_names():
    # TRL's async rollout worker sends reward functions to a spawned process; TRL names metrics by __name__.
    for func in get_reward_funcs(["accuracy", "format", "overlong"], max_completion_length=64):
        assert pickle.loads(pickle.dumps(func)).__name__ == func.__name__
    assert accuracy_reward.__name__ == "accuracy_reward"
    assert pickle.loads(pickle.dumps(AccuracyReward(2.0))).timeout_s == 2.0
    assert rewards.DEFAULT_VERIFY_TIMEOUT_S == 5.0

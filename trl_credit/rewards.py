r"""Reward functions for math RL, in TRL's reward-function convention.

Every reward function has the signature `f(completions, solution, **kwargs) -> list[float | None]`, with one
value per completion. `completions` are conversational (`[[{"role": "assistant", "content": ...}], ...]`) or
plain strings; `solution` holds bare gold answers as produced by `trl_credit.data` (`"18"`, `"\frac{9}{7}"`).

- `accuracy`: 1.0 when the completion's answer equals the gold answer under Math-Verify (LaTeX and numeric
  equivalence: `\frac{1}{2}` = `0.5`, `1,000` = `1000`), else 0.0; `None` when the gold answer cannot be parsed.
  The answer is the last `\boxed{...}` of the completion, or, when there is none, its last number.
- `format`: 1.0 when the completion puts a non-empty answer in `\boxed{...}`, else 0.0.
- `overlong`: DAPO's soft overlong punishment (https://huggingface.co/papers/2503.14476, Eq. 13).

Math-Verify runs in a separate worker process (`_verify_worker.py`) that is killed when an answer takes longer
than the time limit (pathological LaTeX such as `\boxed{9^{9^{9^{9}}}}`). Unlike Math-Verify's own
`signal.alarm` timeout, this works off the main thread and inside worker processes. A reward function never
raises on a bad completion: timeouts and parse failures score 0.0 and are counted by the reward object that
checked them (`AccuracyReward.unscored`), whose counts the trainer logs.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_VERIFY_TIMEOUT_S = 5.0
"""Seconds one answer check may take before its worker is killed (Math-Verify's own default is 5 s)."""

_WORKER_START_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take several seconds

AnswerStatus = Literal["ok", "no_answer", "pred_unparseable", "gold_unparseable", "timeout", "error"]


# ---------------------------------------------------------------------------------------------------------------
# Answer extraction (pure string functions, run in the calling process: they are linear-time and cannot hang)
# ---------------------------------------------------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A minus sign right after a word, digit or closing bracket is subtraction (`5-3`), not a negative number.
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_E_NOTATION_RE = re.compile(r"^([-+]?\d+(?:\.\d+)?)[eE]([-+]?\d+)$")


def last_boxed(text: str) -> str | None:
    r"""The content of the last closed, non-empty `\boxed{...}` (or `\fbox{...}`) in `text`, braces matched.

    `"so \boxed{\frac{1}{2}}."` -> `"\frac{1}{2}"`; an unclosed or empty box is skipped in favour of an earlier one.
    """
    for match in reversed(list(_BOXED_RE.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                content = text[start:i].strip()
                if content:
                    return content
                break
    return None


def normalize_answer(answer: str) -> str:
    r"""A bare answer Math-Verify reads reliably: outer `$` removed, `4.5e33` written `4.5 \times 10^{33}`.

    Math-Verify reads `4.5e33` as `4.5 * e * 33`, so scientific notation (frequent in Minerva answers) would
    only match when gold and prediction use the same notation.
    """
    answer = answer.strip().strip("$").strip()
    match = _E_NOTATION_RE.match(answer)
    if match:
        answer = f"{match.group(1)} \\times 10^{{{int(match.group(2))}}}"
    return answer


def extract_answer(text: str) -> str | None:
    r"""The final answer of a completion: its last `\boxed{...}`, else its last number, else `None`."""
    boxed = last_boxed(text)
    if boxed is not None:
        return normalize_answer(boxed)
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion: a plain string, or the content of the last message of a conversational one."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


# ---------------------------------------------------------------------------------------------------------------
# The Math-Verify worker process
# ---------------------------------------------------------------------------------------------------------------


class _VerifierProcess:
    """One Math-Verify worker (`_verify_worker.py`) and a line-buffered reader with deadlines.

    Requests are sent one at a time: the worker answers each before it reads the next, so a pipe never fills
    and a timed-out request only costs killing and restarting the worker (~1 s).
    """

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_verify_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._buffer = b""
        ready = self._read_line(_WORKER_START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            self.kill()
            raise RuntimeError(
                "The Math-Verify worker process did not start (is `math-verify` installed? "
                f"try `{sys.executable} -c 'import math_verify'`)."
            )

    def _read_line(self, timeout_s: float) -> dict | None:
        """The next JSON line from the worker, or `None` if it does not come within `timeout_s` or the worker died."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # EOF: the worker crashed (e.g. a C-level stack overflow in sympy)
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def request(self, payload: dict, timeout_s: float) -> dict | None:
        """The worker's answer to `payload`, or `None` after killing it on timeout or crash."""
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        response = self._read_line(timeout_s)
        if response is None:
            self.kill()
        return response

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()


class _Verifier:
    """A lazily started worker per process, shared by all threads (calls are serialised by a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: _VerifierProcess | None = None
        self._owner_pid = os.getpid()

    def run(self, payloads: Sequence[dict], timeout_s: float) -> list[dict]:
        """One response per payload; a timed-out or crashed request gets `{"status": "timeout" | "error"}`."""
        with self._lock:
            if os.getpid() != self._owner_pid:
                # A forked child inherits the parent's pipes: never talk to the parent's worker from here.
                self._process, self._owner_pid = None, os.getpid()
            responses = []
            for payload in payloads:
                if self._process is None or not self._process.alive():
                    self._process = _VerifierProcess()
                started = time.monotonic()
                response = self._process.request(payload, timeout_s)
                if response is None:
                    self._process = None
                    timed_out = time.monotonic() - started >= timeout_s
                    response = {"status": "timeout" if timed_out else "error", "correct": False}
                responses.append(response)
            return responses

    def close(self) -> None:
        with self._lock:
            if self._process is not None and os.getpid() == self._owner_pid:
                self._process.kill()
            self._process = None


_VERIFIER = _Verifier()


# ---------------------------------------------------------------------------------------------------------------
# Counters the trainer logs
# ---------------------------------------------------------------------------------------------------------------


class RewardStats:
    """Thread-safe counts of answers that could not be scored normally, since the last snapshot (`MEANINGS`)."""

    MEANINGS = {
        "timeouts": "answer checks killed after the time limit (summed over processes)",
        "parse_failures": "extracted or gold answers Math-Verify could not parse, or a worker error (summed)",
        "no_answer": "completions with neither a `\\boxed{}` nor a number (summed)",
    }
    KEYS = tuple(MEANINGS)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.KEYS, 0)

    def __getstate__(self) -> dict:  # reward functions are pickled to TRL's rollout workers; a lock is not
        return {"counts": dict(self._counts)}

    def __setstate__(self, state: dict) -> None:
        self._lock = threading.Lock()
        self._counts = state["counts"]

    def add(self, counts: dict[str, int]) -> None:
        """Add counts keyed like `KEYS` (e.g. the output of `tally`)."""
        with self._lock:
            for key, value in counts.items():
                self._counts[key] += value

    def snapshot_and_reset(self) -> dict[str, int]:
        """Counts since the previous call, keyed `rewards/<name>` (ready for the trainer's metrics), then zeroed."""
        with self._lock:
            snapshot = {f"rewards/{key}": value for key, value in self._counts.items()}
            self._counts = dict.fromkeys(self.KEYS, 0)
        return snapshot


_STATUS_COUNTER = {
    "timeout": "timeouts",
    "pred_unparseable": "parse_failures",
    "gold_unparseable": "parse_failures",
    "error": "parse_failures",
    "no_answer": "no_answer",
}


# ---------------------------------------------------------------------------------------------------------------
# Answer checking
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnswerCheck:
    """The verdict on one completion: `correct`, why (`status`), and the answer that was read (`extracted`)."""

    correct: bool
    status: AnswerStatus
    extracted: str | None


def check_answers(
    texts: Sequence[str],
    golds: Sequence[str],
    *,
    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
    stats: RewardStats | None = None,
) -> list[AnswerCheck]:
    """Check each completion text against its gold answer with Math-Verify, under a per-answer time limit.

    Args:
        texts: `N` completion texts.
        golds: `N` bare gold answers.
        timeout_s: Seconds one check may take; the worker is killed and restarted past it.
        stats: Where to count timeouts and failures (a reward's own counters), if anywhere.

    Returns:
        `N` `AnswerCheck`s. Never raises on bad input.
    """
    if len(texts) != len(golds):
        raise ValueError(f"got {len(texts)} completions but {len(golds)} gold answers")
    extracted = [extract_answer(text) for text in texts]
    to_verify = [i for i, answer in enumerate(extracted) if answer is not None]
    responses = _VERIFIER.run(
        [{"gold": normalize_answer(str(golds[i])), "pred": extracted[i]} for i in to_verify], timeout_s
    )
    checks = [AnswerCheck(False, "no_answer", None)] * len(texts)
    for i, response in zip(to_verify, responses):
        checks[i] = AnswerCheck(response["correct"], response["status"], extracted[i])
    if stats is not None:
        stats.add(tally(checks))
    return checks


def tally(checks: Sequence[AnswerCheck]) -> dict[str, int]:
    """How many `checks` timed out, failed to parse, or had no answer (the keys of `RewardStats.KEYS`)."""
    counts = dict.fromkeys(RewardStats.KEYS, 0)
    for check in checks:
        if check.status in _STATUS_COUNTER:
            counts[_STATUS_COUNTER[check.status]] += 1
    return counts


def parseable_golds(golds: Sequence[str], *, timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S) -> list[bool]:
    """Whether Math-Verify can parse each bare gold answer (within `timeout_s`); used to drop bad data rows."""
    responses = _VERIFIER.run([{"gold": normalize_answer(str(gold))} for gold in golds], timeout_s)
    return [response["status"] == "ok" for response in responses]


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

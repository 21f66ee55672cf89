"""Checking extracted answers against gold answers with Math-Verify, in a worker process with a time limit.

Math-Verify runs in a separate worker process (`verify_worker.py`) that is killed when an answer takes longer than
the time limit (pathological LaTeX such as `\\boxed{9^{9^{9^{9}}}}`). Unlike Math-Verify's own `signal.alarm`
timeout, this works off the main thread and inside worker processes. A check never raises on a bad completion:
timeouts and parse failures come back as statuses, and `RewardStats` counts them for the reward that asked.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .answers import extract_answer, normalize_answer

DEFAULT_VERIFY_TIMEOUT_S = 5.0
"""Seconds one answer check may take before its worker is killed (Math-Verify's own default is 5 s)."""

_WORKER_START_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take several seconds

AnswerStatus = Literal["ok", "no_answer", "pred_unparseable", "gold_unparseable", "timeout", "error"]


# ---------------------------------------------------------------------------------------------------------------
# The Math-Verify worker process
# ---------------------------------------------------------------------------------------------------------------


class _VerifierProcess:
    """One Math-Verify worker (`verify_worker.py`) and a line-buffered reader with deadlines.

    Requests are sent one at a time: the worker answers each before it reads the next, so a pipe never fills
    and a timed-out request only costs killing and restarting the worker (~1 s).
    """

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("verify_worker.py"))],
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

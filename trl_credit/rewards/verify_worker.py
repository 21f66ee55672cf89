"""Math-Verify worker process: reads JSON requests on stdin, answers one JSON line each on stdout.

Run by path (`python verify_worker.py`), never imported: running it by path keeps `trl_credit/__init__.py`
(and torch) out of the worker, so it starts in well under a second. The parent (`answer_checks.py`)
enforces the time limit by killing this process, which works from any thread and inside worker
processes, where Math-Verify's own `signal.alarm` timeout cannot run; Math-Verify's timeouts are therefore
turned off here. The parent owns the worker's lifetime: the worker ignores Ctrl-C (a terminal's, or a Jupyter kernel's
at shutdown, reaches the whole process group; the parent handles it) and ends quietly at the end of its input, when
the parent closes it or exits.

Protocol (one JSON object per line):
    -> {"gold": str}                   <- {"status": "ok" | "gold_unparseable"}
    -> {"gold": str, "pred": str}      <- {"status": "ok" | "gold_unparseable" | "pred_unparseable", "correct": bool}
`gold` and `pred` are bare answers (no `\\boxed`, no `$`); they are parsed as `\\boxed{...}` so that
Math-Verify reads them as LaTeX (a bare `\\dfrac{9}{7}` is otherwise not found).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from functools import lru_cache


def _exit_when_orphaned(parent_pid: int) -> None:
    # A worker stuck in a long sympy computation would outlive a parent that died without killing it.
    while True:
        time.sleep(2.0)
        if os.getppid() != parent_pid:
            os._exit(0)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the parent's to handle, not a crash of a check
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    logging.disable(logging.WARNING)  # Math-Verify warns that its timeouts are disabled: the parent handles them
    from math_verify import parse, verify

    @lru_cache(maxsize=8192)  # a gold answer is checked once per completion of its group
    def parse_answer(answer: str) -> list:
        return parse("\\boxed{" + answer + "}", parsing_timeout=None)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            response = _check(request, parse_answer, verify)
        except Exception as error:  # Math-Verify catches most errors itself; never let one end the worker
            response = {"status": "error", "correct": False, "error": repr(error)[:200]}
        out.write(json.dumps(response) + "\n")
        out.flush()


def _is_math(parsed: list) -> bool:
    # Math-Verify falls back to the raw string when sympy cannot read an answer.
    return any(not isinstance(value, str) for value in parsed)


def _check(request: dict, parse_answer, verify) -> dict:
    gold = parse_answer(request["gold"])
    if not _is_math(gold):
        return {"status": "gold_unparseable", "correct": False}
    if "pred" not in request:
        return {"status": "ok", "correct": False}
    pred = parse_answer(request["pred"])
    if not _is_math(pred):  # a raw string never equals a sympy gold answer
        return {"status": "pred_unparseable", "correct": False}
    return {"status": "ok", "correct": bool(verify(gold, pred, timeout_seconds=None))}


if __name__ == "__main__":
    main()

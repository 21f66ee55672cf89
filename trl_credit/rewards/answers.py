r"""Reading the final answer of a completion: the last `\boxed{...}`, else the last number, normalised.

Pure string functions, run in the calling process: they are linear-time and cannot hang. The Math-Verify check of an
extracted answer against the gold one is `answer_checks.check_answers`.
"""

from __future__ import annotations

import re

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

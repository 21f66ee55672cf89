"""The colour of a token's credit weight `w = Â/A`, shared by the HTML page and the PNG figure, and token text made
visible (newlines, tabs and control characters drawn as symbols).
"""

from __future__ import annotations

import math

# Colour scale shared by the HTML page and the PNG: white at w = 1, red below, blue above, saturating
# at w = 2**-LOG2_RANGE and 2**LOG2_RANGE. Both ends are light enough for black text to stay readable.
LOG2_RANGE = 2.0
LOW_RGB = (214, 96, 77)
MID_RGB = (255, 255, 255)
HIGH_RGB = (67, 147, 195)


# --------------------------------------------------------------------------------------------------
# Colours and token text
# --------------------------------------------------------------------------------------------------


def weight_rgb(weight: float | None, log2_range: float = LOG2_RANGE) -> tuple[int, int, int]:
    """Diverging colour of a weight: white at 1, linear in `log2(w)`, saturated beyond `±log2_range`.

    Undefined weights (`None`, non-positive, NaN) are drawn white: no evidence either way.
    """
    if weight is None or not weight > 0 or not math.isfinite(weight):
        return MID_RGB
    position = max(-1.0, min(1.0, math.log2(weight) / log2_range))
    end = HIGH_RGB if position > 0 else LOW_RGB
    return tuple(round(mid + abs(position) * (target - mid)) for mid, target in zip(MID_RGB, end))


def weight_hex(weight: float | None, log2_range: float = LOG2_RANGE) -> str:
    """`weight_rgb` as a CSS `#rrggbb` string."""
    return "#{:02x}{:02x}{:02x}".format(*weight_rgb(weight, log2_range))


_VISIBLE_CONTROL = {"\n": "\u21b5\n", "\t": "\u21e5\t", "\r": "\u240d"}


def visible_token_text(token: str) -> str:
    """Make whitespace and control characters visible: newline → `↵` + line break, tab → `⇥`, CR → `␍`.

    Other control characters become `\\xNN`; an empty token (e.g. a special token decoded away) is `∅`.
    Spaces stay spaces; the page keeps them with `white-space: pre-wrap` on a coloured background.
    """
    if token == "":
        return "\u2205"
    out = []
    for char in token:
        if char in _VISIBLE_CONTROL:
            out.append(_VISIBLE_CONTROL[char])
        elif ord(char) < 32 or ord(char) == 127:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)

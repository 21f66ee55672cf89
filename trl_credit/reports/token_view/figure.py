"""The token-credit view as a PNG figure (matplotlib's object API, no global backend): completions laid out in
character cells, each token's cell coloured by its weight on the diverging colour scale, with a colour bar.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .colour_scale import HIGH_RGB, LOG2_RANGE, LOW_RGB, MID_RGB, visible_token_text, weight_rgb
from .records import completion_header

# --------------------------------------------------------------------------------------------------
# PNG
# --------------------------------------------------------------------------------------------------

# DejaVu Sans Mono (bundled with matplotlib) advances 0.602 em per glyph; a fixed advance lets tokens
# be laid out in character cells without asking a renderer for text extents.
_MONO_ADVANCE = 0.602


def _layout_tokens(tokens: Sequence[str], columns: int) -> list[tuple[int, int, int, str]]:
    """Flow token texts into `columns`-wide lines: `(token index, line, column, text)` per drawn piece.

    A newline inside a token ends the line; a token longer than the remaining space wraps.
    """
    pieces, line, column = [], 0, 0
    for index, token in enumerate(tokens):
        # The bundled font has no tab glyph: the `⇥` marker stays, the tab itself becomes a space.
        text = visible_token_text(token).replace("\t", " ")
        for part_number, part in enumerate(text.split("\n")):
            if part_number > 0:
                line, column = line + 1, 0
            while part:
                if column >= columns:
                    line, column = line + 1, 0
                chunk, part = part[: columns - column], part[columns - column :]
                pieces.append((index, line, column, chunk))
                column += len(chunk)
    return pieces


def render_token_credit_png(
    records: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    columns: int = 100,
    max_tokens: int = 400,
    width_inches: float = 11.0,
    dpi: int = 150,
    log2_range: float = LOG2_RANGE,
) -> Path:
    """Draw the records' tokens as coloured boxes (same colours as the HTML page) into a PNG.

    Meant for papers and model cards, so keep `records` to a handful; each completion is cut after
    `max_tokens` tokens. Renders with Agg outside pyplot (the caller's backend and figures are left alone) and
    matplotlib's bundled monospace font.
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, LogNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    # Lay every completion out first: the figure height follows from the number of lines.
    blocks, total_lines = [], 0
    for record in records:
        tokens = record["tokens"][:max_tokens]
        pieces = _layout_tokens(tokens, columns)
        n_lines = (pieces[-1][1] + 1 if pieces else 1) + (len(record["tokens"]) > max_tokens)
        blocks.append((record, pieces, total_lines))
        total_lines += n_lines + 2  # a header line above, a blank line below

    line_height = 1.6  # in character-height units; leaves room between box rows
    font_size = width_inches * 72 / (columns * _MONO_ADVANCE)
    height_inches = max(1.0, total_lines * line_height * font_size / 72) + 0.8
    fig = Figure(figsize=(width_inches, height_inches), dpi=dpi)
    ax = fig.add_axes((0.0, 0.6 / height_inches, 1.0, 1.0 - 0.6 / height_inches))
    ax.set_xlim(-0.5, columns + 0.5)  # half a cell of margin on each side
    ax.set_ylim(max(total_lines, 1), 0)
    ax.axis("off")
    text_style = dict(family="DejaVu Sans Mono", fontsize=font_size, parse_math=False, va="center")

    for record, pieces, first_line in blocks:
        ax.text(0, first_line + 0.5, completion_header(record), weight="bold", **text_style)
        for index, line, column, chunk in pieces:
            y = first_line + 1 + line
            color = [c / 255 for c in weight_rgb(record["weights"][index], log2_range)]
            ax.add_patch(Rectangle((column, y + 0.08), len(chunk), 0.84, facecolor=color, edgecolor="#cccccc", lw=0.4))
            ax.text(column, y + 0.5, chunk, **text_style)
        if len(record["tokens"]) > max_tokens:
            last_line = pieces[-1][1] if pieces else 0
            hidden = len(record["tokens"]) - max_tokens
            ax.text(0, first_line + 2 + last_line + 0.5, f"… {hidden} more tokens", color="#777", **text_style)

    colormap = LinearSegmentedColormap.from_list(
        "credit", [[c / 255 for c in rgb] for rgb in (LOW_RGB, MID_RGB, HIGH_RGB)]
    )
    colorbar_ax = fig.add_axes((0.3, 0.25 / height_inches, 0.4, 0.15 / height_inches))
    mappable = ScalarMappable(norm=LogNorm(2.0**-log2_range, 2.0**log2_range), cmap=colormap)
    colorbar = fig.colorbar(mappable, cax=colorbar_ax, orientation="horizontal")
    ticks = [2.0**exponent for exponent in range(-math.floor(log2_range), math.floor(log2_range) + 1)]
    colorbar.set_ticks(ticks, labels=[f"{tick:g}" for tick in ticks])
    colorbar.minorticks_off()
    colorbar.set_label("token weight Â/A (log scale)", fontsize=8)
    colorbar.ax.tick_params(labelsize=7)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, facecolor="white")
    return path

"""The token-credit view as a self-contained HTML page: one block per completion, each token's background its weight on
the diverging colour scale, hover text with its log-prob, entropy and method statistic, filters by step and sign.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .colour_scale import LOG2_RANGE, visible_token_text, weight_hex
from .records import completion_header, format_value


def token_tooltip(record: dict[str, Any], index: int) -> str:
    """Plain-text hover text of token `index`: its text, weight, log-prob, entropy and method statistic."""
    logp = record["logps"][index]
    lines = [
        f"token {index}: {record['tokens'][index]!r} (id {record['token_ids'][index]})",
        f"weight Â/A = {format_value(record['weights'][index])}",
        f"log p = {format_value(logp)}" + ("" if logp is None else f" (p = {math.exp(logp):.3g})"),
        f"entropy = {format_value(record['entropies'][index])} nats",
    ]
    if record["statistic"] is not None:
        lines.append(f"{record['statistic_name']} = {format_value(record['statistic'][index])}")
    return "\n".join(lines)


def _advantage_sign(advantage: float | None) -> str:
    if not advantage:  # None or 0.0
        return "zero"
    return "pos" if advantage > 0 else "neg"


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------

# Inline on purpose: the page must open offline, from a model card or an e-mail, with nothing to fetch.
_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.controls { position: sticky; top: 0; background: #fafafa; border: 1px solid #ddd; padding: .5em .8em;
            display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; z-index: 1; }
.legend { display: flex; align-items: center; gap: .4em; font-size: .85em; }
.legend .bar { width: 180px; height: 12px; border: 1px solid #aaa; }
.completion { border: 1px solid #ddd; border-radius: 4px; margin: .8em 0; padding: .5em .8em; }
.completion.hidden { display: none; }
.header { font-size: .85em; color: #555; margin-bottom: .3em; }
.prompt { font-size: .85em; color: #777; white-space: pre-wrap; margin-bottom: .4em; }
.tokens { font-family: ui-monospace, "DejaVu Sans Mono", monospace; white-space: pre-wrap; line-height: 1.9; }
.note { font-weight: 600; }
.tok { box-shadow: inset -1px 0 rgba(0, 0, 0, .15); padding: 1px 0; }  /* separates neighbouring white tokens */
.tok.dim { opacity: .25; }
.tok:hover { outline: 1px solid #333; }
.controls input[type=number] { width: 6em; }
#info { flex-basis: 100%; font-family: ui-monospace, monospace; font-size: .8em; white-space: pre; min-height: 4.8em; color: #444; }
"""

# Filters act on data attributes written by the server-side renderer; the page is complete without JS.
_JS = """
(function () {
  const step = document.getElementById('f-step'), sign = document.getElementById('f-sign'),
        thr = document.getElementById('f-threshold'), info = document.getElementById('info'),
        count = document.getElementById('count');
  function apply() {
    const t = thr && thr.value !== '' ? parseFloat(thr.value) : NaN;
    let shown = 0;
    for (const c of document.querySelectorAll('.completion')) {
      let ok = (step.value === 'all' || c.dataset.step === step.value) &&
               (sign.value === 'all' || c.dataset.sign === sign.value);
      if (ok && !isNaN(t)) ok = parseFloat(c.dataset.statMax) >= t;
      c.classList.toggle('hidden', !ok);
      if (ok) shown++;
      for (const s of c.querySelectorAll('.tok'))
        s.classList.toggle('dim', !isNaN(t) && !(parseFloat(s.dataset.stat) >= t));
    }
    count.textContent = shown + ' shown';
  }
  // Filters can be preset from the address (?step=3&sign=pos&threshold=0.5), which makes views shareable.
  const query = new URLSearchParams(location.search);
  if (query.has('step')) step.value = query.get('step');
  if (query.has('sign')) sign.value = query.get('sign');
  if (thr && query.has('threshold')) thr.value = query.get('threshold');
  for (const el of [step, sign, thr]) if (el) el.addEventListener('input', apply);
  document.addEventListener('mouseover', (e) => {
    if (e.target.classList && e.target.classList.contains('tok')) info.textContent = e.target.title;
  });
  apply();
})();
"""


def _legend_gradient(log2_range: float) -> str:
    stops = ", ".join(weight_hex(2.0 ** (log2_range * x / 4), log2_range) for x in range(-4, 5))
    return f"linear-gradient(to right, {stops})"


def _token_span(record: dict[str, Any], index: int, log2_range: float) -> str:
    statistic = record["statistic"][index] if record["statistic"] is not None else None
    return (
        f'<span class="tok" style="background-color: {weight_hex(record["weights"][index], log2_range)}"'
        f' data-w="{format_value(record["weights"][index], ".4g")}" data-stat="{format_value(statistic, ".4g")}"'
        f' title="{html.escape(token_tooltip(record, index), quote=True)}">'
        f"{html.escape(visible_token_text(record['tokens'][index]), quote=False)}</span>"
    )


def _completion_block(record: dict[str, Any], log2_range: float) -> str:
    statistics = [value for value in (record["statistic"] or []) if value is not None]
    stat_max = max(statistics) if statistics else float("nan")
    tokens = "".join(_token_span(record, index, log2_range) for index in range(len(record["tokens"])))
    return (
        f'<div class="completion" data-step="{record["step"]}" data-sign="{_advantage_sign(record["advantage"])}"'
        f' data-stat-max="{stat_max:.4g}">\n'
        f'<div class="header">{html.escape(completion_header(record))}</div>\n'
        f'<div class="prompt">{html.escape(record["prompt"])}</div>\n'
        f'<div class="tokens">{tokens}</div>\n</div>'
    )


def render_token_credit_html(
    records: Sequence[dict[str, Any]],
    *,
    title: str = "Token credit",
    log2_range: float = LOG2_RANGE,
    note: str | None = None,
) -> str:
    """A self-contained HTML page (inline CSS and JS, no external resources) showing each record's tokens.

    Each token's background is `weight_hex(Â/A)`; hovering shows its log-prob, entropy and method
    statistic. Filters: step, sign of the sequence advantage, and a threshold on the method statistic
    (completions whose largest statistic is below it are hidden, tokens below it are dimmed); they can
    be preset from the address, e.g. `token_credit.html?step=3&sign=pos&threshold=0.5`. `note`, when given, is
    shown above the filters (`trl-credit inspect` says there which completions it left out).
    """
    steps = sorted({record["step"] for record in records})
    statistic_names = sorted({record["statistic_name"] for record in records if record["statistic_name"]})
    step_options = "".join(f'<option value="{step}">{step}</option>' for step in steps)
    threshold = (
        f"<label>{html.escape(' / '.join(statistic_names))} ≥ "
        f'<input id="f-threshold" type="number" step="any" size="6"></label>'
        if statistic_names
        else ""
    )
    low, high = 2.0**-log2_range, 2.0**log2_range
    controls = (
        '<div class="controls">'
        f'<label>step <select id="f-step"><option value="all">all</option>{step_options}</select></label>'
        '<label>advantage <select id="f-sign"><option value="all">all</option><option value="pos">A &gt; 0</option>'
        '<option value="neg">A &lt; 0</option><option value="zero">A = 0</option></select></label>'
        f"{threshold}"
        f'<span class="legend">Â/A {low:g} <span class="bar" style="background: {_legend_gradient(log2_range)}">'
        f"</span> {high:g} (log scale, white = 1)</span>"
        '<span id="count"></span><div id="info">hover a token for its details</div></div>'
    )
    blocks = "\n".join(_completion_block(record, log2_range) for record in records)
    note_html = "" if note is None else f'<p class="note">{html.escape(note)}</p>\n'
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f"<p>{len(records)} completions. Background: per-token weight Â/A of the credit method "
        "(red: less credit than GRPO, blue: more). Hover a token for its log-prob, entropy and statistic.</p>\n"
        f"{note_html}"
        f"{controls}\n{blocks}\n<script>{_JS}</script>\n</body>\n</html>\n"
    )


def write_token_credit_html(
    records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "Token credit", note: str | None = None
) -> Path:
    """Render `records` with `render_token_credit_html` and write the page to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_token_credit_html(records, title=title, note=note), encoding="utf-8")
    return path


def embed_html(records: Sequence[dict[str, Any]], *, height: int = 600, title: str = "Token credit") -> str:
    """The page as an `<iframe srcdoc>` for notebooks (`IPython.display.HTML(embed_html(records))`).

    The iframe isolates the page's CSS and script from the notebook's, and needs no file or server.
    """
    page = html.escape(render_token_credit_html(records, title=title), quote=True)
    return f'<iframe srcdoc="{page}" style="width: 100%; height: {int(height)}px; border: 1px solid #ddd"></iframe>'

"""Token-credit records and their views: a self-contained HTML page and a PNG figure.

With `log_token_credit=True` the trainer appends one JSON object per sampled completion to
`{output_dir}/token_credit.jsonl`. The schema lives here, in `token_credit_record`, which the trainer
calls with the tensors of one completion; `read_token_credit` reads the file back and
`render_token_credit_html` / `render_token_credit_png` draw it. Each token's background shows its weight
`w = Â/A` on a diverging scale centred at 1 (white), on a log2 axis: red tokens got less credit than
GRPO would give them, blue tokens more.

This module imports neither TRL nor torch at import time, so `trl-credit inspect` starts quickly.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TOKEN_CREDIT_FILENAME = "token_credit.jsonl"


def method_statistic_name(method: str) -> str | None:
    """The name of the per-token statistic the token view shows for `method` (a name or a stack): that of the last
    method of the stack whose registration declares one (the trainer records the last statistic returned), or None
    for GRPO and for methods not registered in this process."""
    from ..methods import CREDIT_METHODS, parse_credit_methods

    try:
        names = parse_credit_methods(method)
    except ValueError:
        return None
    for name in reversed(names):
        registered = CREDIT_METHODS.get(name.rsplit(":", 1)[-1])
        if registered is not None and registered.token_statistic is not None:
            return registered.token_statistic[0]
    return None


RECORD_KEYS = (
    "step",
    "method",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "tokens",
    "token_ids",
    "weights",
    "logps",
    "entropies",
    "statistic_name",
    "statistic",
)
_PER_TOKEN_KEYS = ("token_ids", "weights", "logps", "entropies")

# Colour scale shared by the HTML page and the PNG: white at w = 1, red below, blue above, saturating
# at w = 2**-LOG2_RANGE and 2**LOG2_RANGE. Both ends are light enough for black text to stay readable.
LOG2_RANGE = 2.0
_LOW_RGB = (214, 96, 77)
_MID_RGB = (255, 255, 255)
_HIGH_RGB = (67, 147, 195)


class TokenCreditError(ValueError):
    """A token-credit file or record that does not follow the schema."""


# --------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------


def _json_float(value: float) -> float | None:
    """Round to 6 significant digits (a long completion would otherwise cost ~20 bytes per number).

    JSON has no NaN/inf (browsers reject them in JSON), so non-finite values are stored as null.
    """
    value = float(value)
    return float(f"{value:.6g}") if math.isfinite(value) else None


def token_credit_record(
    *,
    step: int,
    method: str,
    prompt: str,
    completion: str,
    reward: float,
    advantage: float,
    token_ids,
    token_advantages,
    logps,
    entropies,
    mask=None,
    tokens: Sequence[str] | None = None,
    tokenizer=None,
    statistic=None,
    statistic_name: str | None = None,
) -> dict[str, Any]:
    """Build the token-credit record of one completion (one line of `token_credit.jsonl`).

    The per-token inputs are 1-D tensors, arrays or lists of length `T` (one completion row of the
    batch); positions where `mask` is false (padding, tool output) are dropped. The weight of each
    kept token is `Â_t / A`, or 1.0 when `A == 0` (every method leaves such responses untouched).

    Args:
        step: the optimizer step as TRL logs it (1-based, the `step` of `trainer_state.json`).
        method: credit method: `"grpo"`, a registered name, or a stack.
        prompt: prompt text as the model saw it.
        completion: decoded completion text.
        reward: total reward of the completion.
        advantage: sequence advantage `A_i`.
        token_ids: `(T,)` sampled token ids.
        token_advantages: `(T,)` per-token advantages `Â_{i,t}` handed to the loss.
        logps: `(T,)` log-probabilities of the sampled tokens.
        entropies: `(T,)` next-token entropies (nats).
        mask: `(T,)` valid positions (bool or 0/1); all valid when omitted.
        tokens: decoded text of each of the `T` tokens; derived from `tokenizer` when omitted.
        tokenizer: used to decode each kept token on its own when `tokens` is omitted. A byte-level
            BPE token that holds part of a multi-byte character decodes to U+FFFD.
        statistic: `(T,)` the method's own per-token statistic, or `None`.
        statistic_name: its name; defaults to the registration's (`method_statistic_name(method)`).

    Returns:
        A JSON-serialisable dict with the keys of `RECORD_KEYS`.
    """
    import torch  # deferred: reading and rendering records must not pay for importing torch

    ids_T = torch.as_tensor(token_ids).reshape(-1)
    keep_T = torch.ones_like(ids_T, dtype=torch.bool) if mask is None else torch.as_tensor(mask).reshape(-1).bool()
    if keep_T.shape != ids_T.shape:
        raise TokenCreditError(f"mask has {keep_T.numel()} positions but token_ids has {ids_T.numel()}")

    def kept(values) -> list[float]:
        values_T = torch.as_tensor(values).detach().reshape(-1).float().cpu()
        if values_T.shape != ids_T.shape:
            raise TokenCreditError(
                f"per-token input has {values_T.numel()} positions but token_ids has {ids_T.numel()}"
            )
        return values_T[keep_T.cpu()].tolist()

    kept_ids = ids_T.cpu()[keep_T.cpu()].tolist()
    # Divide in float32, the precision Â was computed in, so that an untouched token reads exactly 1.
    advantage_f32 = torch.tensor(float(advantage), dtype=torch.float32)
    if advantage_f32 == 0:
        weights = [1.0] * len(kept_ids)
    else:
        weights = (torch.tensor(kept(token_advantages), dtype=torch.float32) / advantage_f32).tolist()

    if tokens is None:
        if tokenizer is None:
            raise TokenCreditError("pass either `tokens` or a `tokenizer` to decode the token ids")
        tokens = tokenizer.batch_decode(
            [[token_id] for token_id in kept_ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    else:
        tokens = [token for token, keep in zip(tokens, keep_T.tolist(), strict=True) if keep]

    if statistic_name is None:
        statistic_name = method_statistic_name(method)
    return {
        "step": int(step),
        "method": str(method),
        "prompt": str(prompt),
        "completion": str(completion),
        "reward": _json_float(reward),
        "advantage": _json_float(advantage),
        "tokens": [str(token) for token in tokens],
        "token_ids": [int(token_id) for token_id in kept_ids],
        "weights": [_json_float(w) for w in weights],
        "logps": [_json_float(v) for v in kept(logps)],
        "entropies": [_json_float(v) for v in kept(entropies)],
        "statistic_name": statistic_name if statistic is not None else None,
        "statistic": [_json_float(v) for v in kept(statistic)] if statistic is not None else None,
    }


def token_credit_records_from_batch(
    *,
    step: int,
    method: str,
    prompts: Sequence[str],
    completions: Sequence[str],
    rewards_B,
    advantages_B,
    completion_ids_BT,
    token_advantages_BT,
    logps_BT,
    entropies_BT,
    mask_BT,
    tokenizer,
    statistic_BT=None,
    statistic_name: str | None = None,
    max_records: int | None = None,
) -> list[dict[str, Any]]:
    """`token_credit_record` for the first `max_records` rows of a batch (all rows when `None`).

    The `_B` inputs are `(B,)` and the `_BT` inputs `(B, T)` tensors of the completion tokens; `prompts`
    and `completions` hold the `B` texts. Rows are taken in batch order: pass a shuffled or strided
    batch to sample across prompt groups.
    """
    rows = range(len(completions) if max_records is None else min(max_records, len(completions)))
    return [
        token_credit_record(
            step=step,
            method=method,
            prompt=prompts[row],
            completion=completions[row],
            reward=float(rewards_B[row]),
            advantage=float(advantages_B[row]),
            token_ids=completion_ids_BT[row],
            token_advantages=token_advantages_BT[row],
            logps=logps_BT[row],
            entropies=entropies_BT[row],
            mask=mask_BT[row],
            tokenizer=tokenizer,
            statistic=None if statistic_BT is None else statistic_BT[row],
            statistic_name=statistic_name,
        )
        for row in rows
    ]


def validate_record(record: dict[str, Any]) -> dict[str, Any]:
    """Check that `record` follows the schema (keys present, per-token lists of equal length)."""
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise TokenCreditError(f"token-credit record lacks {', '.join(missing)}")
    n_tokens = len(record["tokens"])
    lengths = {key: len(record[key]) for key in _PER_TOKEN_KEYS}
    if record["statistic"] is not None:
        lengths["statistic"] = len(record["statistic"])
    bad = {key: n for key, n in lengths.items() if n != n_tokens}
    if bad:
        raise TokenCreditError(f"record of step {record['step']} has {n_tokens} tokens but {bad}")
    return record


def append_token_credit(output_dir: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Append records to `{output_dir}/token_credit.jsonl` (created if needed); returns its path."""
    path = Path(output_dir) / TOKEN_CREDIT_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for record in records:
            # allow_nan=False: a NaN slipping past token_credit_record must fail here, not in the browser.
            handle.write(json.dumps(validate_record(record), ensure_ascii=False, allow_nan=False) + "\n")
    return path


def find_token_credit_file(run: str | Path) -> Path:
    """`run` itself if it is a file, else `run/token_credit.jsonl`; `FileNotFoundError` with a clear message."""
    run = Path(run)
    if run.is_file():
        return run
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    path = run / TOKEN_CREDIT_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: train with log_token_credit=True to record token credit")
    return path


def read_token_credit(run: str | Path) -> list[dict[str, Any]]:
    """Read and validate all records of a run directory (or of a `token_credit.jsonl` path)."""
    path = find_token_credit_file(run)
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(validate_record(json.loads(line)))
            except (json.JSONDecodeError, TokenCreditError) as error:
                raise TokenCreditError(f"{path}:{line_number}: {error}") from error
    return records


def select_records(
    records: Sequence[dict[str, Any]], *, step: int | str | None = None, max_completions: int | None = None
) -> list[dict[str, Any]]:
    """Keep the records of one step (an int, or `"last"`; `None` keeps all), then the first `max_completions`."""
    if step == "last":
        step = max((record["step"] for record in records), default=None)
    selected = [record for record in records if step is None or record["step"] == int(step)]
    return selected if max_completions is None else selected[:max_completions]


def credit_changed(record: dict[str, Any]) -> bool:
    """Whether the method gave any token of the completion a weight other than 1 (`Â_t != A`).

    Untouched tokens read exactly 1 (`token_credit_record` divides in float32), so the comparison is exact.
    """
    return any(weight is not None and weight != 1.0 for weight in record["weights"])


def format_steps(steps: Iterable[int]) -> str:
    """Steps as sorted, comma-separated runs: `1-3, 5, 10-12` (`none` when empty)."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in runs) or "none"


# --------------------------------------------------------------------------------------------------
# Colours and token text
# --------------------------------------------------------------------------------------------------


def weight_rgb(weight: float | None, log2_range: float = LOG2_RANGE) -> tuple[int, int, int]:
    """Diverging colour of a weight: white at 1, linear in `log2(w)`, saturated beyond `±log2_range`.

    Undefined weights (`None`, non-positive, NaN) are drawn white: no evidence either way.
    """
    if weight is None or not weight > 0 or not math.isfinite(weight):
        return _MID_RGB
    position = max(-1.0, min(1.0, math.log2(weight) / log2_range))
    end = _HIGH_RGB if position > 0 else _LOW_RGB
    return tuple(round(mid + abs(position) * (target - mid)) for mid, target in zip(_MID_RGB, end))


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


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def token_tooltip(record: dict[str, Any], index: int) -> str:
    """Plain-text hover text of token `index`: its text, weight, log-prob, entropy and method statistic."""
    logp = record["logps"][index]
    lines = [
        f"token {index}: {record['tokens'][index]!r} (id {record['token_ids'][index]})",
        f"weight Â/A = {_fmt(record['weights'][index])}",
        f"log p = {_fmt(logp)}" + ("" if logp is None else f" (p = {math.exp(logp):.3g})"),
        f"entropy = {_fmt(record['entropies'][index])} nats",
    ]
    if record["statistic"] is not None:
        lines.append(f"{record['statistic_name']} = {_fmt(record['statistic'][index])}")
    return "\n".join(lines)


def _completion_header(record: dict[str, Any]) -> str:
    return (
        f"step {record['step']} · {record['method']} · reward {_fmt(record['reward'])}"
        f" · advantage {_fmt(record['advantage'], '+.3f')}"
    )


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
        f' data-w="{_fmt(record["weights"][index], ".4g")}" data-stat="{_fmt(statistic, ".4g")}"'
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
        f'<div class="header">{html.escape(_completion_header(record))}</div>\n'
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
        ax.text(0, first_line + 0.5, _completion_header(record), weight="bold", **text_style)
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
        "credit", [[c / 255 for c in rgb] for rgb in (_LOW_RGB, _MID_RGB, _HIGH_RGB)]
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

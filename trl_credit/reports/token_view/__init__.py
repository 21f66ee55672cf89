"""The token-credit view: where a credit method put the advantage, token by token, for a few sampled completions.

Each token's background shows its weight `w = Â/A` on a diverging scale centred at 1 (white), on a log2 axis: red
tokens got less credit than GRPO would give them, blue tokens more. `records` reads back the `token_credit.jsonl` file
the trainer writes (its schema: `trl_credit.trainer.token_credit_records`); `page` renders it as a self-contained HTML
page (`trl-credit inspect`), `figure` as a PNG, both with the colours of `colour_scale`. Importing the package imports
neither TRL, torch nor matplotlib.
"""

from .colour_scale import LOG2_RANGE, visible_token_text, weight_hex, weight_rgb
from .figure import render_token_credit_png
from .page import embed_html, render_token_credit_html, token_tooltip, write_token_credit_html
from .records import (
    RECORD_KEYS,
    TOKEN_CREDIT_FILENAME,
    TokenCreditError,
    append_token_credit,
    credit_changed,
    drop_token_credit_after,
    find_token_credit_file,
    format_steps,
    method_statistic_name,
    read_token_credit,
    select_records,
    token_credit_record,
    token_credit_records_from_batch,
    validate_record,
)

__all__ = [
    "LOG2_RANGE",
    "RECORD_KEYS",
    "TOKEN_CREDIT_FILENAME",
    "TokenCreditError",
    "append_token_credit",
    "credit_changed",
    "drop_token_credit_after",
    "embed_html",
    "find_token_credit_file",
    "format_steps",
    "method_statistic_name",
    "read_token_credit",
    "render_token_credit_html",
    "render_token_credit_png",
    "select_records",
    "token_credit_record",
    "token_credit_records_from_batch",
    "token_tooltip",
    "validate_record",
    "visible_token_text",
    "weight_hex",
    "weight_rgb",
    "write_token_credit_html",
]

"""Token-credit records: the schema of `{output_dir}/token_credit.jsonl`, which the trainer writes.

With `log_token_credit=True` the trainer appends one JSON object per sampled completion to the file
(`token_credit_log.TokenCreditLog`). The schema lives here, in `token_credit_record`, called with the tensors of one
completion (through `token_credit_records_from_batch`); `trl_credit.reports.token_view` reads the file back for the
views. Importing this module imports neither TRL nor torch, so `trl-credit inspect` starts quickly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TOKEN_CREDIT_FILENAME = "token_credit.jsonl"

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


class TokenCreditError(ValueError):
    """A token-credit file or record that does not follow the schema."""


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


def _json_float(value: float) -> float | None:
    """Round to 6 significant digits (a long completion would otherwise cost ~20 bytes per number).

    JSON has no NaN/inf (browsers reject them in JSON), so non-finite values are stored as null.
    """
    value = float(value)
    return float(f"{value:.6g}") if math.isfinite(value) else None


class _KeptPositions:
    """The valid positions of one completion's `(T,)` inputs (all when `mask` is None): the kept token ids, and the
    kept values of any other per-token input."""

    def __init__(self, token_ids, mask):
        import torch  # deferred: reading and rendering records must not pay for importing torch

        self.ids_T = torch.as_tensor(token_ids).reshape(-1).cpu()
        self.keep_T = torch.ones_like(self.ids_T, dtype=torch.bool) if mask is None else torch.as_tensor(mask)
        self.keep_T = self.keep_T.reshape(-1).bool().cpu()
        if self.keep_T.shape != self.ids_T.shape:
            raise TokenCreditError(f"mask has {self.keep_T.numel()} positions but token_ids has {self.ids_T.numel()}")
        self.ids = self.ids_T[self.keep_T].tolist()

    def values(self, values) -> list[float]:
        import torch

        values_T = torch.as_tensor(values).detach().reshape(-1).float().cpu()
        if values_T.shape != self.ids_T.shape:
            raise TokenCreditError(
                f"per-token input has {values_T.numel()} positions but token_ids has {self.ids_T.numel()}"
            )
        return values_T[self.keep_T].tolist()

    def tokens(self, tokens: Sequence[str] | None, tokenizer) -> list[str]:
        """The kept ones of `tokens`, or, without them, each kept token decoded on its own by `tokenizer`."""
        if tokens is not None:
            return [token for token, keep in zip(tokens, self.keep_T.tolist(), strict=True) if keep]
        if tokenizer is None:
            raise TokenCreditError("pass either `tokens` or a `tokenizer` to decode the token ids")
        return tokenizer.batch_decode(
            [[token_id] for token_id in self.ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def weights(self, token_advantages, advantage: float) -> list[float]:
        """`Â_t / A` of each kept token, 1.0 when `A == 0`."""
        import torch

        # Divide in float32, the precision Â was computed in, so that an untouched token reads exactly 1.
        advantage_f32 = torch.tensor(float(advantage), dtype=torch.float32)
        if advantage_f32 == 0:
            return [1.0] * len(self.ids)
        return (torch.tensor(self.values(token_advantages), dtype=torch.float32) / advantage_f32).tolist()


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
    """Build the token-credit record of one completion (one line of `token_credit.jsonl`): a JSON-serialisable dict
    with the keys of `RECORD_KEYS`.

    `step` is the optimizer step as TRL logs it (1-based, the `step` of `trainer_state.json`); `method` the credit
    method (`"grpo"`, a registered name, or a stack); `prompt` the prompt text as the model saw it, `completion` the
    decoded completion; `reward` its total reward and `advantage` its sequence advantage `A_i`.

    The per-token inputs are 1-D tensors, arrays or lists of length `T` (one completion row of the batch): the sampled
    `token_ids`, the `token_advantages` `Â_{i,t}` handed to the loss, the sampled tokens' `logps`, the next-token
    `entropies` (nats) and the method's own per-token `statistic` (or None; named `statistic_name`, by default the
    registration's, `method_statistic_name(method)`). Positions where `mask` (bool or 0/1, all valid when omitted) is
    false (padding, tool output) are dropped. The weight of each kept token is `Â_t / A`, or 1.0 when `A == 0` (every
    method leaves such responses untouched). `tokens`: the decoded text of each of the `T` tokens; when omitted,
    `tokenizer` decodes each kept token on its own (a byte-level BPE token that holds part of a multi-byte character
    decodes to U+FFFD).
    """
    positions = _KeptPositions(token_ids, mask)
    kept_ids, kept = positions.ids, positions.values
    weights = positions.weights(token_advantages, advantage)
    tokens = positions.tokens(tokens, tokenizer)
    statistic_name = method_statistic_name(method) if statistic_name is None else statistic_name
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


def drop_token_credit_after(output_dir: str | Path, step: int) -> int:
    """Remove the records of steps after `step` from `{output_dir}/token_credit.jsonl`; returns how many there were.

    The trainer calls it when training begins, so that a run resumed from `checkpoint-{step}` records the steps it
    trains again once. The other lines are kept byte for byte, a line that is no record too (reading reports it).
    """
    path = Path(output_dir) / TOKEN_CREDIT_FILENAME
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if not _recorded_after(line, step)]
    if len(kept) < len(lines):
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(kept), encoding="utf-8")
        os.replace(partial, path)  # the log is never left half-written, whatever interrupts this
    return len(lines) - len(kept)


def _recorded_after(line: str, step: int) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step

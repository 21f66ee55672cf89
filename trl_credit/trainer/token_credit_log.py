"""The token-credit log: per-token credit of a few completions of a training batch, appended to
`output_dir/token_credit.jsonl` for `trl-credit inspect` (`log_token_credit=True`).

For each training generation batch that TRL's next log entry reports (`token_credit_step`), the trainer previews a few
of its rows as the training forward will credit them (`preview_token_credit`) and hands them to `TokenCreditLog`, the
callback it adds, which writes them at the end of the step (the schema: `token_credit_records`).

A run resumed from `checkpoint-N` trains steps N + 1, ... again, and logs them again: when training begins, the
records of steps after the state's global step (written by the run that was interrupted, or by an earlier run in the
same folder) are dropped, so that each step's records appear once, those of the run that trained it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import TrainerCallback
from transformers.utils import logging

from ..methods.batch import token_advantages
from .batch_layout import REWARDS, SEQUENCE_ADVANTAGES, valid_mask
from .token_credit_records import append_token_credit, drop_token_credit_after, token_credit_records_from_batch
from .trl_compat import MULTIMODAL_KEYS

logger = logging.get_logger(__name__)


@dataclass
class TokenCreditPreview:
    """Rows of a training generation batch as the training forward credits them, to be recorded under `step`.

    `batch`: those rows of the batch's tensors (advantages and loss weights as the training forward writes them);
    `logps_bT` / `entropy_bT`: the policy's, before it moved; `statistic_bT`: the last method's per-token statistic.
    """

    step: int
    batch: dict[str, torch.Tensor]
    logps_bT: torch.Tensor
    entropy_bT: torch.Tensor
    statistic_bT: torch.Tensor | None


def token_credit_step(args, state, num_iterations: int) -> int | None:
    """The step under which a training generation batch generated now is recorded, or None if it is not.

    Steps are TRL's (1-based): the first optimizer step trained on the batch, and the step whose log entry reports its
    rewards (TRL's next logging step); the batch is recorded when that entry falls within the steps it serves.
    """
    first_step = state.global_step + 1
    steps_served = max(1, args.steps_per_generation * num_iterations // args.gradient_accumulation_steps)
    logging_steps = state.logging_steps
    if first_step == 1 and args.logging_first_step:
        logged_step = 1
    else:
        logged_step = int(-(-first_step // logging_steps) * logging_steps)  # the next multiple: ceiling division
    return logged_step if logged_step < first_step + steps_served else None


@torch.no_grad()
def preview_token_credit(batch, statistic_BT, step: int, samples: int, score, credit) -> TokenCreditPreview:
    """`samples` rows of a training generation `batch`, spread over it so that several prompt groups appear, credited
    as the first training forward will credit them (the policy has not moved yet), to be recorded under `step`.

    `score(inputs)`: the policy's log-probs, entropies and recorded final hidden states over `inputs`, a small no-grad
    forward every process runs (collective under ZeRO-3); `credit(rows, logps_bT, entropy_bT, hidden)`: the
    training-forward stage on the rows, without its metrics (None without that stage); `statistic_BT`: the generation
    stage's. Image inputs are not laid out per row: then every row is scored and the sampled ones kept.
    """
    num_rows = batch["completion_ids"].size(0)
    rows = torch.linspace(0, num_rows - 1, min(samples, num_rows)).round().long().unique()
    sub = {
        key: value[rows]
        for key, value in batch.items()
        if isinstance(value, torch.Tensor)
        and value.dim() >= 1
        and value.size(0) == num_rows
        and key not in MULTIMODAL_KEYS
    }
    has_images = any(key in batch for key in MULTIMODAL_KEYS)
    logps_bT, entropy_bT, hidden = score(batch if has_images else sub)
    if has_images:
        logps_bT, entropy_bT = logps_bT[rows], entropy_bT[rows]
        hidden = [torch.cat(hidden)[rows]] if hidden else hidden
    statistic_bT = None if statistic_BT is None else statistic_BT[rows]
    if credit is not None:
        credited = credit(sub, logps_bT, entropy_bT, hidden)
        statistic_bT = credited.statistic_BT if credited.statistic_BT is not None else statistic_bT
    return TokenCreditPreview(step, sub, logps_bT, entropy_bT, statistic_bT)


class TokenCreditLog(TrainerCallback):
    """Writes the `preview` the trainer hands it once, at the end of the step (the main process writes), and, when
    training begins (from scratch or from a checkpoint), drops the records of later steps. `tokenizer` decodes the
    prompts and completions."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # The rows of the last training generation batch to record, as the training forward credits them (for the
        # batches the log records); None before the first.
        self.preview: TokenCreditPreview | None = None
        self._written: TokenCreditPreview | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # the process that writes the records
            dropped = drop_token_credit_after(args.output_dir, state.global_step)
            if dropped:
                logger.warning(
                    f"token_credit.jsonl: dropped {dropped} records of steps after step {state.global_step}, written "
                    "before this run began (by the interrupted run it resumes, or an earlier run in this output_dir); "
                    "this run records those steps again"
                )

    def on_step_end(self, args, state, control, **kwargs):
        preview = self.preview
        if preview is None or preview is self._written:
            return
        self._written = preview
        if state.is_world_process_zero:
            append_token_credit(args.output_dir, self.records(preview, args.credit_method))

    def records(self, preview: TokenCreditPreview, method: str) -> list[dict]:
        """The token-credit records of `preview`'s rows (`token_credit_records.token_credit_record` each)."""
        rows = {key: value.cpu() for key, value in preview.batch.items()}
        mask_bT = valid_mask(rows)
        advantages_b = rows.get(SEQUENCE_ADVANTAGES, rows["advantages"])
        advantages_bT = token_advantages(rows["advantages"], mask_bT)
        tokenizer = self.tokenizer

        def decode(ids_bT, m_bT):
            return [tokenizer.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(ids_bT, m_bT)]

        return token_credit_records_from_batch(
            step=preview.step,
            method=method,
            prompts=decode(rows["prompt_ids"], rows["prompt_mask"]),
            completions=decode(rows["completion_ids"], rows["completion_mask"]),
            rewards_B=rows[REWARDS],
            advantages_B=advantages_b,
            completion_ids_BT=rows["completion_ids"],
            token_advantages_BT=advantages_bT,
            logps_BT=preview.logps_bT.cpu(),
            entropies_BT=preview.entropy_bT.cpu(),
            mask_BT=mask_bT,
            tokenizer=tokenizer,
            statistic_BT=None if preview.statistic_bT is None else preview.statistic_bT.cpu(),
        )

"""The token-credit log: per-token credit of a few completions of a training batch, appended to
`output_dir/token_credit.jsonl` for `trl-credit inspect` (`log_token_credit=True`).

A run resumed from `checkpoint-N` trains steps N + 1, ... again, and logs them again: when training begins, the
records of steps after the state's global step (written by the run that was interrupted, or by an earlier run in the
same folder) are dropped, so that each step's records appear once, those of the run that trained it.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback
from transformers.utils import logging

from .batch_layout import SEQUENCE_ADVANTAGES, valid_mask
from .recorders import recorded_final_hidden
from .sources import TOKEN_CREDIT_LOG_FORWARDS, policy_logps_and_entropy
from .trl_compat import MULTIMODAL_KEYS

logger = logging.get_logger(__name__)


class DropRecordsAfterResumedStep(TrainerCallback):
    """When training begins (from scratch or from a checkpoint), drop the token-credit records of later steps."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # the process that writes the records
            from ..reports.token_view import drop_token_credit_after

            dropped = drop_token_credit_after(args.output_dir, state.global_step)
            if dropped:
                logger.warning(
                    f"token_credit.jsonl: dropped {dropped} records of steps after step {state.global_step}, written "
                    "before this run began (by the interrupted run it resumes, or an earlier run in this output_dir); "
                    "this run records those steps again"
                )


def log_token_credit(trainer, batch, statistic_BT) -> None:
    """Log `batch` (a training generation batch) when TRL's next log entry reports it.

    Steps are TRL's (1-based): the first optimizer step trained on this batch, and the step whose log entry reports its
    rewards (TRL's next logging step); the batch is recorded when that entry falls within the steps it serves.
    `statistic_BT`: the last generation-batch method's per-token statistic, or None.
    """
    args = trainer.args
    first_step = trainer.state.global_step + 1
    generate_every = args.steps_per_generation * trainer.num_iterations
    steps_served = max(1, generate_every // args.gradient_accumulation_steps)
    logging_steps = trainer.state.logging_steps
    logged_step = (
        1
        if first_step == 1 and args.logging_first_step
        else int(-(-first_step // logging_steps) * logging_steps)  # the next multiple: ceiling division
    )
    if logged_step < first_step + steps_served:
        _append_token_credit(trainer, batch, statistic_BT, logged_step)


@torch.no_grad()
def _append_token_credit(trainer, batch, statistic_BT, step: int) -> None:
    """Append per-token credit of a few completions to `output_dir/token_credit.jsonl`, labelled `step`.

    Rows are spread over the local batch so that several prompt groups appear; methods of the training
    forward are applied to them as the first training forward will (the policy has not moved yet). Every
    process runs the small forward (ZeRO-3 forwards are collective); only the main process writes.
    """
    from ..reports.token_view import append_token_credit, token_credit_records_from_batch

    num_rows = batch["completion_ids"].size(0)
    rows = torch.linspace(0, num_rows - 1, min(trainer.args.token_credit_samples, num_rows)).round().long().unique()
    sub = {
        key: value[rows]
        for key, value in batch.items()
        if isinstance(value, torch.Tensor)
        and value.dim() >= 1
        and value.size(0) == num_rows
        and key not in MULTIMODAL_KEYS
    }
    # Image inputs are not laid out per row: then every row is scored and the sampled ones kept.
    has_images = any(key in batch for key in MULTIMODAL_KEYS)
    with recorded_final_hidden(trainer, trainer._records_hidden) as hidden:
        logps_bT, entropy_bT = policy_logps_and_entropy(
            trainer, batch if has_images else sub, trainer._forward_batch_size(), counted_as=TOKEN_CREDIT_LOG_FORWARDS
        )
    if has_images:
        logps_bT, entropy_bT = logps_bT[rows], entropy_bT[rows]
        hidden = [torch.cat(hidden)[rows]] if hidden else hidden
    if statistic_BT is not None:
        statistic_BT = statistic_BT[rows]
    if trainer._training_forward_methods:
        forward_statistics = trainer._forward_statistics(sub, logps_bT, entropy_bT, hidden)
        updates, forward_statistic = trainer._apply_credit(
            sub, trainer._training_forward_methods, forward_statistics, record_metrics=False
        )
        sub.update(updates)
        statistic_BT = forward_statistic if forward_statistic is not None else statistic_BT
    mask_bT = valid_mask(sub)
    advantages_b = sub.get(SEQUENCE_ADVANTAGES, sub["advantages"])
    token_advantages = sub["advantages"] if sub["advantages"].dim() == 2 else advantages_b.unsqueeze(1) * mask_bT
    if not trainer.accelerator.is_main_process:
        return
    first_row = trainer.accelerator.process_index * num_rows
    rewards_per_func = trainer._last_rewards_per_func[first_row + rows.to(trainer._last_rewards_per_func.device)]
    rewards_b = (rewards_per_func * trainer.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
    tokenizer = trainer.processing_class
    decode = lambda ids_bT, m_bT: [  # noqa: E731
        tokenizer.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(ids_bT, m_bT)
    ]
    records = token_credit_records_from_batch(
        step=step,
        method=trainer.credit_method,
        prompts=decode(sub["prompt_ids"], sub["prompt_mask"]),
        completions=decode(sub["completion_ids"], sub["completion_mask"]),
        rewards_B=rewards_b.cpu(),
        advantages_B=advantages_b.cpu(),
        completion_ids_BT=sub["completion_ids"].cpu(),
        token_advantages_BT=token_advantages.cpu(),
        logps_BT=logps_bT.cpu(),
        entropies_BT=entropy_bT.cpu(),
        mask_BT=mask_bT.cpu(),
        tokenizer=tokenizer,
        statistic_BT=None if statistic_BT is None else statistic_BT.cpu(),
    )
    append_token_credit(trainer.args.output_dir, records)

"""TRL's generation batch as the trainer reads it (the model inputs of prompt + completion, the tokens TRL's loss
weighs) and the keys it adds to it, which TRL's shuffle and split carry along with every row."""

from __future__ import annotations

import torch

from .trl_compat import MULTIMODAL_KEYS

SEQUENCE_ADVANTAGES = "credit_sequence_advantages"  # batch key: GRPO's A_i, kept once the advantages are (B, T)
GROUP_INDEX = "credit_group_index"  # batch key: each row's prompt group (global over processes)
REWARDS = "credit_rewards"  # batch key: each row's raw reward (TRL's weighted sum over reward functions)


def statistic_key(name: str) -> str:
    """The batch key a generation-batch statistic travels under."""
    return f"credit_{name}"


def groups_and_rewards(batch, rewards_N, process_index: int, num_generations: int) -> dict[str, torch.Tensor]:
    """Batch keys for advantage estimators: each row's prompt group and raw reward, as TRL laid them out.

    TRL's generation batch holds every process's rows in process order, each prompt's completions consecutive; the
    rows of this process are its slice of `rewards_N`, the rewards of every process's rows.
    """
    num_rows = batch["completion_ids"].size(0)
    rows = process_index * num_rows + torch.arange(num_rows, device=batch["completion_ids"].device)
    rewards = rewards_N[rows.to(rewards_N.device)]
    return {GROUP_INDEX: rows // num_generations, REWARDS: rewards.float().to(rows.device)}


def sequence_inputs(batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """`(input_ids, attention_mask, multimodal kwargs)` of prompt + completion, as TRL's loss builds them."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    multimodal = {key: batch[key] for key in MULTIMODAL_KEYS if batch.get(key) is not None}
    return input_ids, attention_mask, multimodal


def loss_weights(batch) -> torch.Tensor:
    """Completion mask x tool mask, as TRL's loss weighs tokens (soft where a generation-batch method weighed them)."""
    return (batch["completion_mask"] * batch.get("tool_mask", 1.0)).float()


def valid_mask(batch) -> torch.Tensor:
    """The tokens TRL's loss counts: a positive `loss_weights`."""
    return loss_weights(batch).bool()


def rows_of(chunks: list[torch.Tensor], rows: slice) -> torch.Tensor:
    """Rows `rows` of row chunks laid end to end (the hidden states of one forward per row chunk, as TRL scores a
    batch): a view where they lie in one chunk, else those rows' parts concatenated, never the whole batch."""
    parts, first = [], 0
    for chunk in chunks:
        start, stop = max(rows.start, first), min(rows.stop, first + chunk.size(0))
        if start < stop:
            parts.append(chunk[start - first : stop - first])
        first += chunk.size(0)
    return parts[0] if len(parts) == 1 else torch.cat(parts)

"""Synthetic batches for every registered method, as the trainer hands them over, and a peak-memory probe.

A batch is `B = prompts x G` rows of `T` completion tokens: GRPO's group-normalised advantages of 0/1 rewards, a
TRL-style 0/1 int32 completion mask (lengths uniform in [T/4, T]), every per-token statistic of
`trl_credit.methods.batch.STATISTICS` as `(B, T)` float32 in its range, and the fields the token-reading methods need
(completion ids with a pad id past each end, their texts, the prompt groups, the raw rewards). The completions of a
group share a prefix of random length, so the group-conflict methods find conflicts; a few ids decode to words of
HICRA's grams, so its matcher finds some.
"""

from __future__ import annotations

import gc

import torch

GRAM_WORDS = ("we", "can", "use", "the", "fact", "that", "let's", "try", "a", "different", "approach")
DISTINCT_IDS = 4096  # ids drawn from the first ones of the vocabulary, as a real completion uses a small part of it


def token_table(vocab_size: int) -> list[str]:
    """A decoded text for every id: the gram words for the first ids, `" w<id>"` for the others."""
    return [f" {GRAM_WORDS[i]}" if i < len(GRAM_WORDS) else f" w{i}" for i in range(vocab_size)]


def method_batch(rows: int, length: int, group_size: int, vocab_size: int = 151_936, seed: int = 0):
    """`(advantages_B, mask_BT, named)`: what `CreditMethod.on_tensors` takes, for every registered method."""
    from trl_credit.methods import batch as statistics

    if rows % group_size:
        raise ValueError(f"rows={rows} is not a multiple of the group size {group_size}")
    g = torch.Generator().manual_seed(seed)
    group_index_B = torch.arange(rows) // group_size
    rewards_B = (torch.rand(rows, generator=g) < 0.5).float()
    grouped = rewards_B.view(-1, group_size)
    advantages_B = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
    lengths_B = torch.randint(length // 4, length + 1, (rows,), generator=g)
    mask_BT = (torch.arange(length).unsqueeze(0) < lengths_B.unsqueeze(1)).int()
    valid_BT = mask_BT.bool()

    pad_id = vocab_size - 1
    ids_BT = torch.randint(0, DISTINCT_IDS, (rows, length), generator=g)
    prefix_B = torch.randint(0, 64, (rows,), generator=g)
    leaders_BT = ids_BT.view(-1, group_size, length)[:, :1].expand(-1, group_size, -1).reshape(rows, length)
    ids_BT = torch.where(torch.arange(length).unsqueeze(0) < prefix_B.unsqueeze(1), leaders_BT, ids_BT)
    ids_BT = torch.where(valid_BT, ids_BT, pad_id)

    logps_BT = -torch.rand(rows, length, generator=g) * 6
    rollout_logps_BT = logps_BT - 0.05 * torch.rand(rows, length, generator=g)
    unsampled_mass_BT = -torch.expm1(rollout_logps_BT)  # the rollout distribution: the rest on a few tokens
    entropy_BT = torch.rand(rows, length, generator=g) * 3
    zero = torch.zeros(())
    values = {
        statistics.POLICY_LOGPS: logps_BT,
        statistics.POLICY_ENTROPY: entropy_BT,
        statistics.POLICY_LOGIT_GAP: logps_BT * 0.8,
        statistics.ROLLOUT_LOGPS: rollout_logps_BT,
        statistics.ROLLOUT_ENTROPY: entropy_BT + 0.05 * torch.rand(rows, length, generator=g),
        statistics.ROLLOUT_UNSAMPLED_MASS: unsampled_mass_BT,
        statistics.ROLLOUT_UNSAMPLED_SUM_SQ_PROBS: unsampled_mass_BT.square() * torch.rand(rows, length, generator=g),
        statistics.ROLLOUT_MEAN_ENTROPY: torch.full((rows, length), entropy_BT[valid_BT].mean().item()),
        statistics.REFERENCE_DEVIATION: torch.rand(rows, length, generator=g) * 0.3,
        statistics.PREVIOUS_POLICY_DEVIATION: torch.rand(rows, length, generator=g) * 0.1,
    }
    named = {name: torch.where(valid_BT, value, zero) for name, value in values.items()}
    texts = token_table(vocab_size)
    named.update(
        vocab_size=vocab_size,
        rewards_B=rewards_B,
        group_index_B=group_index_B,
        completion_ids_BT=ids_BT,
        pad_token_id=pad_id,
        token_texts=lambda row: [texts[i] for i in row],
    )
    return advantages_B, mask_BT, named


def arguments_for(method, named: dict) -> dict:
    """`named` less the statistics `method` does not read: the trainer hands a method only its own statistics (and
    `on_tensors` checks every statistic it is given)."""
    from trl_credit.methods.batch import STATISTICS

    reads = set(method.statistics_for(method.hyperparameters()))
    return {key: value for key, value in named.items() if key not in STATISTICS or key in reads}


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def extra_peak_bytes(fn) -> int:
    """Resident-set high-water mark reached while `fn()` runs, above the resident set before it.

    Exact only in a process whose large allocations go back to the kernel when freed (glibc with a fixed
    `MALLOC_MMAP_THRESHOLD_`, see `MEMORY_ENV`): otherwise memory freed earlier is reused without growing the resident
    set. Includes what `fn` returns (its outputs are part of its cost).
    """
    gc.collect()
    before = _status_kib("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current resident set
        f.write("5")
    result = fn()
    peak = _status_kib("VmHWM:")
    del result
    return max(0, peak - before) * 1024


# Every allocation of 64 KiB or more is its own mapping, returned to the kernel when freed, and nothing is trimmed
# lazily: the resident set then follows the live tensors.
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 10), "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_ARENA_MAX": "1"}

"""How much GTPO's per-prompt conflict groups differ from the official pooling of a whole micro-batch.

The official `GTPO_accumulated_loss` (winstonsmith1897/GTPO) views a micro-batch's rewards as one row, so every
completion of the micro-batch is in one conflict group, whatever its prompt; `trl_credit`'s GTPO takes the conflicts
within each prompt's group. This script draws seeded micro-batches of several prompts and compares the package's
advantages with the official rule over the pooled micro-batch (`gtpo_loop` of `tests/reference_formulas.py`, with
one group), and checks on the way that the package equals the same loop per prompt.

    python benchmarks/gtpo_pooling.py [--cases 40 --vocab 4 8 32]

Each case: 2 to 4 prompts of 2 to 4 completions, up to 7 tokens drawn from `vocab` ids (a small vocabulary makes
conflicts common), the pad id 0 as EOS on most completions, binary rewards, unscaled advantages `r - mean` per
prompt, rollout entropies uniform in [0, 1.4) (the default threshold 0.7 keeps about half), official defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _common  # noqa: F401  (repo import path, offline environment)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the official rule is a test reference
from reference_formulas import gtpo_loop  # noqa: E402

from trl_credit.methods import gtpo_advantages  # noqa: E402

PAD = 0


def micro_batch(seed: int, vocab: int, cols: int = 7):
    g = torch.Generator().manual_seed(seed)
    prompts, size = int(torch.randint(2, 5, (1,), generator=g)), int(torch.randint(2, 5, (1,), generator=g))
    rows = prompts * size
    ids = torch.randint(1, vocab + 1, (rows, cols), generator=g)
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    positions = torch.arange(cols).unsqueeze(0)
    ends = torch.rand(rows, generator=g) < 0.8
    ids[ends] = torch.where(positions == lengths[ends].unsqueeze(1) - 1, PAD, ids[ends])
    mask = positions < lengths.unsqueeze(1)
    ids = torch.where(mask, ids, PAD)
    rewards = torch.randint(0, 2, (prompts, size), generator=g).float()
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)).flatten()
    entropy = torch.rand(rows, cols, generator=g) * 1.4
    return advantages, ids, mask, entropy, torch.arange(prompts).repeat_interleave(size)


def compare(cases: int, vocab: int) -> dict:
    differing_cases, differing_tokens, tokens, largest = 0, 0, 0, 0.0
    for seed in range(cases):
        adv, ids, mask, entropy, prompt_B = micro_batch(seed, vocab)
        ours = gtpo_advantages(
            adv, mask, rollout_entropy=entropy, completion_ids_BT=ids, group_index_B=prompt_B, pad_token_id=PAD
        ).advantages_BT
        torch.testing.assert_close(ours, gtpo_loop(adv, ids, mask, entropy, prompt_B, PAD), atol=1e-6, rtol=1e-6)
        pooled = gtpo_loop(adv, ids, mask, entropy, torch.zeros_like(prompt_B), PAD)
        gap_N = (ours - pooled).abs()[mask]
        differing_cases += int((gap_N > 1e-6).any())
        differing_tokens += int((gap_N > 1e-6).sum())
        tokens += int(mask.sum())
        largest = max(largest, float(gap_N.max()))
    return {"cases": differing_cases, "tokens": differing_tokens, "all_tokens": tokens, "max": largest}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--vocab", type=int, nargs="+", default=[4, 8, 32])
    args = parser.parse_args()
    print("| vocabulary | cases that differ | tokens that differ | largest difference |")
    print("|---|---|---|---|")
    for vocab in args.vocab:
        r = compare(args.cases, vocab)
        print(
            f"| {vocab} | {r['cases']} of {args.cases} | {r['tokens']} of {r['all_tokens']} "
            f"({100 * r['tokens'] / r['all_tokens']:.1f} %) | {r['max']:.3g} |"
        )


if __name__ == "__main__":
    main()

"""HICRA: HIerarchy-aware Credit Assignment.

"Emergent Hierarchical Reasoning in LLMs through Reinforcement Learning", https://huggingface.co/papers/2509.03646.
The official repository (https://github.com/TIGER-AI-Lab/Hierarchical-Reasoner, commit 964c429) holds no code yet (its
README announces the verl recipe), so the rule is the paper's:

    m_{i,t} = 1 if token t of completion i lies inside an occurrence of a strategic gram in the decoded completion
    Â_{i,t} = A_{i,t} + alpha * |A_{i,t}| * m_{i,t}          alpha = 0.2

Planning tokens of a success are reinforced by `1 + alpha`, those of a failure penalised by `1 - alpha` only; every
other token keeps its advantage. With `alpha < 1` no advantage changes sign.

Strategic grams are n-grams (the paper: 3-5 words) that steer the reasoning, mined per model from successful solutions.
The paper publishes no list: the default is the three grams it gives as examples of deduction, branching and
backtracing; pass your own list with `hicra_grams`. A gram matches case-insensitively, as whole words, any run of
whitespace standing for a space, in the concatenated text of the completion's tokens as the tokenizer decodes them one
by one (`CreditBatch.token_texts`); a token is a planning token when its text overlaps a match. Overlapping
occurrences all count.

Statistics: none from the model; the completion ids and the tokenizer, at generation (one decode per distinct token id,
cached, and one scan of each completion's text per gram).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .batch import CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import check_fields, hyperparameter, in_range

HICRA_PAPER = paper(
    "Emergent Hierarchical Reasoning in LLMs through Reinforcement Learning",
    "2509.03646",
    "wang2025emergent",
    "Wang, Haozhe and Xu, Qixin and Liu, Che and Wu, Junhong and Lin, Fangzhen and Chen, Wenhu",
    year=2025,
)

# The paper's examples of strategic grams: deduction, branching, backtracing.
HICRA_PAPER_GRAMS = ("we can use the fact that", "let's try a different approach", "but the problem mentions that")


@dataclass
class HICRAArguments:
    """HICRA's hyperparameters (the paper's defaults)."""

    hicra_alpha: float = hyperparameter(
        0.2, "HICRA amplification alpha of planning tokens: A + alpha * |A|. In [0, 1); 0 is GRPO."
    )
    hicra_grams: list[str] = hyperparameter(
        list(HICRA_PAPER_GRAMS),
        "HICRA strategic grams (phrases) whose tokens are planning tokens; matched case-insensitively as "
        "whole words. Default: the paper's three examples.",
    )

    def __post_init__(self):
        check_fields(
            self,
            hicra_alpha=in_range(0.0, 1.0, high_open=True),
            hicra_grams=(_check_grams, "a non-empty list of non-blank phrases"),
        )


def _gram_pattern(grams: Sequence[str]) -> re.Pattern:
    """One pattern that finds, at every start, the longest gram occurring there as whole words: the union of their
    spans is that of every occurrence of every gram, overlapping ones included."""
    bodies = sorted({r"\s+".join(re.escape(word) for word in gram.split()) for gram in grams}, key=len, reverse=True)
    return re.compile(rf"(?<!\w)(?=({'|'.join(bodies)})(?!\w))", re.IGNORECASE)


def hicra_planning_mask(
    ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    token_texts: Callable[[list[int]], list[str]],
    grams: Sequence[str],
) -> torch.Tensor:
    """`(B, T)` bool: the valid tokens whose decoded text overlaps an occurrence of a gram in their completion."""
    pattern = _gram_pattern(grams)
    planning_BT = torch.zeros(mask_BT.shape, dtype=torch.bool)
    valid_BT = mask_BT.bool().cpu()
    for row in range(valid_BT.size(0)):
        positions = valid_BT[row].nonzero().flatten().tolist()
        if not positions:
            continue
        pieces = token_texts(ids_BT[row, positions].tolist())
        starts, ends, offset = [], [], 0
        for piece in pieces:
            starts.append(offset)
            offset += len(piece)
            ends.append(offset)
        text = "".join(pieces)
        for match in pattern.finditer(text):
            begin, end = match.span(1)
            first, last = bisect.bisect_right(ends, begin), bisect.bisect_left(starts, end)
            for index in range(first, last):
                if starts[index] < ends[index]:  # a token that decodes to nothing overlaps no text
                    planning_BT[row, positions[index]] = True
    return planning_BT.to(mask_BT.device)


def _check_grams(grams) -> bool:
    return len(grams) > 0 and all(isinstance(gram, str) and gram.split() for gram in grams)


@register_credit_method(
    "hicra", display_name="HICRA", statistics=(), arguments=HICRAArguments, paper=HICRA_PAPER, keeps_signs=True
)
def hicra(batch: CreditBatch, hicra_alpha: float, hicra_grams: list[str]) -> CreditResult:
    """Amplifies the advantage of planning tokens, those inside strategic grams of the decoded completion:
    A + alpha * |A|.

    Metrics:
        planning_fraction: fraction of valid tokens that are planning tokens (inside a strategic gram)
        planning_fraction_pos: the same among positive-advantage tokens
        completions_with_planning: fraction of completions with at least one planning token

    Token statistic:
        planning: 1 on planning tokens (inside a strategic gram), else 0
    """
    if batch.completion_ids_BT is None or batch.token_texts is None:
        raise ValueError("credit method 'hicra' reads the completion ids and their decoded texts; the batch has none")
    mask_BT = batch.mask_BT
    planning_BT = hicra_planning_mask(batch.completion_ids_BT, mask_BT, batch.token_texts, hicra_grams) & mask_BT
    advantages_BT = batch.advantages_BT + hicra_alpha * batch.advantages_BT.abs() * planning_BT
    positive_BT = mask_BT & (batch.advantages_BT > 0)
    # One count per completion: its first valid position.
    first_BT = mask_BT & (mask_BT.long().cumsum(dim=1) == 1)
    return CreditResult(
        advantages_BT=advantages_BT,
        metrics={
            "planning_fraction": planning_BT.float(),
            "planning_fraction_pos": (planning_BT & positive_BT, positive_BT),
            "completions_with_planning": (first_BT & planning_BT.any(dim=1, keepdim=True), first_BT),
        },
        statistic_BT=planning_BT.float(),
    )


# HICRA on plain tensors: `hicra_advantages(advantages_B, mask_BT, completion_ids_BT=..., token_texts=...,
# hicra_grams=[...])`.
hicra_advantages = get_credit_method("hicra").on_tensors

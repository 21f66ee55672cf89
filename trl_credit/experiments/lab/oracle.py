"""`oracle`: token credit from the task's ground truth, the ceiling the lab measures credit methods against.

    Â_{i,t} = A_i              on the tokens the task marks decisive (`LabTask.decisive`)
            = floor * A_i      on the other valid tokens (`oracle_floor`, default `ORACLE_FLOOR` = 0.25)
            = A_i everywhere   in a response with no decisive token (a `needle` failure: the task names no single
                               cause, so every token keeps the broadcast credit, as under GRPO)

Why a floor above 0: with no credit at all on the other tokens (`oracle_floor=0`), nothing holds the policy there
in place. On `mdp` with several forks, their distribution drifts away from the base policy's template as the forks
are learned (the share of template fillers fell from 0.91 to 0.42 by the step a fork flipped), the fork decisions
that read them fail, every group fails, the gradient is 0, and Adam's momentum carries the drift on: at half the
learning rate 5 of 8 seeds ended at the floor (final reward or avg@16 at most 0.05). A quarter of the sequence
advantage on the other tokens keeps them anchored and the oracle at or above GRPO (the measurements:
`docs/evidence.md`, `benchmarks/oracle_collapse.py`).

GRPO's broadcast credit (`A_i` on every token) is the floor of the lab's gap. The decisive tokens come as the statistic
`TASK_DECISIVE`, which only the lab's `LabTrainer` supplies: any other trainer refuses the method at init. It is
registered when `trl_credit.experiments.lab.trainer` is imported, so it is not a method of the package's trainers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...methods import CreditBatch, CreditResult, register_credit_method
from ...methods.settings import check_fields, in_range
from .statistics import TASK_DECISIVE

CEILING = "oracle"  # the name the lab's reports compare every method with
ORACLE_FLOOR = 0.25  # credit on the non-decisive tokens, as a fraction of A_i: the least that kept the oracle stable


@dataclass
class OracleArguments:
    oracle_floor: float = field(
        default=ORACLE_FLOOR,
        metadata={
            "help": "Oracle credit on non-decisive tokens, as a fraction of the sequence advantage. In [0, 1]; "
            "0 leaves them unanchored (the oracle then collapses on mdp with several forks), 1 is GRPO."
        },
    )

    def __post_init__(self):
        check_fields(self, oracle_floor=in_range(0.0, 1.0))


@torch.no_grad()
def oracle_advantages(
    advantages_B: torch.Tensor, decisive_BT: torch.Tensor, mask_BT: torch.Tensor, floor: float = ORACLE_FLOOR
) -> torch.Tensor:
    """`(B, T)` token advantages: `A_i` on decisive valid tokens, `floor * A_i` on the others, 0 where masked.

    A response with no decisive valid token keeps `A_i` on every valid token.
    """
    valid_BT = mask_BT.bool()
    decisive_BT = decisive_BT.bool() & valid_BT
    has_decisive_B = decisive_BT.any(dim=1, keepdim=True)
    weights_BT = torch.where(decisive_BT | ~has_decisive_B, 1.0, floor)
    return torch.where(valid_BT, weights_BT * advantages_B.float().unsqueeze(1), 0.0)


@register_credit_method(CEILING, display_name="Oracle", statistics=(TASK_DECISIVE,), arguments=OracleArguments)
def oracle(batch: CreditBatch, oracle_floor: float) -> CreditResult:
    """The credit lab's ceiling: the sequence advantage on the tokens the task's ground truth marks decisive, a
    quarter of it on the others.

    Metrics:
        decisive_fraction: fraction of valid tokens the task marks decisive
        broadcast_fraction: fraction of valid tokens in responses without a decisive token (broadcast credit)

    Token statistic:
        decisive: 1 on the tokens the task marks decisive, else 0
    """
    decisive_BT = batch[TASK_DECISIVE].bool() & batch.mask_BT
    advantages_BT = oracle_advantages(batch.sequence_advantages_B, decisive_BT, batch.mask_BT, oracle_floor)
    broadcast_BT = batch.mask_BT & ~decisive_BT.any(dim=1, keepdim=True)
    return CreditResult(
        advantages_BT=advantages_BT,
        metrics={"decisive_fraction": decisive_BT.float(), "broadcast_fraction": broadcast_BT.float()},
        statistic_BT=decisive_BT.float(),
    )

"""`oracle`: token credit from the task's ground truth, the ceiling the lab measures credit methods against.

    Â_{i,t} = A_i              on the tokens the task marks decisive (`LabTask.decisive`)
            = floor * A_i      on the other valid tokens (`oracle_floor`, default 0: they carry no credit)
            = A_i everywhere   in a response with no decisive token (a `needle` failure: the task names no single
                               cause, so every token keeps the broadcast credit, as under GRPO)

GRPO's broadcast credit (`A_i` on every token) is the floor. The decisive tokens come as the statistic
`TASK_DECISIVE`, which only the lab's `LabTrainer` supplies: any other trainer refuses the method at init. It is
registered when `trl_credit.lab.trainer` is imported, so it is not a method of the package's trainers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..methods._checks import in_range
from ..methods.registry import TASK_DECISIVE, CreditBatch, CreditResult, register_credit_method

CEILING = "oracle"  # the name the lab's reports compare every method with


@dataclass
class OracleArguments:
    oracle_floor: float = field(
        default=0.0,
        metadata={"help": "Oracle credit on non-decisive tokens, as a fraction of the sequence advantage. In [0, 1]."},
    )
    oracle_keep_mass: bool = field(
        default=False,
        metadata={"help": "Scale the decisive tokens' credit so each response keeps GRPO's total |A_i| mass."},
    )


@torch.no_grad()
def oracle_advantages(
    advantages_B: torch.Tensor,
    decisive_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    floor: float = 0.0,
    keep_mass: bool = False,
) -> torch.Tensor:
    """`(B, T)` token advantages: `A_i` on decisive valid tokens, `floor * A_i` on the others, 0 where masked.

    With `keep_mass`, the decisive tokens take `(n - floor * (n - d)) / d * A_i` instead (`n` valid, `d` decisive
    tokens), so the response's mass `sum_t |Â_t|` is `n * |A_i|`, GRPO's. A response with no decisive valid token
    keeps `A_i` on every valid token.
    """
    valid_BT = mask_BT.bool()
    decisive_BT = decisive_BT.bool() & valid_BT
    has_decisive_B = decisive_BT.any(dim=1, keepdim=True)
    decisive_weight_B1 = torch.ones_like(has_decisive_B, dtype=torch.float)
    if keep_mass:
        num_valid_B1 = valid_BT.sum(dim=1, keepdim=True).float()
        num_decisive_B1 = decisive_BT.sum(dim=1, keepdim=True).float()
        decisive_weight_B1 = (num_valid_B1 - floor * (num_valid_B1 - num_decisive_B1)) / num_decisive_B1.clamp(min=1)
    weights_BT = torch.where(decisive_BT, decisive_weight_B1, torch.where(has_decisive_B, floor, 1.0))
    return torch.where(valid_BT, weights_BT * advantages_B.float().unsqueeze(1), 0.0)


@register_credit_method(
    CEILING,
    statistics=(TASK_DECISIVE,),
    arguments=OracleArguments,
    checks={"oracle_floor": in_range(0.0, 1.0)},
    display_name="Oracle",
    summary="The credit lab's ceiling: the sequence advantage on the tokens the task's ground truth marks decisive.",
    diagnostics={
        "decisive_fraction": "fraction of valid tokens the task marks decisive",
        "broadcast_fraction": "fraction of valid tokens in responses without a decisive token (broadcast credit)",
    },
    token_statistic=("decisive", "1 on the tokens the task marks decisive, else 0"),
)
def oracle(batch: CreditBatch, oracle_floor: float, oracle_keep_mass: bool) -> CreditResult:
    decisive_BT = batch[TASK_DECISIVE].bool() & batch.mask_BT
    advantages_BT = oracle_advantages(
        batch.sequence_advantages_B, decisive_BT, batch.mask_BT, oracle_floor, oracle_keep_mass
    )
    broadcast_BT = batch.mask_BT & ~decisive_BT.any(dim=1, keepdim=True)
    return CreditResult(
        advantages_BT=advantages_BT,
        metrics={"decisive_fraction": decisive_BT.float(), "broadcast_fraction": broadcast_BT.float()},
        statistic_BT=decisive_BT.float(),
    )

"""Clip-Cov: detach a few high-covariance tokens from the policy gradient.

"The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
https://huggingface.co/papers/2505.22617 (code: https://github.com/PRIME-RL/Entropy-Mechanism-of-RL). Rule and
defaults as in verl (https://github.com/volcengine/verl, `verl/trainer/ppo/core_algos.py`,
`compute_policy_loss_clip_cov`, the same function in the TACO repository), over the tokens of one micro-batch, with
`w_t` the token's loss weight (verl's `response_mask`: 1, or what earlier methods of a stack left of it, 0 for a
dropped token, soft for min-p's):

    cov_t       = (A_t - mean_w(A)) * (log p_t - mean_w(log p))      weighted means, sum(w x) / sum(w)
    candidates  = tokens with w > 0 and lb < cov_t < ub that the PPO clip has not already clipped
                  (A > 0 and r > 1 + eps_high, or A < 0 and r < 1 - eps_low, with r = p / p_old)
    n           = max(int(clip_cov_ratio * sum(w)), 1)
    n of the candidates, drawn uniformly at random, lose their policy-gradient term

verl multiplies those tokens' PPO loss terms by 0 and keeps them in the loss normaliser; with `Â = 0` TRL's loss
does exactly that (every loss type's term is proportional to `Â`), so Clip-Cov needs no loss mask. The clip test uses
the token ratio and TRL's `(epsilon_low, epsilon_high)` (`CreditBatch.clip_range`), as verl does; under TRL's
`importance_sampling_level="sequence"` the loss clips the sequence ratio instead, which this test does not follow.

Statistics: the current policy's log-prob from the training forward, and the rollout log-prob for the ratio (TRL's
`old_per_token_logps` when it computed them; otherwise one no-grad forward per generation batch, which then equals
the current policy's at the training forward). Like verl, the means and the draw are per micro-batch and per process
(no gather). The draw uses its own `torch.Generator`, seeded from `clip_cov_seed`, the optimizer step and the
micro-batch's shape and valid-token count, so a rerun or a resumed run draws the same tokens and the global RNG
(sampling) is untouched; verl draws from the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ._checks import check_range, check_token_inputs, paper
from .registry import POLICY_LOGPS, ROLLOUT_LOGPS, CreditBatch, CreditResult, register_credit_method

CLIP_COV_PAPER = paper(
    "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    "2505.22617",
    "cui2025entropy",
    "Cui, Ganqu and Zhang, Yuchen and Chen, Jiacheng and Yuan, Lifan and Wang, Zhi and Zuo, Yuxin and Li, Haozhan and "
    "Fan, Yuchen and Chen, Huayu and Chen, Weize and Liu, Zhiyuan and Peng, Hao and Bai, Lei and Ouyang, Wanli and "
    "Cheng, Yu and Zhou, Bowen and Ding, Ning",
    year=2025,
)


@dataclass
class ClipCovArguments:
    """Clip-Cov's hyperparameters (verl's defaults)."""

    clip_cov_ratio: float = field(
        default=0.0002,
        metadata={
            "help": "Clip-Cov: fraction of a micro-batch's valid tokens whose gradient is detached (at least 1). In (0, 1]."
        },
    )
    clip_cov_lb: float = field(
        default=1.0, metadata={"help": "Clip-Cov: lower bound (exclusive) of the covariance of a candidate token."}
    )
    clip_cov_ub: float = field(
        default=5.0, metadata={"help": "Clip-Cov: upper bound (exclusive) of the covariance of a candidate token."}
    )
    clip_cov_seed: int = field(
        default=0, metadata={"help": "Clip-Cov: seed of the random draw (combined with the step and the micro-batch)."}
    )


def clip_cov_covariance(advantages_BT: torch.Tensor, logps_BT: torch.Tensor, weights_BT: torch.Tensor) -> torch.Tensor:
    """`(A - mean A) * (log p - mean log p)`, means weighted by the loss weights `weights_BT` (a bool mask weighs 0 or
    1); 0 where the weight is 0. Masked positions of `advantages_BT` and `logps_BT` must hold finite values."""
    weights_BT = weights_BT.float()
    total = weights_BT.sum().clamp(min=torch.finfo(torch.float32).tiny)
    mean_advantage = (advantages_BT * weights_BT).sum() / total
    mean_logp = (logps_BT * weights_BT).sum() / total
    return torch.where(weights_BT > 0, (advantages_BT - mean_advantage) * (logps_BT - mean_logp), 0.0)


def clip_cov_generator(seed: int, step: int, valid_BT: torch.Tensor) -> torch.Generator:
    """A CPU generator seeded from the seed, the step and the micro-batch's shape and valid-token count."""
    key = (int(seed), int(step), *valid_BT.shape, int(valid_BT.sum()))
    mixed = 0
    for part in key:
        mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


@torch.no_grad()
def clip_cov_advantages(
    advantages_BT: torch.Tensor,
    logps_BT: torch.Tensor,
    old_logps_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_range: tuple[float, float] = (0.2, 0.2),
    ratio: float = 0.0002,
    lb: float = 1.0,
    ub: float = 5.0,
    generator: torch.Generator | None = None,
    loss_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero the advantage of a random few tokens whose advantage-log-prob covariance lies in `(lb, ub)`.

    Args:
        advantages_BT: `(B, T)` token advantages.
        logps_BT: `(B, T)` log-probabilities of the sampled tokens under the current policy.
        old_logps_BT: `(B, T)` the same under the policy the loss takes its ratio against (rollout policy).
        mask_BT: `(B, T)` valid completion positions: one micro-batch, as verl computes it.
        clip_range: `(epsilon_low, epsilon_high)` of the PPO clip; tokens it already clips are not candidates.
        ratio: fraction of the valid tokens detached, `max(int(ratio * N), 1)` of them, in `(0, 1]`.
        lb, ub: exclusive covariance bounds of the candidates, `lb < ub`.
        generator: the random draw's CPU generator (a new one with torch's default seed when `None`).
        loss_weights_BT: `(B, T)` weights in `[0, 1]` of the valid tokens in the loss (earlier methods' loss masks);
            1 when `None`. They weigh the means and the count; a token of weight 0 is no candidate.

    Returns:
        `(advantages_BT, detached_BT, candidates_BT)`: the advantages with the drawn tokens set to 0, and bool masks
        of the drawn tokens and of the candidates.
    """
    check_range("ratio", ratio, 0.0, 1.0, low_open=True)
    if not (math.isfinite(lb) and math.isfinite(ub) and lb < ub):
        raise ValueError(f"clip-cov bounds must be finite with lb < ub, got {(lb, ub)}")
    valid_BT, (advantages_BT, logps_BT, old_logps_BT) = check_token_inputs(
        advantages_BT, mask_BT, logps_BT=logps_BT, old_logps_BT=old_logps_BT
    )
    weights_BT = valid_BT.float() if loss_weights_BT is None else torch.where(valid_BT, loss_weights_BT.float(), 0.0)
    valid_BT = weights_BT > 0
    epsilon_low, epsilon_high = clip_range
    ratio_BT = torch.exp(logps_BT - old_logps_BT)
    # verl: -A * clip(r) > -A * r, i.e. the clipped term is the one PPO's max keeps.
    clipped_BT = valid_BT & (
        -advantages_BT * ratio_BT.clamp(1 - epsilon_low, 1 + epsilon_high) > -advantages_BT * ratio_BT
    )
    covariance_BT = clip_cov_covariance(advantages_BT, logps_BT, weights_BT)
    candidates_BT = valid_BT & ~clipped_BT & (covariance_BT > lb) & (covariance_BT < ub)
    count = max(int(ratio * weights_BT.sum().item()), 1)
    positions_N2 = torch.nonzero(candidates_BT)  # row-major, as verl draws from
    generator = torch.Generator() if generator is None else generator
    order_N = torch.randperm(positions_N2.size(0), generator=generator).to(positions_N2.device)
    drawn_N2 = positions_N2[order_N[:count]]
    detached_BT = torch.zeros_like(valid_BT)
    detached_BT[drawn_N2[:, 0], drawn_N2[:, 1]] = True
    return advantages_BT.masked_fill(detached_BT, 0.0), detached_BT, candidates_BT


@register_credit_method(
    "clip_cov",
    statistics=(POLICY_LOGPS, ROLLOUT_LOGPS),
    arguments=ClipCovArguments,
    checks={
        "clip_cov_ratio": (lambda r: 0.0 < r <= 1.0, "in (0, 1]"),
        "clip_cov_lb": (math.isfinite, "finite"),
        "clip_cov_ub": (math.isfinite, "finite"),
    },
    paper=CLIP_COV_PAPER,
    display_name="Clip-Cov",
    summary="Zeroes the advantage of a random few tokens whose advantage-log-prob covariance lies in (lb, ub).",
    diagnostics={
        "detached_fraction": "fraction of valid tokens whose advantage was zeroed",
        "candidate_fraction": "fraction of valid tokens with covariance in (lb, ub), not clipped by PPO",
    },
    token_statistic=("covariance", "centred covariance (A - mean A)(log p - mean log p) over the micro-batch"),
)
def clip_cov(
    batch: CreditBatch, clip_cov_ratio: float, clip_cov_lb: float, clip_cov_ub: float, clip_cov_seed: int
) -> CreditResult:
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got {clip_cov_lb} and {clip_cov_ub}")
    logps_BT = batch[POLICY_LOGPS]
    advantages_BT, detached_BT, candidates_BT = clip_cov_advantages(
        batch.advantages_BT,
        logps_BT,
        batch[ROLLOUT_LOGPS],
        batch.mask_BT,
        batch.clip_range,
        clip_cov_ratio,
        clip_cov_lb,
        clip_cov_ub,
        clip_cov_generator(clip_cov_seed, batch.step, batch.mask_BT),
        batch.loss_weights_BT,
    )
    return CreditResult(
        advantages_BT=advantages_BT,
        metrics={
            "detached_fraction": (detached_BT, batch.mask_BT),
            "candidate_fraction": (candidates_BT, batch.mask_BT),
        },
        statistic_BT=clip_cov_covariance(batch.advantages_BT, logps_BT, batch.loss_weights_BT),
    )

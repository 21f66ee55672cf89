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
from dataclasses import dataclass

import torch

from .batch import POLICY_LOGPS, ROLLOUT_LOGPS, CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import SettingError, check_fields, hyperparameter

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

    clip_cov_ratio: float = hyperparameter(
        0.0002,
        "Clip-Cov: fraction of a micro-batch's valid tokens whose gradient is detached (at least 1). In (0, 1].",
    )
    clip_cov_lb: float = hyperparameter(
        1.0, "Clip-Cov: lower bound (exclusive) of the covariance of a candidate token."
    )
    clip_cov_ub: float = hyperparameter(
        5.0, "Clip-Cov: upper bound (exclusive) of the covariance of a candidate token."
    )
    clip_cov_seed: int = hyperparameter(
        0, "Clip-Cov: seed of the random draw (combined with the step and the micro-batch)."
    )

    def __post_init__(self):
        # Each value on its own, then the one check across two fields (both bounds finite by then).
        check_fields(
            self,
            clip_cov_ratio=(lambda r: 0.0 < r <= 1.0, "in (0, 1]"),
            clip_cov_lb=(math.isfinite, "finite"),
            clip_cov_ub=(math.isfinite, "finite"),
        )
        if (
            math.isfinite(self.clip_cov_lb)
            and math.isfinite(self.clip_cov_ub)
            and not self.clip_cov_lb < self.clip_cov_ub
        ):
            raise SettingError("clip_cov_ub", f"must be > clip_cov_lb = {self.clip_cov_lb}, got {self.clip_cov_ub}")


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


@register_credit_method(
    "clip_cov",
    display_name="Clip-Cov",
    statistics=(POLICY_LOGPS, ROLLOUT_LOGPS),
    arguments=ClipCovArguments,
    paper=CLIP_COV_PAPER,
    keeps_signs=True,
)
def clip_cov(
    batch: CreditBatch, clip_cov_ratio: float, clip_cov_lb: float, clip_cov_ub: float, clip_cov_seed: int
) -> CreditResult:
    """Zeroes the advantage of a random few tokens whose advantage-log-prob covariance lies in (lb, ub).

    Metrics:
        detached_fraction: fraction of valid tokens whose advantage was zeroed
        candidate_fraction: fraction of valid tokens with covariance in (lb, ub), not clipped by PPO

    Token statistic:
        covariance: centred covariance (A - mean A)(log p - mean log p) over the micro-batch
    """
    advantages_BT, logps_BT, old_logps_BT = batch.advantages_BT, batch[POLICY_LOGPS], batch[ROLLOUT_LOGPS]
    weights_BT = batch.loss_weights_BT  # verl's `response_mask`, as the earlier methods of a stack left it
    in_loss_BT = weights_BT > 0
    epsilon_low, epsilon_high = batch.clip_range
    ratio_BT = torch.exp(logps_BT - old_logps_BT)
    # verl: -A * clip(r) > -A * r, i.e. the clipped term is the one PPO's max keeps.
    clipped_BT = in_loss_BT & (
        -advantages_BT * ratio_BT.clamp(1 - epsilon_low, 1 + epsilon_high) > -advantages_BT * ratio_BT
    )
    covariance_BT = clip_cov_covariance(advantages_BT, logps_BT, weights_BT)
    candidates_BT = in_loss_BT & ~clipped_BT & (covariance_BT > clip_cov_lb) & (covariance_BT < clip_cov_ub)
    count = max(int(clip_cov_ratio * weights_BT.sum().item()), 1)
    positions_N2 = torch.nonzero(candidates_BT)  # row-major, as verl draws from
    generator = clip_cov_generator(clip_cov_seed, batch.step, batch.mask_BT)
    order_N = torch.randperm(positions_N2.size(0), generator=generator).to(positions_N2.device)
    drawn_N2 = positions_N2[order_N[:count]]
    detached_BT = torch.zeros_like(in_loss_BT)
    detached_BT[drawn_N2[:, 0], drawn_N2[:, 1]] = True
    return CreditResult(
        advantages_BT=advantages_BT.masked_fill(detached_BT, 0.0),
        metrics={
            "detached_fraction": (detached_BT, batch.mask_BT),
            "candidate_fraction": (candidates_BT, batch.mask_BT),
        },
        statistic_BT=covariance_BT,
    )


# Clip-Cov on plain tensors (one micro-batch): `clip_cov_advantages(advantages_B, mask_BT, policy_logps=...,
# rollout_logps=..., clip_range=..., step=..., clip_cov_ratio=...)`; the drawn tokens are
# `metrics["detached_fraction"][0]`.
clip_cov_advantages = get_credit_method("clip_cov").on_tensors

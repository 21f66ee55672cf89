"""Lab metrics as plain functions of tensors and lists (no TRL import).

- Credit precision (`credit_mass`, `precision`): the share of a response's advantage mass `sum_t |Â_t|` that
  lands on labelled tokens, against the share the same mass would put there if it were spread uniformly over the
  response's valid tokens, as GRPO spreads it. For GRPO the two are equal (lift 1).
- Steps until solved (`steps_until_solved`): first step at which the trailing mean reward reaches a threshold.
- Gap closed (`gap_fraction`): per seed, where a method lands between GRPO's broadcast credit (0) and the oracle
  (1), with its t interval over seeds.
- Gradient-norm spread (`within_step_spread`): variance and coefficient of variation of the micro-batch gradient
  norms inside each optimizer step, averaged over steps.
- Collapse (`collapsed`): a run whose final training reward or avg@n ends at the task's reward floor.
- Many comparisons (`paired_t_p_value`, `holm`, `effect_size`, `welch_difference`): the paired t test's p-value
  (SciPy's), Holm's adjustment within a table of comparisons, the paired effect size d_z, and Welch's unequal-variance
  interval and test (SciPy's, on the Welch-Satterthwaite degrees of freedom, not rounded).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import torch

from ..compare.stats import Interval, scipy_stats, t_interval

SIGNS = ("pos", "neg")
# A run has collapsed when its final reward or avg@n is within this of the task's floor: at most one success in 20.
COLLAPSE_TOLERANCE = 0.05


def credit_mass(advantages_BT: torch.Tensor, mask_BT: torch.Tensor, labels_BT: torch.Tensor) -> dict[str, float]:
    """Advantage mass on labelled tokens, and what a uniform spread would put there, summed per advantage sign.

    Args:
        advantages_BT: `(B, T)` token advantages as the loss consumes them, or `(B,)` sequence advantages (GRPO),
            which every valid token receives.
        mask_BT: `(B, T)` valid completion tokens.
        labels_BT: `(B, T)` booleans, the labelled (e.g. decisive) tokens.

    Returns:
        For `s` in `pos`, `neg` (sign of the response's summed advantage): `s_labelled` = sum of `|Â_t|` over
        labelled valid tokens, `s_total` = sum of `|Â_t|` over valid tokens, `s_uniform` = sum over responses of
        `total_i * labelled_i / valid_i`, and `s_rows`, the number of responses counted. Only responses with at
        least one labelled valid token and a non-zero advantage count.
    """
    mask_BT = mask_BT.bool()
    if advantages_BT.dim() == 1:
        advantages_BT = advantages_BT.unsqueeze(1).expand(mask_BT.shape)
    if advantages_BT.shape != mask_BT.shape or labels_BT.shape != mask_BT.shape:
        raise ValueError(
            f"advantages {tuple(advantages_BT.shape)}, mask {tuple(mask_BT.shape)} and labels "
            f"{tuple(labels_BT.shape)} must have the same (B, T) shape"
        )
    advantages_BT = advantages_BT.detach().float() * mask_BT
    labelled_BT = labels_BT.bool() & mask_BT
    mass_BT = advantages_BT.abs()
    total_B, labelled_mass_B = mass_BT.sum(1), (mass_BT * labelled_BT).sum(1)
    num_valid_B, num_labelled_B = mask_BT.sum(1), labelled_BT.sum(1)
    uniform_B = total_B * num_labelled_B / num_valid_B.clamp(min=1)
    signed_B = advantages_BT.sum(1)
    counted_B = (num_labelled_B > 0) & (total_B > 0)
    sums = {}
    for sign, selected_B in zip(SIGNS, (counted_B & (signed_B > 0), counted_B & (signed_B < 0))):
        sums[f"{sign}_labelled"] = labelled_mass_B[selected_B].sum().item()
        sums[f"{sign}_total"] = total_B[selected_B].sum().item()
        sums[f"{sign}_uniform"] = uniform_B[selected_B].sum().item()
        sums[f"{sign}_rows"] = int(selected_B.sum().item())
    return sums


def add_sums(into: dict[str, float], sums: dict[str, float]) -> dict[str, float]:
    """Accumulate `credit_mass` results (in place); returns `into`."""
    for key, value in sums.items():
        into[key] = into.get(key, 0) + value
    return into


def precision(sums: dict[str, float], sign: str) -> dict[str, float]:
    """`{"precision", "uniform", "lift", "rows"}` for one sign from accumulated `credit_mass` sums (NaN when empty)."""
    total = sums.get(f"{sign}_total", 0.0)
    if total <= 0:
        return {"precision": math.nan, "uniform": math.nan, "lift": math.nan, "rows": 0}
    share = sums[f"{sign}_labelled"] / total
    uniform = sums[f"{sign}_uniform"] / total
    return {
        "precision": share,
        "uniform": uniform,
        "lift": share / uniform if uniform > 0 else math.nan,
        "rows": int(sums[f"{sign}_rows"]),
    }


def steps_until_solved(rewards: Sequence[float], threshold: float = 0.9, window: int = 5) -> int | None:
    """The 1-based step at which the mean reward of the last `window` steps first reaches `threshold` (or `None`)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    for end in range(window, len(rewards) + 1):
        if sum(rewards[end - window : end]) / window >= threshold:
            return end
    return None


def within_step_spread(norms_by_step: Sequence[Sequence[float]]) -> dict[str, float]:
    """Mean over optimizer steps of the variance and coefficient of variation of micro-batch gradient norms.

    Steps with fewer than two micro-batches are skipped, and steps whose norms are all 0 from the coefficient of
    variation; the variance is the sample variance (`n - 1`).
    """
    variances, cvs = [], []
    for norms in norms_by_step:
        if len(norms) < 2:
            continue
        variance = statistics.variance(norms)
        variances.append(variance)
        mean = statistics.fmean(norms)
        if mean > 0:  # all-zero gradients (every group's rewards tied) have no coefficient of variation
            cvs.append(math.sqrt(variance) / mean)
    if not variances:
        return {"grad_norm_var": math.nan, "grad_norm_cv": math.nan, "steps": 0}
    return {
        "grad_norm_var": statistics.fmean(variances),
        "grad_norm_cv": statistics.fmean(cvs) if cvs else math.nan,
        "steps": len(variances),
    }


def mean_of_edges(values: Sequence[float], count: int = 5) -> tuple[float, float]:
    """Mean of the first and of the last `count` values (e.g. the start and end of an entropy trajectory)."""
    if not values:
        return math.nan, math.nan
    count = max(1, min(count, len(values)))
    return statistics.fmean(values[:count]), statistics.fmean(values[-count:])


def gap_fraction(values: Mapping[int, float], floor: Mapping[int, float], ceiling: Mapping[int, float]) -> Interval:
    """Mean and 95 % t interval over seeds of `(value - floor) / (ceiling - floor)`, each a `{seed: value}`.

    Seeds missing from any of the three, with a NaN, or where the ceiling equals the floor (no gap to close) are
    left out. Lower-is-better metrics need no special case: the ratio is the same.
    """
    fractions = []
    for seed in sorted(set(values) & set(floor) & set(ceiling)):
        value, low, high = values[seed], floor[seed], ceiling[seed]
        if any(math.isnan(v) for v in (value, low, high)) or high == low:
            continue
        fractions.append((value - low) / (high - low))
    return t_interval(fractions)


def collapsed(final_reward: float, accuracy: float, floor: float = 0.0, tolerance: float = COLLAPSE_TOLERANCE) -> bool:
    """Whether a run ended at the task's reward `floor`: its final training reward or its avg@n within `tolerance`.

    Every lab task starts above its floor (the base policy succeeds 8 % to 30 % of the time), so a run that ends
    there unlearned what the base policy could do. NaN values do not count as collapsed.
    """
    return any(not math.isnan(v) and v <= floor + tolerance for v in (final_reward, accuracy))


def paired_t_p_value(differences: list[float]) -> float:
    """Two-sided p-value of the paired t test of mean 0 (1 with fewer than 2 values; 0 when all equal and non-zero)."""
    if len(differences) < 2:
        return 1.0
    if statistics.stdev(differences) == 0:  # SciPy answers NaN: no spread, so the mean is the whole answer
        return 1.0 if statistics.fmean(differences) == 0 else 0.0
    return float(scipy_stats().ttest_1samp(differences, 0.0).pvalue)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of `p_values` (same order): family-wise error at most the level of each test."""
    order = sorted(range(len(p_values)), key=p_values.__getitem__)
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def effect_size(differences: list[float]) -> float:
    """Cohen's d_z: the mean paired difference over the standard deviation of the differences (NaN if undefined)."""
    if len(differences) < 2 or statistics.stdev(differences) == 0:
        return math.nan
    return statistics.fmean(differences) / statistics.stdev(differences)


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[Interval, float]:
    """Welch's interval of mean(b) − mean(a) and the two-sided p-value of no difference (SciPy's `ttest_ind` with
    unequal variances). With fewer than 2 values on either side: no interval, p = 1."""
    n_a, n_b = len(a), len(b)
    mean = statistics.fmean(b) - statistics.fmean(a) if n_a and n_b else math.nan
    if n_a < 2 or n_b < 2:
        return Interval(mean, n_a + n_b, None, confidence), 1.0
    if statistics.variance(a) + statistics.variance(b) == 0:  # SciPy answers NaN: the difference is exact
        return Interval(mean, n_a + n_b, 0.0, confidence), 1.0 if mean == 0 else 0.0
    test = scipy_stats().ttest_ind(b, a, equal_var=False)
    bounds = test.confidence_interval(confidence)
    return Interval(mean, n_a + n_b, float(bounds.high - bounds.low) / 2, confidence), float(test.pvalue)

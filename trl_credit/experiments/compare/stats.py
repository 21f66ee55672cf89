"""Confidence intervals over seeds: Student's t interval of a mean and of paired differences.

With `n` seeds the interval of the mean is `mean ± t_{(1 + c) / 2, n - 1} * s / sqrt(n)`, `s` the sample standard
deviation; with one seed it does not exist. The t distribution is SciPy's (`trl-credit[experiments]`), imported when
an interval is computed so that the training library never needs it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SCIPY_MISSING = "the compare and lab reports need SciPy (t intervals and tests): pip install 'trl-credit[experiments]'"


def scipy_stats():
    """`scipy.stats`, or an `ImportError` that says how to install it."""
    try:
        from scipy import stats
    except ImportError as error:
        raise ImportError(SCIPY_MISSING) from error
    return stats


@dataclass(frozen=True)
class Interval:
    """A mean over `n` values with its confidence interval; `half_width` is `None` when `n < 2` (no interval)."""

    mean: float
    n: int
    half_width: float | None
    confidence: float = 0.95

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def excludes_zero(self) -> bool:
        """Whether the interval lies entirely above or below 0 (`False` without an interval)."""
        return self.half_width is not None and (self.low > 0 or self.high < 0)

    def format(self, digits: int = 3) -> str:
        """`"0.412 ± 0.031"`, or `"0.412 (CI n/a, n=1)"` with one value; `"–"` with none."""
        if self.n == 0 or math.isnan(self.mean):
            return "–"
        if self.half_width is None:
            return f"{self.mean:.{digits}g} (CI n/a, n={self.n})"
        return f"{self.mean:.{digits}g} ± {self.half_width:.{digits}g}"


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student's t confidence interval of the mean of `values` (NaNs are dropped)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not values:
        return Interval(math.nan, 0, None, confidence)
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, len(values), None, confidence)
    quantile = float(scipy_stats().t.ppf((1.0 + confidence) / 2.0, len(values) - 1))
    return Interval(mean, len(values), quantile * statistics.stdev(values) / math.sqrt(len(values)), confidence)


def paired_difference(
    values: Mapping[int, float], baseline: Mapping[int, float], confidence: float = 0.95
) -> Interval:
    """t interval of `values[s] - baseline[s]` over the seeds `s` present (and not NaN) in both."""
    differences = [
        values[seed] - baseline[seed]
        for seed in sorted(set(values) & set(baseline))
        if not (math.isnan(values[seed]) or math.isnan(baseline[seed]))
    ]
    return t_interval(differences, confidence)

"""Confidence intervals over seeds: Student's t interval of a mean and of paired differences.

No SciPy: the t distribution's CDF for an integer number of degrees of freedom has a closed form (Abramowitz and
Stegun 26.7.3 and 26.7.4), and its quantile is found by bisection on it. With `n` seeds the interval of the mean is
`mean ± t_{(1 + c) / 2, n - 1} * s / sqrt(n)`, `s` the sample standard deviation; with one seed it does not exist.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def student_t_cdf(t: float, df: int) -> float:
    """`P(T <= t)` for Student's t with `df` (a positive integer) degrees of freedom."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be a positive integer, got {df!r}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    # A = P(|T| <= |t|), a finite series in cos^2(theta) whose terms' ratios are (k - 1) / k.
    if df % 2 == 1:
        series, term = 0.0, 1.0
        for k in range(3, df, 2):  # terms 1, 2/3 c^2, (2*4)/(3*5) c^4, ... up to c^(df - 3)
            series += term
            term *= cos2 * (k - 1) / k
        if df > 1:
            series += term
        inside = (2 / math.pi) * (theta + (sin * math.cos(theta) * series if df > 1 else 0.0))
    else:
        series, term = 0.0, 1.0
        for k in range(2, df, 2):  # terms 1, 1/2 c^2, (1*3)/(2*4) c^4, ... up to c^(df - 2)
            series += term
            term *= cos2 * (k - 1) / k
        series += term
        inside = sin * series
    inside = min(max(inside, 0.0), 1.0)
    return 0.5 + inside / 2 if t >= 0 else 0.5 - inside / 2


def student_t_quantile(p: float, df: int) -> float:
    """The `p`-quantile of Student's t with `df` degrees of freedom (bisection to 1e-12 on the closed-form CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


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
    quantile = student_t_quantile((1.0 + confidence) / 2.0, len(values) - 1)
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

"""avg@n and the unbiased pass@k estimator over per-problem correct counts, and the summary of an evaluation.

With `c` correct out of `n` samples of a problem, `avg@n` is the mean over problems of `c / n` and `pass@k` the mean of
`1 - C(n - c, k) / C(n, k)` (Chen et al., 2021, https://huggingface.co/papers/2107.03374), in the numerically stable
product form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# ---------------------------------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `c` correct out of `n` samples: `1 - C(n - c, k) / C(n, k)`.

    Computed as `1 - prod_{i = n - c + 1}^{n} (1 - k / i)`, which never forms the binomial coefficients (they
    overflow floats for n in the hundreds).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def summarize(num_correct: Sequence[int], n: int, ks: Sequence[int], completion_lengths: Sequence[int]) -> dict:
    """Aggregate metrics over problems.

    Args:
        num_correct: `P` counts, correct samples per problem.
        n: Samples per problem.
        ks: The k of each pass@k.
        completion_lengths: `P * n` generated token counts.

    Returns:
        `{"avg@n": ..., "pass@k": ... for k in ks, "mean_completion_length": ..., "num_problems": P}`.
    """
    if not num_correct:
        raise ValueError("no problem to summarise")
    metrics = {f"avg@{n}": sum(c / n for c in num_correct) / len(num_correct)}
    for k in ks:
        metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in num_correct) / len(num_correct)
    metrics["mean_completion_length"] = sum(completion_lengths) / max(len(completion_lengths), 1)
    metrics["num_problems"] = len(num_correct)
    return metrics

"""Confidence intervals for simulated error rates: Clopper-Pearson, with a design effect.

Benchmark support: decides how a rate measured on simulated runs is given its 95% interval.
Runs judged against one recorded reference are not independent (one unlucky reference fails
several of them), so the count is first shrunk to its effective size with the design effect
of the clusters (Kish: ``1 + (k - 1)·ICC``, the intra-reference correlation from a one-way
ANOVA of the 0/1 outcomes), then the exact Clopper-Pearson interval is taken on the
effective count (Korn & Graubard, 1998). The beta quantile is ``scipy.stats.beta``'s.
"""

from __future__ import annotations

from collections.abc import Sequence


def clopper_pearson(x: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """The exact interval of a binomial rate ``x / n`` (``x``, ``n`` may be effective counts)."""
    if n <= 0 or not 0 <= x <= n:
        raise ValueError(f"need 0 <= x <= n and n > 0, got x={x}, n={n}")
    from scipy.stats import beta

    alpha = 1.0 - level
    low = 0.0 if x == 0 else float(beta.ppf(alpha / 2, x, n - x + 1))
    high = 1.0 if x == n else float(beta.ppf(1 - alpha / 2, x + 1, n - x))
    return low, high


def design_effect(failures_per_cluster: Sequence[int], per_cluster: int) -> float:
    """Kish's ``1 + (k - 1)·ICC`` for clusters of ``k`` 0/1 outcomes (at least 1)."""
    r, k = len(failures_per_cluster), per_cluster
    if k < 2 or r < 2:
        return 1.0
    means = [f / k for f in failures_per_cluster]
    grand = sum(means) / r
    msb = k * sum((m - grand) ** 2 for m in means) / (r - 1)
    msw = sum(k * m * (1 - m) for m in means) / (r * (k - 1))
    if msb + (k - 1) * msw <= 0:
        return 1.0
    icc = (msb - msw) / (msb + (k - 1) * msw)
    return 1.0 + (k - 1) * max(icc, 0.0)


def clustered_interval(
    failures_per_cluster: Sequence[int], per_cluster: int, level: float = 0.95
) -> tuple[float, float, float]:
    """(rate, low, high): Clopper-Pearson on the effective count (Korn-Graubard)."""
    n = len(failures_per_cluster) * per_cluster
    rate = sum(failures_per_cluster) / n
    n_eff = n / design_effect(failures_per_cluster, per_cluster)
    low, high = clopper_pearson(rate * n_eff, n_eff, level)
    return rate, low, high

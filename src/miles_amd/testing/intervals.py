"""Confidence intervals for simulated error rates: Clopper-Pearson, with a design effect.

Benchmark support: decides how a rate measured on simulated runs is given its 95% interval.
Runs judged against one recorded reference are not independent (one unlucky reference fails
several of them), so the count is first shrunk to its effective size with the design effect
of the clusters (Kish: ``1 + (k - 1)·ICC``, the intra-reference correlation from a one-way
ANOVA of the 0/1 outcomes), then the exact Clopper-Pearson interval is taken on the
effective count (Korn & Graubard, 1998). Pure arithmetic; no numpy, no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def beta_quantile(q: float, a: float, b: float) -> float:
    """``x`` with ``I_x(a, b) = q``, by bisection (to 1e-12)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if beta_cdf(mid, a, b) < q else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(x: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """The exact interval of a binomial rate ``x / n`` (``x``, ``n`` may be effective counts)."""
    if n <= 0 or not 0 <= x <= n:
        raise ValueError(f"need 0 <= x <= n and n > 0, got x={x}, n={n}")
    alpha = 1.0 - level
    low = 0.0 if x == 0 else beta_quantile(alpha / 2, x, n - x + 1)
    high = 1.0 if x == n else beta_quantile(1 - alpha / 2, x + 1, n - x)
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

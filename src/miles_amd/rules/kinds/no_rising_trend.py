"""``no_rising_trend``: the Mann-Kendall Z (one-sided) of the series is at most ``z``.

``S = Σ_{i<j} sign(x_j - x_i)`` over the series in step order; under "no trend"
(independent, identically distributed values) ``Var S = [n(n-1)(2n+5) - Σ_ties
t(t-1)(2t+5)] / 18`` and ``Z = (S - 1)/sqrt(Var S)`` for ``S > 0`` (continuity-corrected).
The rule fails when ``Z > z``: a logprob gap rising steadily through a run while every value
is inside its bands. Rank-based, so one spike does not make a trend (the spike rule judges
that). The Theil-Sen slope (median of the pairwise slopes) is reported with the test and
drawn on the plot (``miles_amd.report.rule_hints``). Below 5 values no continuity-corrected
Z can reach 2, so a short run cannot fail it; the power table says how many rollouts it
needs. ``z`` is bounded by the schema to [2, 6] and calibrated by
``benchmarks/bench_calibration.py`` (its A/A false-alarm and power tables are in
``baselines/README.md``). With ``rho`` (the declared lag-1 autocorrelation; bounded by the
schema to [0, 0.6]) ``Var S`` is inflated by Hamed and Rao's factor for an AR(1) series
(:func:`hamed_rao_factor`): autocorrelated rollouts make runs of rises that are no trend
(issue 19 measured 0.6-0.8% false alarms at Z 3 with lag-1 0.3, not 0.13%). At a look
(``miles_amd.rules.looks``) the first ``k`` values are tested against the look's bound, which
spends its one-sided rate (from ``z``) with the information ``Var S`` of ``k`` values (S's
increments are uncorrelated under no trend: each new value's signs against the earlier
ones sum to zero covariance with the earlier S). Pure: no file is read.

Explained for people in ``docs/gate-and-statistics.md``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miles_amd import numeric
from miles_amd.evidence.types import Series
from miles_amd.rules.check import (
    Check,
    RuleContext,
    fmt,
    non_finite_failure,
    passed,
    rule_check,
)
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule
from miles_amd.rules.spending import upper_tail

MIN_VALUES = 4  # judged at a look of at least this many rollouts


@dataclass(frozen=True)
class TrendParams(Params):
    z: float
    rho: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_json().items() if v is not None}


def hamed_rao_factor(n: int, rho: float) -> float:
    """Hamed & Rao's (1998) inflation of the Mann-Kendall ``Var S`` for AR(1) ``rho``.

    ``1 + 2/(n(n-1)(n-2))·Σ_{k=1}^{n-3} (n-k)(n-k-1)(n-k-2)·ρ_s(k)`` with the rank
    autocorrelation of a Gaussian AR(1) series, ``ρ_s(k) = (6/π)·asin(ρ^k/2)``; ``rho`` is
    declared (a 20-rollout run's own estimate has a standard error of 0.22). 1.65 for
    n = 20, rho = 0.3.
    """
    if n < 4 or rho == 0.0:
        return 1.0
    total = math.fsum(
        (n - k) * (n - k - 1) * (n - k - 2) * (6 / math.pi) * math.asin(rho**k / 2)
        for k in range(1, n - 2)
    )
    return 1.0 + 2.0 * total / (n * (n - 1) * (n - 2))


def mann_kendall_s(values: Sequence[float]) -> int:
    """Mann-Kendall's ``S``: pairs that rose minus pairs that fell (a tie counts for neither);
    also the history's drift statistic (``miles_amd.history.drift``)."""
    s = 0
    for i, earlier in enumerate(values):
        for later in values[i + 1 :]:
            s += int(later > earlier) - int(later < earlier)
    return s


def mann_kendall_z(values: list[float]) -> float:
    """The continuity-corrected Mann-Kendall Z of ``values`` in order (0 below 2 values)."""
    n = len(values)
    if n < 2:
        return 0.0
    s = mann_kendall_s(values)
    ties = sum(t * (t - 1) * (2 * t + 5) for t in Counter(values).values() if t > 1)
    var = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var <= 0 or s == 0:
        return 0.0
    return (s - math.copysign(1, s)) / math.sqrt(var)


def theil_sen(steps: list[int], values: list[float]) -> tuple[float, float]:
    """(slope, intercept): the median pairwise slope and the median of ``v - slope·step``
    (by hand: ``scipy.stats.theilslopes`` would cost the gate scipy.stats' import)."""
    slopes = [
        (values[j] - values[i]) / (steps[j] - steps[i])
        for i in range(len(values))
        for j in range(i + 1, len(values))
        if steps[j] != steps[i]
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median(v - slope * s for s, v in zip(steps, values, strict=True))
    return slope, intercept


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    params = TrendParams.of(rule)
    z_max = params.z if ctx.limit is None else ctx.limit
    wanted = _expected(z_max, params.rho)
    points = sorted(series)
    undefined = non_finite_failure(rule, points, wanted, "trend")
    if undefined is not None:
        return undefined
    steps, values = [s for s, _ in points], [v for _, v in points]
    z = mann_kendall_z(values) / math.sqrt(hamed_rao_factor(len(values), params.rho or 0.0))
    slope, intercept = theil_sen(steps, values)
    mean = numeric.mean(values)
    relative = f" ({slope / mean:+.2%} of the mean per step)" if mean else ""
    detail = (
        f"Mann-Kendall Z {z:+.2f} over {len(values)} values; Theil-Sen slope "
        f"{fmt(slope)} per step{relative}"
    )
    if z > z_max:
        detail = f"rising trend: {detail}"
    numbers = {
        "z": z,
        "z_max": z_max,
        "slope": slope,
        "intercept": intercept,
        "first_step": steps[0],
        "last_step": steps[-1],
    }
    return rule_check(rule, passed(z <= z_max), z, wanted, detail, numbers=numbers)


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    params = TrendParams.of(rule)
    return _expected(params.z, params.rho)


def _expected(z: float, rho: float | None) -> str:
    if rho:
        return f"Mann-Kendall Z ≤ {z:g} (no rising trend; Hamed-Rao, lag-1 {rho:g})"
    return f"Mann-Kendall Z ≤ {z:g} (no rising trend)"


def information(rule: Rule, baseline: Baseline, k: int, n: int) -> float | None:
    """The variance of Mann-Kendall's S on ``k`` values (Hamed-Rao inflated; no ties): S
    has uncorrelated increments under no trend, so it is the statistic's information."""
    if k < MIN_VALUES:
        return None
    rho = TrendParams.of(rule).rho or 0.0
    return k * (k - 1) * (2 * k + 5) / 18.0 * hamed_rao_factor(k, rho)


def nominal(rule: Rule, baseline: Baseline, n: int) -> tuple[float, int]:
    return upper_tail(TrendParams.of(rule).z), 1


SPEC = KindSpec(
    name="no_rising_trend",
    params=TrendParams,
    check=check,
    expected=expected,
    looks="spending",
    information=information,
    nominal=nominal,
)

"""Rules on the shape of one run's series: a rising trend inside the bands, a too-flat reward.

The check, expected sentence, plot hint and validation of two kinds (declared in
:data:`miles_amd.judge.rules.KINDS`), both calibrated by ``benchmarks/bench_calibration.py``
(its A/A false-alarm and power tables are in ``baselines/README.md``):

- ``no_rising_trend``: the one-sided Mann-Kendall test. ``S = Σ_{i<j} sign(x_j - x_i)`` over
  the series in step order; under "no trend" (independent, identically distributed values)
  ``Var S = [n(n-1)(2n+5) - Σ_ties t(t-1)(2t+5)] / 18`` and ``Z = (S - 1)/sqrt(Var S)`` for
  ``S > 0`` (continuity-corrected). The rule fails when ``Z > z``: a logprob gap rising
  steadily through a run while every value is inside its bands. Rank-based, so one spike
  does not make a trend (the spike rule judges that). The Theil-Sen slope (median of the
  pairwise slopes) is reported with the test and drawn on the plot. Below 5 values no
  continuity-corrected Z can reach 2, so a short run cannot fail it; the power table says
  how many rollouts it needs. ``z`` is bounded by the schema to [2, 6]. With ``rho`` (the
  declared lag-1 autocorrelation) ``Var S`` is inflated by Hamed & Rao's factor for an AR(1)
  series (:func:`hamed_rao_factor`): autocorrelated rollouts make runs of rises that are no
  trend (measured: 0.6-0.8% false alarms at Z 3 with lag-1 0.3, not 0.13%).
- ``sd_at_least``: the run's sample sd of the metric is at least a floor: a reward that is
  (nearly) the same value at every rollout carries no learning signal, or the reward is
  broken, and passes every other rule. The floor is
  ``miles_amd.baseline.bands.binomial_sd_floor`` of the reference mean, the samples per
  rollout and the run's rollouts: the spread the 0/1 reward over 64 samples has even with no
  prompt-to-prompt difference, at its ``Φ(-z)`` quantile. ``floor`` is written for
  ``run_shape.rollouts`` and re-derived by the loader; rescaled for other counts.

Pure: no file is read.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

from miles_amd.baseline import bands
from miles_amd.judge.checks import Check, Problem, RuleContext, fmt, passed, rule_check, steps_text

if TYPE_CHECKING:
    from miles_amd.baseline.model import Baseline, Rule
    from miles_amd.evidence.types import Series


# ---------------------------------------------------------------------------- no_rising_trend


def mann_kendall_z(values: list[float]) -> float:
    """The continuity-corrected Mann-Kendall Z of ``values`` in order (0 below 2 values)."""
    n = len(values)
    if n < 2:
        return 0.0
    s = 0
    for i in range(n - 1):
        xi = values[i]
        for xj in values[i + 1 :]:
            s += (xj > xi) - (xj < xi)
    ties = sum(t * (t - 1) * (2 * t + 5) for t in Counter(values).values() if t > 1)
    var = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var <= 0 or s == 0:
        return 0.0
    return (s - math.copysign(1, s)) / math.sqrt(var)


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


def theil_sen(steps: list[int], values: list[float]) -> tuple[float, float]:
    """(slope, intercept): the median pairwise slope and the median of ``v - slope·step``."""
    slopes = [
        (values[j] - values[i]) / (steps[j] - steps[i])
        for i in range(len(values))
        for j in range(i + 1, len(values))
        if steps[j] != steps[i]
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median(v - slope * s for s, v in zip(steps, values, strict=True))
    return slope, intercept


def check_trend(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.z is not None
    expected = expected_trend(rule, ctx.baseline, ctx.rollouts)
    points = sorted(series)
    bad = [s for s, v in points if not math.isfinite(v)]
    if bad:
        detail = f"trend undefined: non-finite at {steps_text(bad)}"
        return rule_check(rule, "fail", math.nan, expected, detail, failing_steps=tuple(bad))
    steps, values = [s for s, _ in points], [v for _, v in points]
    z = mann_kendall_z(values) / math.sqrt(hamed_rao_factor(len(values), rule.rho or 0.0))
    slope, intercept = theil_sen(steps, values)
    mean = math.fsum(values) / len(values)
    relative = f" ({slope / mean:+.2%} of the mean per step)" if mean else ""
    detail = (
        f"Mann-Kendall Z {z:+.2f} over {len(values)} values; Theil-Sen slope "
        f"{fmt(slope)} per step{relative}"
    )
    if z > rule.z:
        detail = f"rising trend: {detail}"
    numbers = {
        "z": z,
        "z_max": rule.z,
        "slope": slope,
        "intercept": intercept,
        "first_step": steps[0],
        "last_step": steps[-1],
    }
    return rule_check(rule, passed(z <= rule.z), z, expected, detail, numbers=numbers)


def expected_trend(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    if rule.rho:
        return f"Mann-Kendall Z ≤ {rule.z:g} (no rising trend; Hamed-Rao, lag-1 {rule.rho:g})"
    return f"Mann-Kendall Z ≤ {rule.z:g} (no rising trend)"


def plot_trend(ax: Any, check: Check, finite: list[float]) -> bool:
    first, last = check.numbers["first_step"], check.numbers["last_step"]
    slope, intercept = check.numbers["slope"], check.numbers["intercept"]
    colour = "tab:red" if check.failed else "tab:purple"
    ax.plot(
        [first, last],
        [intercept + slope * first, intercept + slope * last],
        color=colour,
        linestyle="-.",
        linewidth=1,
        label=f"Theil-Sen trend (Z {check.numbers['z']:+.1f})",
        gid="trend",
    )
    return False


# ---------------------------------------------------------------------------- sd_at_least


def floor_for(rule: Rule, baseline: Baseline, rollouts: int) -> float:
    """The sd floor of ``rule`` for a run of ``rollouts`` (see the module doc)."""
    assert rule.metric is not None and rule.z is not None
    mean = baseline.spread(rule.metric).mean
    return bands.binomial_sd_floor(mean, baseline.run_shape.samples_per_rollout, rollouts, rule.z)


def check_sd_floor(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    floor = floor_for(rule, ctx.baseline, ctx.rollouts)
    expected = expected_floor(rule, ctx.baseline, ctx.rollouts)
    values = [v for _, v in series]
    if not all(math.isfinite(v) for v in values):
        bad = tuple(s for s, v in series if not math.isfinite(v))
        detail = f"spread undefined: non-finite at {steps_text(bad)}"
        return rule_check(rule, "fail", math.nan, expected, detail, failing_steps=bad)
    sd = statistics.stdev(values) if len(values) >= 2 else 0.0
    distinct = len(set(values))
    detail = f"sd {fmt(sd)} over {len(values)} values ({distinct} distinct); floor {fmt(floor)}"
    if sd < floor:
        detail = f"too little spread: {detail}"
    numbers = {"sd": sd, "floor": floor}
    return rule_check(rule, passed(sd >= floor), sd, expected, detail, numbers=numbers)


def expected_floor(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"sd ≥ {floor_for(rule, baseline, rollouts):.4g}"


def validate_floor(rule: Rule, baseline: Baseline) -> Problem | None:
    """``floor`` is the one ``binomial_sd_floor`` gives for ``run_shape.rollouts``."""
    assert rule.metric is not None
    try:
        derived = floor_for(rule, baseline, baseline.run_shape.rollouts)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot derive the sd floor of {rule.metric}: {exc}",
            "add a series, or a summary with its mean",
        )
    if rule.floor is None or not math.isclose(rule.floor, derived, rel_tol=1e-12):
        return (
            ".floor",
            f"floor {rule.floor} is not the derived {derived!r}",
            f"set it to {derived!r} (miles_amd.baseline.bands.binomial_sd_floor)",
        )
    return None


def recorded_floor(rule: Rule, draft: Baseline, rollouts: int) -> dict[str, Any]:
    """``baseline record``: the floor re-derived from the recorded run's mean."""
    return {"floor": floor_for(rule, draft, rollouts)}


def reference_mean(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    spread = baseline.spread(rule.metric)
    return f"mean {spread.mean:.6g} over {baseline.run_shape.samples_per_rollout} samples a rollout"

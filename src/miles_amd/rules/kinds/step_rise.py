"""``step_rise``: the second half of a run rising above its first half (issue 19).

Decides:

- the statistic (:func:`step_rise_z`): on the logarithms, the GLS estimate of a step at
  ``N // 2`` under AR(1) noise with the declared lag-1 ``rho``, the reference level one more
  observation (:func:`reference_level`, pooled with the other published run under ``pool``),
  over its standard error; ``sd`` pooled from the reference and the run's halves;
- one-sided: a falling gap is no regression; the tolerance is Student's t at ``alpha`` with
  Bartlett's reduced degrees of freedom;
- at a look (``miles_amd.rules.looks``), the same step from mid-run once :data:`MIN_HALF`
  values follow it, against the look's bound.

Caveats: a smooth ramp inside the bands is read partly as autocorrelation; a partial run
with fewer values after the middle passes this rule (its missing steps fail it). Pure: no
file is read.

The derivation and its measured figures: ``docs/gate-and-statistics.md`` ("step_rise").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from miles_amd.evidence.types import Series
from miles_amd.rules import bands
from miles_amd.rules.check import (
    Check,
    Problem,
    RuleContext,
    fmt,
    non_finite_failure,
    passed,
    rule_check,
    step_range,
    steps_text,
)
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.log_scale import log_spread, log_spread_problem
from miles_amd.rules.model import Baseline, Params, Rule
from miles_amd.rules.spending import upper_tail

MIN_HALF = 2  # rollouts each half needs for a spread


@dataclass(frozen=True)
class StepParams(Params):
    alpha: float
    rho: float
    run_sd: float
    pool: float | None = None  # the other published run's mean (a cover of the mean band)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_json().items() if v is not None}


def reference_level(
    spread: bands.Spread, sd2: float, *, run_sd: float, rho: float, pool: float | None
) -> tuple[float, float]:
    """(level, variance) of the reference level on the log scale, against one run's level.

    The reference's log mean; with ``pool``, averaged with the other published run's
    (``ln(pool) - sd²/2``: its log-scale mean if its per-rollout spread is the reference's).
    Variance: the sampling of a mean of ``n_ref`` rollouts (halved by two runs) plus the
    run-level effects (``2·run_sd²`` for two runs; ``1.5·run_sd²`` against two runs' average).
    """
    sampling = sd2 * bands.mean_variance(spread.n, rho)
    if pool is None:
        return spread.mean, sampling + 2 * run_sd**2
    other = math.log(pool) - spread.sd**2 / 2
    return (spread.mean + other) / 2, sampling / 2 + 1.5 * run_sd**2


def _whitened(values: list[float], rho: float) -> list[float]:
    """Prais-Winsten: a stationary AR(1) series with lag-1 ``rho`` to uncorrelated terms of
    the same variance (``x_0``, then ``(x_t - rho·x_(t-1)) / sqrt(1 - rho²)``)."""
    scale = math.sqrt(1.0 - rho * rho)
    return [values[0]] + [(values[t] - rho * values[t - 1]) / scale for t in range(1, len(values))]


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def _normal_equations(
    n: int, c: int, sd2: float, v_ref: float, rho: float
) -> tuple[float, float, float, list[float], list[float]]:
    """(a11, a12, a22, whitened ones, whitened step regressor) of the GLS step from index
    ``c`` of ``n`` values with variance ``sd2`` and the reference level's variance ``v_ref``."""
    ones = _whitened([1.0] * n, rho)
    after = _whitened([0.0] * c + [1.0] * (n - c), rho)
    a11 = _dot(ones, ones) / sd2 + 1 / v_ref
    a12, a22 = _dot(ones, after) / sd2, _dot(after, after) / sd2
    return a11, a12, a22, ones, after


def step_rise_z(
    run: list[float],
    spread: bands.Spread,
    *,
    run_sd: float,
    rho: float,
    pool: float | None = None,
    split: int | None = None,
) -> tuple[float, float, float]:
    """(z, head mean, tail mean) of the rise from index ``split`` (default ``N // 2``) on,
    all on the scale of ``run`` and ``spread`` (the caller passes logarithms); ``run_sd`` is
    an absolute level sd there. z: the generalised least squares step of ``run_t = level +
    step·[t >= split] + AR(1)``, the reference level (:func:`reference_level`) one more
    observation of ``level``."""
    n = len(run)
    c = n // 2 if split is None else split
    head = math.fsum(run[:c]) / c
    tail = math.fsum(run[c:]) / (n - c)
    residual = math.fsum((v - head) ** 2 for v in run[:c]) + math.fsum(
        (v - tail) ** 2 for v in run[c:]
    )
    dof_ref, dof_run = spread.n - 1, n - 2
    sd2 = (dof_ref * spread.sd**2 + residual) / (dof_ref + dof_run)
    if sd2 <= 0:
        return 0.0, head, tail
    level, v_ref = reference_level(spread, sd2, run_sd=run_sd, rho=rho, pool=pool)
    a11, a12, a22, ones, after = _normal_equations(n, c, sd2, v_ref, rho)
    values = _whitened(run, rho)
    b1 = _dot(ones, values) / sd2 + level / v_ref
    b2 = _dot(after, values) / sd2
    det = a11 * a22 - a12 * a12
    step = (a11 * b2 - a12 * b1) / det
    return step / math.sqrt(a11 / det), head, tail


def threshold(alpha: float, n_run: int, n_ref: int, rho: float = 0.0) -> float:
    """The one-sided Student t quantile at ``alpha``: the pooled sd's ``n_ref - 1 + n_run - 2``
    degrees of freedom, times ``(1 - rho²) / (1 + rho²)`` (Bartlett: the variance of a sample
    variance of an AR(1) series grows by ``1 + 2·Σ rho^(2k)``, so it carries fewer)."""
    dof = max(1, n_ref - 1 + n_run - 2) * (1 - rho * rho) / (1 + rho * rho)
    return bands.t_quantile(1.0 - alpha, max(1.0, dof))


def split_index(metric: str, baseline: Baseline, rollouts: int) -> int:
    """The index the second half starts at: the middle of the whole run's steps (the same
    at every look: the step the rule looks for is a step from mid-run)."""
    return len(step_range(metric, baseline, rollouts)) // 2


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    params = StepParams.of(rule)
    n_ref = log_spread(ctx.baseline, rule.metric).n
    points = sorted(series)
    p = params.alpha if ctx.limit is None else upper_tail(ctx.limit)
    wanted = _expected(threshold(p, len(points), n_ref, params.rho), p)
    undefined = non_finite_failure(rule, points, wanted, "step")
    if undefined is not None:
        return undefined
    values = [v for _, v in points]
    c = split_index(rule.metric, ctx.baseline, ctx.rollouts)
    if c < MIN_HALF or len(values) - c < MIN_HALF:
        detail = (
            f"{len(values)} values: too few to compare the halves split at index {c} "
            f"(each needs {MIN_HALF})"
        )
        return rule_check(rule, "pass", None, wanted, detail)
    zero = [s for s, v in points if v <= 0]
    if zero:
        detail = f"step undefined: non-positive value (no logarithm) at {steps_text(zero)}"
        return rule_check(rule, "fail", math.nan, wanted, detail, failing_steps=tuple(zero))
    spread = log_spread(ctx.baseline, rule.metric)
    logs = [math.log(v) for v in values]
    z, head, tail = step_rise_z(
        logs, spread, run_sd=params.run_sd, rho=params.rho, pool=params.pool, split=c
    )
    head, tail = math.exp(head), math.exp(tail)  # geometric means, for the detail and plot
    limit = threshold(p, len(values), spread.n, params.rho)
    split = points[c][0]
    detail = (
        f"second half (from step {split}) geometric mean {fmt(tail)} vs first half {fmt(head)}: "
        f"rise {z:+.2f} SE (limit {limit:.2f})"
    )
    if z > limit:
        detail = f"step up: {detail}"
    numbers = {
        "z": z,
        "z_max": limit,
        "head": head,
        "tail": tail,
        "first_step": points[0][0],
        "split_step": split,
        "last_step": points[-1][0],
    }
    return rule_check(rule, passed(z <= limit), z, wanted, detail, numbers=numbers)


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    assert rule.metric is not None
    params = StepParams.of(rule)
    alpha = params.alpha
    return _expected(
        threshold(alpha, rollouts, log_spread(baseline, rule.metric).n, params.rho), alpha
    )


def _expected(limit: float, alpha: float) -> str:
    return f"second-half rise ≤ {limit:.2f} SE (one-sided, α {alpha:.3g})"


def information(rule: Rule, baseline: Baseline, k: int, n: int) -> float | None:
    """One over the GLS step's variance on the first ``k`` of ``n`` rollouts, split at the
    whole run's middle, with the reference's log-scale variance; None before the second
    half has :data:`MIN_HALF` values."""
    assert rule.metric is not None
    params = StepParams.of(rule)
    c = split_index(rule.metric, baseline, n)
    length = len(step_range(rule.metric, baseline, k))
    if c < MIN_HALF or length - c < MIN_HALF:
        return None
    spread = log_spread(baseline, rule.metric)
    sd2 = spread.sd**2
    _, v_ref = reference_level(spread, sd2, run_sd=params.run_sd, rho=params.rho, pool=params.pool)
    a11, a12, a22, _, _ = _normal_equations(length, c, sd2, v_ref, params.rho)
    return (a11 * a22 - a12 * a12) / a11


def nominal(rule: Rule, baseline: Baseline, n: int) -> tuple[float, int]:
    return StepParams.of(rule).alpha, 1


def reference(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    spread = log_spread(baseline, rule.metric)
    params = StepParams.of(rule)
    pooled = f", pooled with the other run's mean {params.pool:g}" if params.pool else ""
    return (
        f"log-scale mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"rho {params.rho:g}, run_sd {params.run_sd:g}{pooled}"
    )


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    assert rule.metric is not None
    problem = log_spread_problem(baseline, rule.metric)
    if problem is not None:
        return problem
    pool = StepParams.of(rule).pool
    if pool is not None and pool <= 0:
        return (".pool", f"pool {pool:g} has no logarithm", "pool a positive mean, or drop pool")
    if pool is not None:
        return bands.pool_problem(pool, baseline, rule.metric)
    return None


SPEC = KindSpec(
    name="step_rise",
    params=StepParams,
    check=check,
    expected=expected,
    reference=reference,
    validate=validate,
    needs_spread=True,
    looks="spending",
    information=information,
    nominal=nominal,
)

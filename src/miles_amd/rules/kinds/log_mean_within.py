"""``log_mean_within``: the run's mean of logarithms within ``z`` SE of the reference's.

For a positive, right-skewed metric whose level is a factor (the train/rollout KL, issue 19).
The mean band (``mean_within``) on such a metric rests on a normal spread: under a KL shape
fitted to the published min/mean/max (``c + LogNormal``, the max far above the mean;
``baselines/README.md``, the noise table) the run's arithmetic mean has a long right tail
and the band failed 1.1% of healthy runs. On the logarithms the tail is short, and a
doubling is a shift of ``ln 2`` whatever the shape. The logarithm exists: miles computes the
KL per token with Schulman's k3 (``low_var_kl``, not negative;
``miles/backends/training_utils/loss_hub/losses.py`` at the pinned commit), so a rollout's KL
is 0 only if every rescored token matched exactly, which a bf16 trainer and engine do not;
such a value fails, named.

The statistic: ``z = (mean ln run - m) / sqrt(sd²·(V(N) + V(n_ref)) + 2·run_sd²)`` with
``m`` the reference's log-scale mean (``miles_amd.rules.log_scale.log_spread``: its series',
or ``ln(mean) - sd²/2`` with ``sd = ln(max/min)/d2(n)`` from a published summary), ``V(n)``
the variance of a mean of ``n`` rollouts with lag-1 ``rho``
(``miles_amd.rules.bands.mean_variance``), ``run_sd`` the sd of a run-level factor on the
log scale, and ``sd²`` the reference's log-scale variance pooled with the run's own
(``n_ref - 1`` and ``N - 1`` degrees of freedom): a run whose large values lift its mean
also shows them in its spread, so a skewed metric's tail does not read as a shift (measured
with the reference's sd alone: 0.5% false alarms under the skewed KL; pooled: 0.1%).
Two-sided: the KL moving either way means the rollout and trainer numerics changed.

Tolerance: ``|z| ≤ z``; ``z`` bounded by the schema to [2, 6]. The shipped KL rule's
``z = 3.25`` (a normal two-sided rate of 0.12%) with ``rho = 0.3`` and ``run_sd = 0.06`` as
chosen from the published data (``baselines/README.md``'s noise table: the upper bound of
jvvnhop9's lag-1, twice the gap's run effect): on the honest model of that README's
calibration (reference simulated and recorded too; ``benchmarks/bench_calibration.py``)
KL x2 is caught in 96.7% of runs at 0.13% false alarms (z = 3.5: 94%).
The plot hint (the band of the geometric mean for this run's spread) is
``miles_amd.report.rule_hints.geometric_band``. At a look (``miles_amd.rules.looks``) the
rate of ``z`` a side is spent over the looks: the first ``k`` rollouts' shift is held to the
look's bound, with the information ``1 / (sd²·(V(k) + V(n_ref)) + 2·run_sd²)``. Pure: no
file is read.

Explained for people in ``docs/gate-and-statistics.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    steps_text,
)
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.log_scale import log_spread, log_spread_problem
from miles_amd.rules.model import Baseline, Params, Rule
from miles_amd.rules.spending import upper_tail


@dataclass(frozen=True)
class LogMeanParams(Params):
    z: float
    rho: float
    run_sd: float


def log_mean_z(
    logs: list[float], spread: bands.Spread, *, run_sd: float, rho: float
) -> tuple[float, float]:
    """(z, its standard error) of the mean of ``logs`` against ``spread`` (log scale)."""
    n = len(logs)
    mean = math.fsum(logs) / n
    residual = math.fsum((v - mean) ** 2 for v in logs)
    dof_ref = spread.n - 1
    sd2 = (dof_ref * spread.sd**2 + residual) / (dof_ref + n - 1)
    variance = sd2 * (bands.mean_variance(n, rho) + bands.mean_variance(spread.n, rho))
    se = math.sqrt(variance + 2 * run_sd**2)
    if se <= 0:
        return (0.0 if mean == spread.mean else math.copysign(math.inf, mean - spread.mean)), se
    return (mean - spread.mean) / se, se


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    params = LogMeanParams.of(rule)
    bound = params.z if ctx.limit is None else ctx.limit
    wanted = _expected(bound)
    undefined = non_finite_failure(rule, series, wanted, "geometric mean")
    if undefined is not None:
        return undefined
    zero = [s for s, v in series if v <= 0]
    if zero:
        where = steps_text(zero)
        detail = f"geometric mean undefined: non-positive value (no logarithm) at {where}"
        return rule_check(rule, "fail", math.nan, wanted, detail, failing_steps=tuple(zero))
    spread = log_spread(ctx.baseline, rule.metric)
    logs = [math.log(v) for _, v in series]
    z, se = log_mean_z(logs, spread, run_sd=params.run_sd, rho=params.rho)
    value = math.exp(math.fsum(logs) / len(logs))
    low, high = math.exp(spread.mean - bound * se), math.exp(spread.mean + bound * se)
    ok = abs(z) <= bound
    centre = math.exp(spread.mean)
    detail = (
        f"geometric mean {fmt(value)} of {len(logs)} values vs reference {fmt(centre)}: "
        f"{z:+.2f} SE (limit ±{bound:g}; band for this run's spread [{fmt(low)}, {fmt(high)}])"
    )
    numbers = {"value": value, "z": z, "z_max": bound, "low": low, "high": high}
    return rule_check(rule, passed(ok), value, wanted, detail, numbers=numbers)


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return _expected(LogMeanParams.of(rule).z)


def _expected(bound: float) -> str:
    return f"|log-scale mean shift| ≤ {bound:g} SE (two-sided)"


def information(rule: Rule, baseline: Baseline, k: int, n: int) -> float:
    """One over the variance of the log-scale shift on ``k`` rollouts (reference spread)."""
    assert rule.metric is not None
    params = LogMeanParams.of(rule)
    spread = log_spread(baseline, rule.metric)
    sampling = bands.mean_variance(k, params.rho) + bands.mean_variance(spread.n, params.rho)
    return 1.0 / (spread.sd**2 * sampling + 2 * params.run_sd**2)


def nominal(rule: Rule, baseline: Baseline, n: int) -> tuple[float, int]:
    return upper_tail(LogMeanParams.of(rule).z), 2


def reference(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    spread = log_spread(baseline, rule.metric)
    params = LogMeanParams.of(rule)
    return (
        f"log-scale mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"rho {params.rho:g}, run_sd {params.run_sd:g}"
    )


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    assert rule.metric is not None
    return log_spread_problem(baseline, rule.metric)


SPEC = KindSpec(
    name="log_mean_within",
    params=LogMeanParams,
    check=check,
    expected=expected,
    reference=reference,
    validate=validate,
    needs_spread=True,
    looks="spending",
    information=information,
    nominal=nominal,
)

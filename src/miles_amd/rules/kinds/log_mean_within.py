"""``log_mean_within``: the run's mean of logarithms within ``z`` SE of the reference's.

For a positive, right-skewed metric whose level is a factor (the train/rollout KL, issue 19):
on the logarithms the tail is short and a doubling is a shift of ``ln 2``.

Decides:

- the statistic: ``z = (mean ln run - m) / sqrt(sd²·(V(N) + V(n_ref)) + 2·run_sd²)``, ``m``
  and ``sd`` the reference's log-scale mean and spread (``miles_amd.rules.log_scale``), ``sd²``
  pooled with the run's own;
- two-sided: ``|z| ≤ z``, ``z`` bounded by the schema to [2, 6];
- at a look (``miles_amd.rules.looks``), the rate a side spent over the looks, with the
  information ``1 / (sd²·(V(k) + V(n_ref)) + 2·run_sd²)``;
- a value of 0 or below fails, named (miles' k3 KL is 0 only if every token matched).

Pure: no file is read. The derivation, the shipped rule's figures and why not the mean band:
``docs/gate-and-statistics.md`` ("log_mean_within").
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

"""``all_below``: no value above ``threshold`` (the spike rule); NaN counts as not below.

The threshold is bounded by the loader: above the reference's largest value (the reference
passes its own rule) and at most :data:`THRESHOLD_MAX_RATIO` times it. Judged at once: a
spike loses a partial run (``KindSpec.looks``). Pure: no file is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from miles_amd.evidence.types import Series
from miles_amd.rules.check import Check, Problem, RuleContext, fmt, listed, passed, rule_check
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule

THRESHOLD_MAX_RATIO = 20.0  # a spike threshold is at most 20x the reference's largest value


@dataclass(frozen=True)
class ThresholdParams(Params):
    threshold: float


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    threshold = ThresholdParams.of(rule).threshold
    above = [(s, v) for s, v in series if v > threshold]
    nan = [(s, v) for s, v in series if math.isnan(v)]
    finite = [v for _, v in series if math.isfinite(v)]
    parts = []
    if above:
        shown = [f"{ctx.where(rule.metric, s)} ({fmt(v)})" for s, v in above]
        parts.append(f"{len(above)} spike(s) above {threshold:g}: {listed(shown)}")
    if nan:
        parts.append(f"NaN at {listed([ctx.where(rule.metric, s) for s, _ in nan])}")
    if not parts:
        top = max(series, key=lambda p: p[1])
        where = ctx.where(rule.metric, top[0])
        parts.append(f"0 spikes above {threshold:g}; max {fmt(top[1])} at {where}")
    return rule_check(
        rule,
        passed(not above and not nan),
        len(above),
        expected(rule, ctx.baseline, ctx.rollouts),
        "; ".join(parts),
        failing_steps=tuple(s for s, _ in above + nan),
        numbers={
            "spikes": len(above),
            "max": max(finite, default=math.nan),
            "threshold": threshold,
        },
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"0 values above {ThresholdParams.of(rule).threshold:g}"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    assert rule.metric is not None
    threshold = ThresholdParams.of(rule).threshold
    top = baseline.reference_max(rule.metric)
    if top is None or top <= 0:
        return (
            ".metric",
            f"no positive reference max of {rule.metric} to bound the threshold",
            ("add the reference's series, or a summary with its max"),
        )
    if not top < threshold <= THRESHOLD_MAX_RATIO * top:
        return (
            ".threshold",
            (
                f"threshold {threshold:g} outside its sane range ({top:g}, "
                f"{THRESHOLD_MAX_RATIO * top:g}]: above the reference's max {top:g} (the reference "
                f"passes its own rule) and at most {THRESHOLD_MAX_RATIO:g}x it"
            ),
            "use a spike threshold in that range",
        )
    return None


def summary(rule: Rule, values: list[float]) -> dict[str, Any]:
    threshold = ThresholdParams.of(rule).threshold
    return {"above_spike_threshold": sum(v > threshold for v in values)}


SPEC = KindSpec(
    name="all_below",
    params=ThresholdParams,
    check=check,
    expected=expected,
    validate=validate,
    summary=summary,
    looks="at_once",
)

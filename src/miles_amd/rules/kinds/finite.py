"""``finite``: no NaN/inf value. No tolerance. Judged at once: a non-finite value loses a
partial run (``KindSpec.looks``).

Pure: no file is read.
"""

from __future__ import annotations

import math

from miles_amd.evidence.types import Series
from miles_amd.rules.check import Check, RuleContext, fmt, listed, passed, rule_check
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, NoParams, Rule


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    bad = [(s, v) for s, v in series if not math.isfinite(v)]
    shown = [f"{ctx.where(rule.metric, s)}: {fmt(v)}" for s, v in bad]
    detail = f"non-finite {rule.metric} at {listed(shown)}" if bad else "every value finite"
    return rule_check(
        rule,
        passed(not bad),
        f"{len(bad)} non-finite of {len(series)}",
        expected(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(s for s, _ in bad),
        numbers={"non_finite": len(bad)},
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return "every value finite"


SPEC = KindSpec(name="finite", params=NoParams, check=check, expected=expected, looks="at_once")

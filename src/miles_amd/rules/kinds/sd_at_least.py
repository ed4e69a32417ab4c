"""``sd_at_least``: the run's sample sd of the metric is at least ``floor``.

A reward that is (nearly) the same value at every rollout carries no learning signal, or
the reward is broken, and passes every other rule. The floor is
``miles_amd.rules.bands.binomial_sd_floor`` of the reference mean, the samples per rollout
and the run's rollouts: the spread the 0/1 reward over 64 samples has even with no
prompt-to-prompt difference, at its ``Φ(-z)`` quantile. ``floor`` is written for
``run_shape.rollouts`` and re-derived by the loader and by ``baseline record``; rescaled for
other counts; ``z`` is bounded by the schema. Pure: no file is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from miles_amd import numeric
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
)
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule


@dataclass(frozen=True)
class FloorParams(Params):
    z: float
    floor: float


def floor_for(rule: Rule, baseline: Baseline, rollouts: int) -> float:
    """The sd floor of ``rule`` for a run of ``rollouts`` (see the module doc)."""
    assert rule.metric is not None
    mean = bands.spread_of(baseline, rule.metric).mean
    z = FloorParams.of(rule).z
    return bands.binomial_sd_floor(mean, baseline.run_shape.samples_per_rollout, rollouts, z)


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    floor = floor_for(rule, ctx.baseline, ctx.rollouts)
    wanted = expected(rule, ctx.baseline, ctx.rollouts)
    values = [v for _, v in series]
    undefined = non_finite_failure(rule, series, wanted, "spread")
    if undefined is not None:
        return undefined
    sd = numeric.stdev(values)
    distinct = len(set(values))
    detail = f"sd {fmt(sd)} over {len(values)} values ({distinct} distinct); floor {fmt(floor)}"
    if sd < floor:
        detail = f"too little spread: {detail}"
    numbers = {"sd": sd, "floor": floor}
    return rule_check(rule, passed(sd >= floor), sd, wanted, detail, numbers=numbers)


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"sd ≥ {floor_for(rule, baseline, rollouts):.4g}"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
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
    floor = FloorParams.of(rule).floor
    if not math.isclose(floor, derived, rel_tol=1e-12):
        return (
            ".floor",
            f"floor {floor} is not the derived {derived!r}",
            f"set it to {derived!r} (miles_amd.rules.bands.binomial_sd_floor)",
        )
    return None


def rederive(rule: Rule, draft: Baseline, rollouts: int) -> dict[str, Any]:
    """``baseline record``: the floor re-derived from the recorded run's mean."""
    return {"floor": floor_for(rule, draft, rollouts)}


def reference(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    spread = bands.spread_of(baseline, rule.metric)
    return f"mean {spread.mean:.6g} over {baseline.run_shape.samples_per_rollout} samples a rollout"


SPEC = KindSpec(
    name="sd_at_least",
    params=FloorParams,
    check=check,
    expected=expected,
    reference=reference,
    validate=validate,
    rederive=rederive,
)

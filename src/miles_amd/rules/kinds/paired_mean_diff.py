"""``paired_mean_diff``: rollout i of the run against rollout i of the reference.

With ``--rollout-shuffle`` and the default seed every run sees the same prompt sequence, so
the mean per-rollout difference to the reference series must lie within ``z`` standard
errors (``miles_amd.rules.bands.paired_effect``); ``z`` is bounded by the schema. Needs the
reference's per-rollout series. Pure: no file is read.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from miles_amd import numeric
from miles_amd.evidence.types import Series
from miles_amd.rules import bands
from miles_amd.rules.check import Check, Problem, RuleContext, passed, rule_check, steps_text
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule


@dataclass(frozen=True)
class ZParams(Params):
    z: float


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    z = ZParams.of(rule).z
    reference = ctx.baseline.series[rule.metric]
    counts = Counter(step for step, _ in series)
    pairs = [(s, v, reference[s]) for s, v in series if 0 <= s < len(reference) and counts[s] == 1]
    wanted = expected(rule, ctx.baseline, ctx.rollouts)
    if not pairs:
        detail = (
            f"not measured: no rollout of the run pairs with {ctx.baseline.run_id}'s rollouts "
            f"0..{len(reference) - 1}"
        )
        return rule_check(rule, "fail" if rule.required else "not_measured", None, wanted, detail)
    bad = [s for s, v, _ in pairs if not math.isfinite(v)]
    if bad:
        detail = f"paired effect undefined: non-finite at rollout {steps_text(bad)}"
        return rule_check(rule, "fail", math.nan, wanted, detail, failing_steps=tuple(bad))
    try:
        effect = bands.paired_effect(
            [v for _, v, _ in pairs],
            [r for _, _, r in pairs],
            samples_per_rollout=ctx.baseline.run_shape.samples_per_rollout,
        )
    except OverflowError:
        detail = "paired effect undefined: the values are too large to difference in floats"
        return rule_check(rule, "fail", math.nan, wanted, detail)
    return rule_check(
        rule,
        passed(abs(effect.mean_diff) <= z * effect.se),
        effect.mean_diff,
        wanted,
        _detail(effect, ctx.baseline.run_id),
        numbers={
            "mean_diff": effect.mean_diff,
            "se": effect.se,
            "n": effect.n,
            "z": effect.z,
            "z_max": z,
        },
    )


def _detail(effect: bands.PairedEffect, run_id: str) -> str:
    observed_sd = "n/a" if effect.sd_observed is None else f"{effect.sd_observed:.4f}"
    return (
        f"Δ = {effect.mean_diff:+.3g} ± {effect.se:.3g} (SE) over {effect.n} rollouts paired "
        f"with {run_id}, {effect.z:+.2f} SE; sd of differences {observed_sd}, binomial floor "
        f"{effect.sd_binomial_floor:.4f}"
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"|mean paired Δ| ≤ {ZParams.of(rule).z:g} SE"


def reference(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    values = baseline.series[rule.metric]
    return f"series of {len(values)} rollouts, mean {numeric.mean(values):.6g}"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    if rule.metric not in baseline.series:
        return (
            ".metric",
            f"paired comparison needs a per-rollout series of {rule.metric}",
            ("add it to evidence.series or drop the rule"),
        )
    return None


SPEC = KindSpec(
    name="paired_mean_diff",
    params=ZParams,
    check=check,
    expected=expected,
    reference=reference,
    validate=validate,
    reference_series=True,
)

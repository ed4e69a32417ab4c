"""``paired_mean_diff``: rollout i of the run against rollout i of the reference.

With ``--rollout-shuffle`` and the default seed every run sees the same prompt sequence, so
the mean per-rollout difference to the reference series must lie within ``z`` standard
errors (``miles_amd.rules.bands.paired_effect``: two-sided, the SE the larger of the
observed spread and a binomial floor); ``z`` is bounded by the schema. Needs the
reference's per-rollout series.

``side: lower`` (issue 19) fails only a drop, with the exact binomial SE of
``samples_per_rollout`` 0/1 samples (``miles_amd.rules.bands.paired_drop``: ``E[p(1-p)]``
from the reference series, plus a declared run-level shift ``run_sd``), and the reference
level pooled with ``pool``, the other published run's mean on the same prompts (the loader
checks it is a ``cover`` value of a ``mean_within`` rule on the metric). The observed spread
is reported, not used: a collapse of the last third of a run inflated it and hid itself
(caught 1 time in 4; now 99%). At a look (``miles_amd.rules.looks``) the first ``k``
rollouts are paired and held to the look's bound, which spends the rate of ``z`` (one side
for ``lower``, two for ``both``) over the looks. Pure: no file is read.

Explained for people in ``docs/gate-and-statistics.md``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from miles_amd import numeric
from miles_amd.evidence.types import Series
from miles_amd.rules import bands
from miles_amd.rules.check import Check, Problem, RuleContext, passed, rule_check, steps_text
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule
from miles_amd.rules.spending import upper_tail


@dataclass(frozen=True)
class PairedParams(Params):
    z: float
    side: str | None = None  # "both" (the default) or "lower"
    run_sd: float | None = None  # lower: sd of a run-level shift of every prompt's p
    pool: float | None = None  # lower: the other published run's mean on the same prompts

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_json().items() if v is not None}


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    params = PairedParams.of(rule)
    z = params.z if ctx.limit is None else ctx.limit
    reference = ctx.baseline.series[rule.metric]
    counts = Counter(step for step, _ in series)
    pairs = [(s, v, reference[s]) for s, v in series if 0 <= s < len(reference) and counts[s] == 1]
    wanted = _expected(params, z)
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
        effect = _effect(params, ctx.baseline, reference, pairs)
    except OverflowError:
        detail = "paired effect undefined: the values are too large to difference in floats"
        return rule_check(rule, "fail", math.nan, wanted, detail)
    lower = params.side == "lower"
    ok = effect.mean_diff >= -z * effect.se if lower else abs(effect.mean_diff) <= z * effect.se
    return rule_check(
        rule,
        passed(ok),
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


def _effect(
    params: PairedParams,
    baseline: Baseline,
    reference: tuple[float, ...],
    pairs: list[tuple[int, float, float]],
) -> bands.PairedEffect:
    """Two-sided with the observed/floor SE, or ``side: lower``'s exact binomial SE."""
    shape = baseline.run_shape
    if params.side != "lower":
        return bands.paired_effect(
            [v for _, v, _ in pairs],
            [r for _, _, r in pairs],
            samples_per_rollout=shape.samples_per_rollout,
        )
    paired = {s for s, _, _ in pairs}
    # the paired reference values first (in the run's order), then the rest: all of the
    # reference gives its mean and its prompt variance
    ordered = [r for _, _, r in pairs] + [v for s, v in enumerate(reference) if s not in paired]
    return bands.paired_drop(
        [v for _, v, _ in pairs],
        ordered,
        samples_per_rollout=shape.samples_per_rollout,
        groups=shape.prompts_per_rollout,
        run_sd=params.run_sd or 0.0,
        pool=params.pool,
    )


def _detail(effect: bands.PairedEffect, run_id: str) -> str:
    observed_sd = "n/a" if effect.sd_observed is None else f"{effect.sd_observed:.4f}"
    return (
        f"Δ = {effect.mean_diff:+.3g} ± {effect.se:.3g} (SE) over {effect.n} rollouts paired "
        f"with {run_id}, {effect.z:+.2f} SE; sd of differences {observed_sd}, binomial floor "
        f"{effect.sd_binomial_floor:.4f}"
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    params = PairedParams.of(rule)
    return _expected(params, params.z)


def _expected(params: PairedParams, z: float) -> str:
    if params.side == "lower":
        pooled = f", reference pooled with {params.pool:g}" if params.pool is not None else ""
        return f"mean paired Δ ≥ -{z:g} SE (binomial SE{pooled})"
    return f"|mean paired Δ| ≤ {z:g} SE"


def information(rule: Rule, baseline: Baseline, k: int, n: int) -> float | None:
    """One over the variance of the difference over the first ``k`` rollouts (those the
    reference has: the paired ones): the exact binomial one of ``side: lower``
    (``bands.paired_drop_variance``), else ``k``."""
    assert rule.metric is not None
    params = PairedParams.of(rule)
    reference = baseline.series[rule.metric]
    k = min(k, len(reference))  # rollouts beyond the reference's pair with nothing
    if params.side != "lower":
        return float(k)
    shape = baseline.run_shape
    variance = bands.paired_drop_variance(
        reference,
        k,
        samples_per_rollout=shape.samples_per_rollout,
        groups=shape.prompts_per_rollout,
        run_sd=params.run_sd or 0.0,
        pool=params.pool,
    )
    return 1.0 / variance


def nominal(rule: Rule, baseline: Baseline, n: int) -> tuple[float, int]:
    params = PairedParams.of(rule)
    return upper_tail(params.z), 1 if params.side == "lower" else 2


def reference(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    values = baseline.series[rule.metric]
    return f"series of {len(values)} rollouts, mean {numeric.mean(values):.6g}"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    assert rule.metric is not None
    if rule.metric not in baseline.series:
        return (
            ".metric",
            f"paired comparison needs a per-rollout series of {rule.metric}",
            ("add it to evidence.series or drop the rule"),
        )
    params = PairedParams.of(rule)
    if params.side != "lower" and (params.pool is not None or params.run_sd is not None):
        return (".side", "pool and run_sd apply to side lower only", "set side to lower")
    if params.pool is not None:
        return bands.pool_problem(params.pool, baseline, rule.metric)
    return None


SPEC = KindSpec(
    name="paired_mean_diff",
    params=PairedParams,
    check=check,
    expected=expected,
    reference=reference,
    validate=validate,
    reference_series=True,
    looks="spending",
    information=information,
    nominal=nominal,
)

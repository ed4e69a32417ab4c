"""Rules that compare a run with the reference run's statistics: bands and the paired effect.

The check, expected-value sentence, plot hint, reference text and tolerance validation of
``mean_within``, ``max_within`` (a band derived from the reference spread by
``miles_amd.baseline.bands``) and ``paired_mean_diff`` (rollout i against the reference's
rollout i); :data:`miles_amd.judge.rules.KINDS` declares which function is which. The
loader re-derives every band (``validate_band``); a ``cover`` value (another published run
the band must include) may stretch a band to at most :data:`COVER_MAX_WIDENING` times the
derived reach. ``k`` and ``z`` are bounded in the schema. Pure: no file is read.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from miles_amd.baseline import bands
from miles_amd.judge.checks import (
    Check,
    Problem,
    RuleContext,
    fmt,
    passed,
    rule_check,
    steps_text,
)
from miles_amd.judge.value_rules import reference_max

if TYPE_CHECKING:
    from miles_amd.baseline.model import Baseline, Derive, Rule
    from miles_amd.evidence.types import Series

COVER_MAX_WIDENING = 2.0


# ---------------------------------------------------------------------------- bands


def _mean(values: list[float]) -> float:
    """The mean; NaN (in no band) when finite values sum beyond the float range."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.nan


def check_band(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    name, stat = ("mean", _mean) if rule.kind == "mean_within" else ("max", max)
    band = ctx.baseline.band_for(rule, ctx.rollouts)
    values = [v for _, v in series]
    bad = [s for s, v in series if not math.isfinite(v)]
    value = math.nan if bad else stat(values)
    ok = band.contains(value)
    detail = f"{name} {fmt(value)} of {len(values)} values; band for {ctx.rollouts} rollouts"
    failing: tuple[int, ...] = tuple(bad)
    if bad:
        detail = f"{name} undefined: non-finite at {steps_text(bad)}"
    elif not ok:
        detail = f"{name} {fmt(value)} outside {band.describe()} ({len(values)} values)"
        if name == "max":
            failing = tuple(s for s, v in series if not band.contains(v))
    numbers = {"value": value}
    numbers.update({k: v for k, v in (("low", band.low), ("high", band.high)) if v is not None})
    return rule_check(
        rule, passed(ok), value, band.describe(), detail, failing_steps=failing, numbers=numbers
    )


def expected_band(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return baseline.band_for(rule, rollouts).describe()


def plot_mean_band(ax: Any, check: Check, finite: list[float]) -> bool:
    low, high = check.numbers.get("low"), check.numbers.get("high")
    if low is not None and high is not None:
        label = f"band for the mean ({check.name})"
        ax.axhspan(low, high, color="tab:green", alpha=0.15, label=label, gid=f"band:{check.name}")
    value = check.numbers.get("value")
    if value is not None and math.isfinite(value):
        ax.axhline(value, color="tab:green", linestyle=":", linewidth=1, label="run mean")
    return False


def plot_max_bound(ax: Any, check: Check, finite: list[float]) -> bool:
    high = check.numbers.get("high")
    if high is not None:
        ax.axhline(
            high, color="tab:orange", linestyle="--", linewidth=1, label="max bound", gid="max"
        )
    return False


def reference_spread(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None and rule.derive is not None
    spread = baseline.spread(rule.metric)
    cover = ", ".join(f"{c:.6g}" for c in rule.derive.cover)
    text = (
        f"mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"k {rule.derive.k:.6g}, cover [{cover}]"
    )
    if rule.derive.run_sd or rule.derive.rho:
        text += f", run_sd {rule.derive.run_sd:.6g}, rho {rule.derive.rho:.6g}"
    top = reference_max(baseline, rule.metric) if rule.kind == "max_within" else None
    return text + (f", max {top:.6g}" if top is not None else "")


def validate_band(rule: Rule, baseline: Baseline) -> Problem | None:
    """The written band is the derived one, and no ``cover`` value stretches it too far.

    (That ``derive.method`` is the kind's own is checked first, by ``rules.validate_rule``.)
    """
    assert rule.derive is not None and rule.band is not None and rule.metric is not None
    try:
        spread = baseline.spread(rule.metric)
        derived = baseline.band_for(rule, baseline.run_shape.rollouts)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot derive the band of {rule.metric}: {exc}",
            ("add a series, or a summary with sd, min/max or bounds"),
        )
    for cover in rule.derive.cover:
        limit = _cover_limit(rule.kind, spread, baseline.run_shape.rollouts, rule.derive)
        if abs(cover - spread.mean) > limit:
            return (
                ".derive.cover",
                (
                    f"cover {cover:g} is {abs(cover - spread.mean):.4g} from the centre "
                    f"{spread.mean:.6g}, beyond {COVER_MAX_WIDENING:g}x the derived reach "
                    f"{limit / COVER_MAX_WIDENING:.4g}"
                ),
                "cover only another run of the same recipe, or drop the value",
            )
    if not _same(derived.low, rule.band.low) or not _same(derived.high, rule.band.high):
        return (
            ".band",
            f"band {{low: {rule.band.low}, high: {rule.band.high}}} is not the derived one",
            (
                f"set it to {{low: {derived.low}, high: {derived.high}}} "
                "(miles_amd.baseline.bands) or change derive"
            ),
        )
    return None


def _cover_limit(kind: str, spread: bands.Spread, n: int, derive: Derive) -> float:
    """How far from the centre a cover value may lie: COVER_MAX_WIDENING x the derived reach."""
    if kind == "mean_within":
        reach = bands.mean_half_width(spread, n, derive.k, derive.run_sd, derive.rho)
    else:
        reach = bands.max_reach(spread, n, derive.k, derive.run_sd)
    return COVER_MAX_WIDENING * reach


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


# ---------------------------------------------------------------------------- paired_mean_diff


def check_paired(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.z is not None
    reference = ctx.baseline.series[rule.metric]
    counts = Counter(step for step, _ in series)
    pairs = [(s, v, reference[s]) for s, v in series if 0 <= s < len(reference) and counts[s] == 1]
    expected = expected_paired(rule, ctx.baseline, ctx.rollouts)
    if not pairs:
        detail = (
            f"not measured: no rollout of the run pairs with {ctx.baseline.run_id}'s rollouts "
            f"0..{len(reference) - 1}"
        )
        return rule_check(rule, "fail" if rule.required else "not_measured", None, expected, detail)
    bad = [s for s, v, _ in pairs if not math.isfinite(v)]
    if bad:
        detail = f"paired effect undefined: non-finite at rollout {steps_text(bad)}"
        return rule_check(rule, "fail", math.nan, expected, detail, failing_steps=tuple(bad))
    try:
        effect = _effect(rule, ctx.baseline, pairs)
    except OverflowError:
        detail = "paired effect undefined: the values are too large to difference in floats"
        return rule_check(rule, "fail", math.nan, expected, detail)
    lower = rule.side == "lower"
    ok = effect.mean_diff >= -rule.z * effect.se if lower else abs(effect.z) <= rule.z
    return rule_check(
        rule,
        passed(ok),
        effect.mean_diff,
        expected,
        _paired_detail(effect, ctx.baseline.run_id),
        numbers={
            "mean_diff": effect.mean_diff,
            "se": effect.se,
            "n": effect.n,
            "z": effect.z,
            "z_max": rule.z,
        },
    )


def _effect(rule: Rule, baseline: Baseline, pairs: list[tuple[int, float, float]]):
    """The paired effect: two-sided with the observed/floor SE, or ``side: lower``'s."""
    shape = baseline.run_shape
    if rule.side != "lower":
        return bands.paired_effect(
            [v for _, v, _ in pairs],
            [r for _, _, r in pairs],
            samples_per_rollout=shape.samples_per_rollout,
        )
    assert rule.metric is not None
    series = baseline.series[rule.metric]
    paired = {s for s, _, _ in pairs}
    # the paired reference values first (their order matches the run's), then the rest:
    # all of the reference gives its mean and prompt variance
    reference = [r for _, _, r in pairs] + [v for s, v in enumerate(series) if s not in paired]
    return bands.paired_drop(
        [v for _, v, _ in pairs],
        reference,
        samples_per_rollout=shape.samples_per_rollout,
        groups=shape.prompts_per_rollout,
        run_sd=rule.run_sd or 0.0,
        pool=rule.pool,
    )


def _paired_detail(effect: bands.PairedEffect, run_id: str) -> str:
    observed_sd = "n/a" if effect.sd_observed is None else f"{effect.sd_observed:.4f}"
    return (
        f"Δ = {effect.mean_diff:+.3g} ± {effect.se:.3g} (SE) over {effect.n} rollouts paired "
        f"with {run_id}, {effect.z:+.2f} SE; sd of differences {observed_sd}, binomial floor "
        f"{effect.sd_binomial_floor:.4f}"
    )


def expected_paired(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    if rule.side == "lower":
        pooled = f", reference pooled with {rule.pool:g}" if rule.pool is not None else ""
        return f"mean paired Δ ≥ -{rule.z:g} SE (binomial SE{pooled})"
    return f"|mean paired Δ| ≤ {rule.z:g} SE"


def reference_series(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    values = baseline.series[rule.metric]
    return f"series of {len(values)} rollouts, mean {math.fsum(values) / len(values):.6g}"


def validate_paired(rule: Rule, baseline: Baseline) -> Problem | None:
    if rule.metric not in baseline.series:
        return (
            ".metric",
            f"paired comparison needs a per-rollout series of {rule.metric}",
            ("add it to evidence.series or drop the rule"),
        )
    if rule.side != "lower" and (rule.pool is not None or rule.run_sd is not None):
        return (".side", "pool and run_sd apply to side lower only", "set side to lower")
    if rule.pool is not None:
        covers = {
            c
            for r in baseline.rules
            if r.kind == "mean_within" and r.metric == rule.metric and r.derive is not None
            for c in r.derive.cover
        }
        if not any(_same(rule.pool, c) for c in covers):
            return (
                ".pool",
                f"pool {rule.pool:g} is no cover value of a mean_within rule on {rule.metric} "
                f"(covers: {sorted(covers)})",
                "pool only the other published run the mean band covers, or drop pool",
            )
    return None

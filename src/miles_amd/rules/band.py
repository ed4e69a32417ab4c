"""What the two band kinds share: a band derived from the reference spread, its check.

``mean_within`` / ``max_within`` (``miles_amd.rules.kinds``): the run's mean / max lies in
the band derived for N rollouts by ``miles_amd.rules.bands`` (:func:`band_for`). The loader
re-derives the written band (:func:`validate_band`); a ``cover`` value (another published
run the band must include) may stretch it to at most :data:`COVER_MAX_WIDENING` times the
derived reach; ``k``, ``run_sd`` (a run-level effect) and ``rho`` (lag-1 autocorrelation)
are bounded by the schema (issue 19: without them a band ignores run-to-run variation and
fails about one healthy run in ten; ``benchmarks/bench_calibration.py``). At a look
(``miles_amd.rules.looks``) a mean band spends its rate (``k`` SE a side) over the looks: the
look's band is its bound ``z`` in SE of the mean of the first rollouts (:func:`look_band`);
a max bound is judged at once, the whole run's bound at every look. Not a kind itself.
Pure: no file is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from miles_amd import numeric
from miles_amd.evidence.types import Series
from miles_amd.rules import bands
from miles_amd.rules.bands import Band
from miles_amd.rules.check import Check, Problem, RuleContext, fmt, passed, rule_check, steps_text
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule
from miles_amd.rules.spending import upper_tail

COVER_MAX_WIDENING = 2.0


@dataclass(frozen=True)
class Derive:
    """How a rule's band is computed from the baseline's evidence (``miles_amd.rules.bands``)."""

    method: Literal["mean_band", "max_band"]
    k: float
    cover: tuple[float, ...] = ()
    run_sd: float = 0.0  # relative sd of a run-level effect (miles_amd.rules.bands)
    rho: float = 0.0  # lag-1 autocorrelation of the per-rollout values (mean_band only)


@dataclass(frozen=True)
class BandParams(Params):
    band: Band
    derive: Derive

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BandParams:
        band, derive = raw["band"], raw["derive"]
        return cls(
            Band(band["low"], band["high"]),
            Derive(
                derive["method"],
                derive["k"],
                tuple(derive.get("cover", ())),
                derive.get("run_sd", 0.0),
                derive.get("rho", 0.0),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        d = self.derive
        derive: dict[str, Any] = {"method": d.method, "k": d.k, "cover": list(d.cover)}
        derive.update({k: v for k, v in (("run_sd", d.run_sd), ("rho", d.rho)) if v})
        return {"band": {"low": self.band.low, "high": self.band.high}, "derive": derive}


def band_for(rule: Rule, baseline: Baseline, n_rollouts: int) -> Band:
    """The band of a band rule for a run of ``n_rollouts``.

    For ``n_rollouts == run_shape.rollouts`` this is the band written in the file (the
    loader checked they agree); other counts rescale it with the same method.
    """
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = baseline.spread(rule.metric)
    if derive.method == "mean_band":
        return bands.mean_band(
            spread, n_rollouts, derive.k, derive.cover, derive.run_sd, derive.rho
        )
    return bands.max_band(spread, n_rollouts, derive.k, derive.cover, derive.run_sd)


def _mean(values: list[float]) -> float:
    """The mean (``miles_amd.numeric``: finite for any finite values)."""
    return numeric.mean(values)


def look_band(rule: Rule, baseline: Baseline, n_rollouts: int, z: float) -> Band:
    """A mean band's bound at a look (``miles_amd.rules.looks``): ``z`` standard errors of a
    mean of ``n_rollouts``, widened to cover the ``cover`` values as the written band is."""
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = baseline.spread(rule.metric)
    return bands.mean_band(spread, n_rollouts, z, derive.cover, derive.run_sd, derive.rho)


def mean_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float:
    """The information of a mean of ``k`` rollouts against the reference: 1 / its variance."""
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = baseline.spread(rule.metric)
    return 1.0 / bands.mean_half_width(spread, k, 1.0, derive.run_sd, derive.rho) ** 2


def mean_nominal(rule: Rule, baseline: Baseline, n: int) -> tuple[float, int]:
    """The band's fixed-sample rate: ``k`` standard errors on each of two sides."""
    return upper_tail(BandParams.of(rule).derive.k), 2


def check_band(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    name, stat = ("mean", _mean) if rule.kind == "mean_within" else ("max", max)
    n_band = ctx.rollouts if ctx.look is None else ctx.look
    if name == "mean" and ctx.limit is not None:
        band = look_band(rule, ctx.baseline, n_band, ctx.limit)
    else:  # a max bound is the whole run's at every look: what exceeds it now fails the run
        band, n_band = band_for(rule, ctx.baseline, ctx.rollouts), ctx.rollouts
    values = [v for _, v in series]
    bad = [s for s, v in series if not math.isfinite(v)]
    value = math.nan if bad else stat(values)
    ok = band.contains(value)
    detail = f"{name} {fmt(value)} of {len(values)} values; band for {n_band} rollouts"
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
    return band_for(rule, baseline, rollouts).describe()


def reference_spread(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = baseline.spread(rule.metric)
    cover = ", ".join(f"{c:.6g}" for c in derive.cover)
    text = (
        f"mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"k {derive.k:.6g}, cover [{cover}]"
    )
    if derive.run_sd or derive.rho:
        text += f", run_sd {derive.run_sd:.6g}, rho {derive.rho:.6g}"
    top = baseline.reference_max(rule.metric) if rule.kind == "max_within" else None
    return text + (f", max {top:.6g}" if top is not None else "")


def validate_band(rule: Rule, baseline: Baseline, method: str) -> Problem | None:
    """The kind's method, the written band is the derived one, no ``cover`` stretches it."""
    assert rule.metric is not None
    params = BandParams.of(rule)
    if params.derive.method != method:
        return (
            ".derive.method",
            f"{rule.kind} takes method {method}, not {params.derive.method}",
            f"set it to {method}",
        )
    try:
        spread = baseline.spread(rule.metric)
        derived = band_for(rule, baseline, baseline.run_shape.rollouts)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot derive the band of {rule.metric}: {exc}",
            ("add a series, or a summary with sd, min/max or bounds"),
        )
    for cover in params.derive.cover:
        limit = _cover_limit(rule.kind, spread, baseline.run_shape.rollouts, params.derive)
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
    written = params.band
    if not _same(derived.low, written.low) or not _same(derived.high, written.high):
        return (
            ".band",
            f"band {{low: {written.low}, high: {written.high}}} is not the derived one",
            (
                f"set it to {{low: {derived.low}, high: {derived.high}}} "
                "(miles_amd.rules.bands) or change derive"
            ),
        )
    return None


def rederive_band(rule: Rule, draft: Baseline, rollouts: int) -> dict[str, Any]:
    """``baseline record``: the band derived from the recorded run for ``rollouts``."""
    params = BandParams.of(rule)
    band = band_for(rule, draft, rollouts)
    return BandParams(band, params.derive).to_json()


def _cover_limit(kind: str, spread: bands.Spread, n: int, derive: Derive) -> float:
    """How far from the centre a cover value may lie: COVER_MAX_WIDENING x the derived reach."""
    if kind == "mean_within":
        reach = bands.mean_half_width(spread, n, derive.k, derive.run_sd, derive.rho)
    else:
        reach = bands.max_reach(spread, n, derive.k, derive.run_sd)
    return COVER_MAX_WIDENING * reach


def mean_band_covers(baseline: Baseline, metric: str) -> set[float]:
    """The ``cover`` values of the ``mean_within`` rules on ``metric``: the other published
    runs' means a kind may pool its reference level with (``pool``)."""
    return {
        c
        for r in baseline.rules
        if r.kind == "mean_within" and r.metric == metric
        for c in r.params.get("derive", {}).get("cover", ())
    }


def pool_problem(pool: float, baseline: Baseline, metric: str) -> Problem | None:
    """A ``pool`` that is no cover value of a ``mean_within`` rule on ``metric``, or None."""
    covers = mean_band_covers(baseline, metric)
    if any(math.isclose(pool, c, rel_tol=1e-12) for c in covers):
        return None
    return (
        ".pool",
        f"pool {pool:g} is no cover value of a mean_within rule on {metric} "
        f"(covers: {sorted(covers)})",
        "pool only the other published run the mean band covers, or drop pool",
    )


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def band_spec(name: str, method: str) -> KindSpec:
    """The declaration of a band kind whose tolerance ``bands.<method>`` derives: the band
    kinds differ only in that method (``mean_band``, ``max_band``)."""

    def validate(rule: Rule, baseline: Baseline) -> Problem | None:
        return validate_band(rule, baseline, method)

    spending = method == "mean_band"
    return KindSpec(
        name=name,
        params=BandParams,
        check=check_band,
        expected=expected_band,
        reference=reference_spread,
        validate=validate,
        derive_method=method,
        rederive=rederive_band,
        looks="spending" if spending else "at_once",
        information=mean_information if spending else None,
        nominal=mean_nominal if spending else None,
    )

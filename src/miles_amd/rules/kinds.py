"""Every rule kind: what each declares (:class:`KindSpec`) and :data:`KINDS`, the table of them.

A kind is its fields (a :class:`~miles_amd.rules.model.Params`), its check, the sentence
stating its tolerance, the loader's validation, what ``baseline record`` re-derives, and how
it is judged at a look (``at_once``, ``spending`` or ``final``). The statistics are
``miles_amd.rules.bands``'; each kind's derivation and caveats: ``docs/gate-and-statistics.md``.
Pure: no file is read.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from miles_amd import numeric
from miles_amd.evidence.types import Series
from miles_amd.records.job import JobRecord
from miles_amd.rules import bands
from miles_amd.rules.bands import BandParams, log_spread
from miles_amd.rules.check import (
    Check,
    Observed,
    Problem,
    RuleContext,
    Status,
    axis,
    fmt,
    grid,
    listed,
    non_finite_failure,
    passed,
    rule_check,
    step_range,
    steps_text,
)
from miles_amd.rules.model import Baseline, KindName, NoParams, Params, Rule
from miles_amd.rules.spending import upper_tail

LookMode = Literal["at_once", "spending", "final"]


@dataclass(frozen=True)
class KindSpec:
    """One kind (``docs/gate-and-statistics.md``, "Adding a rule kind")."""

    name: KindName
    params: type[Params]
    check: Callable[[Rule, Series, RuleContext], Check]  # on a non-empty series
    expected: Callable[[Rule, Baseline, int], str]  # the tolerance for N rollouts
    reference: Callable[[Rule, Baseline], str] = lambda rule, baseline: "-"  # its data
    validate: Callable[[Rule, Baseline], Problem | None] = lambda rule, baseline: None
    summary: Callable[[Rule, list[float]], dict[str, Any]] | None = None  # baseline record
    rederive: Callable[[Rule, Baseline, int], Mapping[str, Any]] | None = None  # same
    looks: LookMode = "final"  # how the first k rollouts are judged
    # spending: (rule, baseline, k, N) -> information (None: k cannot judge it), and
    # (rule, baseline, N) -> (a side's one-sided rate, sides)
    information: Callable[[Rule, Baseline, int, int], float | None] | None = None
    nominal: Callable[[Rule, Baseline, int], tuple[float, int]] | None = None
    needs_series: bool = True  # False: judged from job.json
    reference_series: bool = False  # needs the reference's per-rollout series
    needs_spread: bool = False  # needs the reference's spread


@dataclass(frozen=True)
class _DropNone(Params):
    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_json().items() if v is not None}


def _metric(rule: Rule) -> str:
    assert rule.metric is not None
    return rule.metric


# --- job_status: job.json's status, the full log fetched, the record consistent -----------


@dataclass(frozen=True)
class JobStatusParams(Params):
    expected_status: str


def _job_status(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    job = ctx.evidence.job
    wanted = JobStatusParams.of(rule).expected_status
    if job is None:
        unreadable = [p for p in ctx.evidence.problems if p.source == "job_json"]
        if unreadable:
            detail = f"job.json unreadable: {unreadable[0].detail}"
            return rule_check(rule, "error", None, wanted, detail)
        if ctx.require_env:
            detail = (
                "not measured: no job.json in the run dir; the hardware path (--require-env) "
                "needs the job's end state; fix: gate the run dir miles-amd train wrote (its "
                "driver writes job.json)"
            )
            return rule_check(rule, "fail", None, wanted, detail)
        status: Status = "fail" if rule.required else "not_measured"
        return rule_check(rule, status, None, wanted, "not measured: no job.json in the run dir")
    detail = f"Ray job {job.job_id} ended {job.status}"
    if job.message:
        detail += f": {' '.join(job.message.split())[:200]}"
    detail += _stopped_by(job)
    if job.final_log_error:
        detail += f"; job.log is partial: {job.final_log_error}"
    contradiction = job.contradiction
    if contradiction is not None:
        detail += f"; job.json contradicts itself: {contradiction}"
    ok = job.status == wanted and not job.final_log_error and contradiction is None
    return rule_check(rule, passed(ok), job.status, wanted, detail)


def _stopped_by(job: JobRecord) -> str:
    if not job.stopped_by:
        return ""
    if job.look is not None:
        look = job.look
        return (
            f"; stopped at the look at rollout {look.rollout}: {look.rule} crossed its "
            f"boundary (α spent {look.alpha_spent:.3g})"
        )
    trip = job.failfast
    if job.stopped_by != "fail-fast" or trip is None:
        return f"; stopped by the driver: {job.stopped_by}"
    where = f" at step {trip['step']}" if trip.get("step") is not None else ""
    latency = job.failfast_latency_s
    after = f", stopped {latency:.1f} s after it appeared" if latency is not None else ""
    return f"; stopped by fail-fast: {trip.get('rule')}{where}{after}"


# --- steps_complete: every step 0..N-1 exactly once ----------------------------------------


def _steps_complete(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    metric = _metric(rule)
    wanted = step_range(metric, ctx.baseline, ctx.rollouts if ctx.look is None else ctx.look)
    counts = Counter(step for step, _ in series)
    missing = [s for s in wanted if s not in counts]
    duplicated = sorted(s for s, c in counts.items() if c > 1)
    unexpected = sorted(s for s in counts if s not in wanted)
    problems = []
    if missing:
        problems.append(f"missing {axis(metric)} {steps_text(missing)}")
    if duplicated:
        problems.append(f"duplicated {listed([f'{s} ({counts[s]}x)' for s in duplicated])}")
    if unexpected:
        problems.append(f"unexpected {steps_text(unexpected)}")
    steps = sorted(counts)
    observed = f"{len(series)} points at {len(steps)} steps" + (
        f" ({steps[0]}..{steps[-1]})" if steps else ""
    )
    detail = "; ".join(problems) if problems else f"every {axis(metric)} once"
    return rule_check(
        rule,
        passed(not problems),
        observed,
        _steps_expected(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(duplicated + unexpected),
        numbers={"missing": len(missing), "duplicated": len(duplicated)},
    )


def _steps_expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    metric = _metric(rule)
    return f"{axis(metric)} 0..{step_range(metric, baseline, rollouts)[-1]}, each once"


# --- finite: no NaN/inf ------------------------------------------------------------------------


def _finite(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    metric = _metric(rule)
    bad = [(s, v) for s, v in series if not math.isfinite(v)]
    shown = [f"{ctx.where(metric, s)}: {fmt(v)}" for s, v in bad]
    detail = f"non-finite {metric} at {listed(shown)}" if bad else "every value finite"
    observed = f"{len(bad)} non-finite of {len(series)}"
    return _pointwise(rule, bad, observed, "every value finite", detail, {"non_finite": len(bad)})


def _pointwise(
    rule: Rule,
    bad: list[tuple[int, float]],
    observed: Observed,
    expected: str,
    detail: str,
    numbers: dict[str, float],
) -> Check:
    """A check that fails at each point in ``bad``."""
    failing = tuple(s for s, _ in bad)
    return rule_check(
        rule, passed(not bad), observed, expected, detail, failing_steps=failing, numbers=numbers
    )


# --- all_below: no value above the spike threshold; NaN counts as not below -----------------

THRESHOLD_MAX_RATIO = 20.0  # a spike threshold is at most 20x the reference's largest value


@dataclass(frozen=True)
class ThresholdParams(Params):
    threshold: float


def _all_below(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    metric = _metric(rule)
    threshold = _threshold(rule)
    above = [(s, v) for s, v in series if v > threshold]
    nan = [(s, v) for s, v in series if math.isnan(v)]
    parts = []
    if above:
        shown = [f"{ctx.where(metric, s)} ({fmt(v)})" for s, v in above]
        parts.append(f"{len(above)} spike(s) above {threshold:g}: {listed(shown)}")
    if nan:
        parts.append(f"NaN at {listed([ctx.where(metric, s) for s, _ in nan])}")
    if not parts:
        top = max(series, key=lambda p: p[1])
        parts.append(
            f"0 spikes above {threshold:g}; max {fmt(top[1])} at {ctx.where(metric, top[0])}"
        )
    top_finite = max((v for _, v in series if math.isfinite(v)), default=math.nan)
    numbers = {"spikes": len(above), "max": top_finite, "threshold": threshold}
    expected = f"0 values above {threshold:g}"
    return _pointwise(rule, above + nan, len(above), expected, "; ".join(parts), numbers)


def _all_below_valid(rule: Rule, baseline: Baseline) -> Problem | None:
    """Above the reference's max (it passes its own rule), at most THRESHOLD_MAX_RATIO x it."""
    threshold = _threshold(rule)
    top = baseline.reference_max(_metric(rule))
    if top is None or top <= 0:
        return (
            ".metric",
            f"no positive reference max of {rule.metric} to bound the threshold",
            "add the reference's series, or a summary with its max",
        )
    if not top < threshold <= THRESHOLD_MAX_RATIO * top:
        return (
            ".threshold",
            f"threshold {threshold:g} outside its sane range ({top:g}, "
            f"{THRESHOLD_MAX_RATIO * top:g}]: above the reference's max {top:g} (the reference "
            f"passes its own rule) and at most {THRESHOLD_MAX_RATIO:g}x it",
            "use a spike threshold in that range",
        )
    return None


# --- multiple_of: every value within atol of a multiple of quantum (1/samples) --------------

GRID_ATOL_DIVISOR = 100.0  # a grid's atol is at most 1% of its step


@dataclass(frozen=True)
class GridParams(Params):
    quantum: float
    atol: float


def _multiple_of(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    metric = _metric(rule)
    p = GridParams.of(rule)

    def on_grid(value: float) -> bool:
        multiple = value / p.quantum
        if not math.isfinite(multiple):  # NaN, inf, or a finite value too large to divide
            return False
        return abs(value - round(multiple) * p.quantum) <= p.atol

    off = [(s, v) for s, v in series if not on_grid(v)]
    step = grid(p.quantum)
    detail = f"every value a multiple of {step} (±{p.atol:g})"
    if off:
        shown = [f"{ctx.where(metric, s)}: {fmt(v)} = {fmt(v / p.quantum)}·{step}" for s, v in off]
        detail = f"{len(off)} value(s) off the {step} grid: {listed(shown)}"
    observed = f"{len(series) - len(off)}/{len(series)} on grid"
    return _pointwise(rule, off, observed, _grid_text(p), detail, {"off_grid": len(off)})


def _grid_text(p: GridParams) -> str:
    return f"multiples of {grid(p.quantum)} (±{p.atol:g})"


def _multiple_of_valid(rule: Rule, baseline: Baseline) -> Problem | None:
    p = GridParams.of(rule)
    samples = baseline.run_shape.samples_per_rollout
    if not math.isclose(p.quantum, 1.0 / samples, rel_tol=1e-12):
        return (
            ".quantum",
            f"quantum {p.quantum:g} is not 1/{samples} (a fraction over "
            f"run_shape.samples_per_rollout = {samples} samples)",
            f"set it to {1.0 / samples!r}",
        )
    limit = p.quantum / GRID_ATOL_DIVISOR
    if p.atol > limit:
        return (
            ".atol",
            f"atol {p.atol:g} exceeds 1/{GRID_ATOL_DIVISOR:g} of the grid step "
            f"({limit:.4g}); it only absorbs float rounding, and at half a step every "
            "value is on the grid",
            f"use an atol of at most {limit:.4g}",
        )
    return None


# --- near_zero: every |value| <= atol, half the smallest per-token rate -------------------


@dataclass(frozen=True)
class AtolParams(Params):
    atol: float


def _near_zero(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    metric = _metric(rule)
    atol = AtolParams.of(rule).atol
    bad = [(s, v) for s, v in series if not abs(v) <= atol]
    magnitudes = [abs(v) for _, v in series]
    worst = math.nan if any(math.isnan(m) for m in magnitudes) else max(magnitudes)
    detail = f"every |value| ≤ {atol:g}"
    if bad:
        shown = [f"{ctx.where(metric, s)} ({fmt(v)})" for s, v in bad]
        detail = f"{len(bad)} value(s) beyond ±{atol:g}: {listed(shown)}"
    numbers = {"max_abs": worst, "atol": atol}
    return _pointwise(rule, bad, worst, f"|value| ≤ {atol:g}", detail, numbers)


def _near_zero_valid(rule: Rule, baseline: Baseline) -> Problem | None:
    shape = baseline.run_shape
    one_token = bands.single_token_fraction(shape.samples_per_rollout, shape.max_response_tokens)
    derived, atol = bands.round_outward(one_token / 2, up=False), AtolParams.of(rule).atol
    if math.isclose(atol, derived, rel_tol=1e-12):
        return None
    return (
        ".atol",
        f"atol {atol:g} is not the derived {derived:g} (half of 1/("
        f"{shape.samples_per_rollout} samples x {shape.max_response_tokens} tokens), "
        "rounded down to 4 significant digits)",
        f"set it to {derived!r}",
    )


# --- sd_at_least: the run's sample sd at least the binomial floor -------------------------


@dataclass(frozen=True)
class FloorParams(Params):
    z: float
    floor: float


def floor_for(rule: Rule, baseline: Baseline, rollouts: int) -> float:
    mean = bands.spread_of(baseline, _metric(rule)).mean
    samples = baseline.run_shape.samples_per_rollout
    return bands.binomial_sd_floor(mean, samples, rollouts, FloorParams.of(rule).z)


def _sd_at_least(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    floor = floor_for(rule, ctx.baseline, ctx.rollouts)
    wanted = f"sd ≥ {floor:.4g}"
    undefined = non_finite_failure(rule, series, wanted, "spread")
    if undefined is not None:
        return undefined
    values = [v for _, v in series]
    sd = numeric.stdev(values)
    detail = (
        f"sd {fmt(sd)} over {len(values)} values ({len(set(values))} distinct); floor {fmt(floor)}"
    )
    if sd < floor:
        detail = f"too little spread: {detail}"
    numbers = {"sd": sd, "floor": floor}
    return rule_check(rule, passed(sd >= floor), sd, wanted, detail, numbers=numbers)


def _sd_at_least_valid(rule: Rule, baseline: Baseline) -> Problem | None:
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


def _sd_at_least_reference(rule: Rule, baseline: Baseline) -> str:
    mean = bands.spread_of(baseline, _metric(rule)).mean
    return f"mean {mean:.6g} over {baseline.run_shape.samples_per_rollout} samples a rollout"


# --- mean_within / max_within: the band derived for N rollouts ------------------------------

COVER_MAX_WIDENING = 2.0


def _band(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    name, stat = ("mean", numeric.mean) if rule.kind == "mean_within" else ("max", max)
    n_band = ctx.rollouts if ctx.look is None else ctx.look
    if name == "mean" and ctx.limit is not None:
        band = bands.band_for(rule, ctx.baseline, n_band, z=ctx.limit)
    else:  # a max bound is the whole run's at every look: what exceeds it now fails the run
        band, n_band = bands.band_for(rule, ctx.baseline, ctx.rollouts), ctx.rollouts
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


def _band_reference(rule: Rule, baseline: Baseline) -> str:
    derive = BandParams.of(rule).derive
    spread = bands.spread_of(baseline, _metric(rule))
    cover = ", ".join(f"{c:.6g}" for c in derive.cover)
    text = (
        f"mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"k {derive.k:.6g}, cover [{cover}]"
    )
    if derive.run_sd or derive.rho:
        text += f", run_sd {derive.run_sd:.6g}, rho {derive.rho:.6g}"
    top = baseline.reference_max(_metric(rule)) if rule.kind == "max_within" else None
    return text + (f", max {top:.6g}" if top is not None else "")


def _band_valid(rule: Rule, baseline: Baseline) -> Problem | None:
    method = "mean_band" if rule.kind == "mean_within" else "max_band"
    params = BandParams.of(rule)
    derive = params.derive
    if derive.method != method:
        wrong = f"{rule.kind} takes method {method}, not {derive.method}"
        return (".derive.method", wrong, f"set it to {method}")
    n = baseline.run_shape.rollouts
    try:
        spread = bands.spread_of(baseline, _metric(rule))
        derived = bands.band_for(rule, baseline, n)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot derive the band of {rule.metric}: {exc}",
            "add a series, or a summary with sd, min/max or bounds",
        )
    if method == "mean_band":
        reach = bands.mean_half_width(spread, n, derive.k, derive.run_sd, derive.rho)
    else:
        reach = bands.max_reach(spread, n, derive.k, derive.run_sd)
    for cover in derive.cover:
        if abs(cover - spread.mean) > COVER_MAX_WIDENING * reach:
            return (
                ".derive.cover",
                f"cover {cover:g} is {abs(cover - spread.mean):.4g} from the centre "
                f"{spread.mean:.6g}, beyond {COVER_MAX_WIDENING:g}x the derived reach "
                f"{reach:.4g}",
                "cover only another run of the same recipe, or drop the value",
            )
    written = params.band
    if not (_same(derived.low, written.low) and _same(derived.high, written.high)):
        return (
            ".band",
            f"band {{low: {written.low}, high: {written.high}}} is not the derived one",
            f"set it to {{low: {derived.low}, high: {derived.high}}} (this module) or change "
            "derive",
        )
    return None


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def _band_rederive(rule: Rule, draft: Baseline, rollouts: int) -> dict[str, Any]:
    return BandParams(bands.band_for(rule, draft, rollouts), BandParams.of(rule).derive).to_json()


def _mean_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float:
    derive = BandParams.of(rule).derive
    spread = bands.spread_of(baseline, _metric(rule))
    return 1.0 / bands.mean_half_width(spread, k, 1.0, derive.run_sd, derive.rho) ** 2


def _pool_problem(pool: float, baseline: Baseline, metric: str) -> Problem | None:
    covers = {
        c
        for r in baseline.rules
        if r.kind == "mean_within" and r.metric == metric
        for c in r.params.get("derive", {}).get("cover", ())
    }
    if any(math.isclose(pool, c, rel_tol=1e-12) for c in covers):
        return None
    return (
        ".pool",
        f"pool {pool:g} is no cover value of a mean_within rule on {metric} "
        f"(covers: {sorted(covers)})",
        "pool only the other published run the mean band covers, or drop pool",
    )


# --- paired_mean_diff: rollout i of the run against rollout i of the reference --------------


@dataclass(frozen=True)
class PairedParams(_DropNone):
    z: float
    side: str | None = None  # "both" (the default) or "lower"
    run_sd: float | None = None  # lower: sd of a run-level shift of every prompt's p
    pool: float | None = None  # lower: the other published run's mean on the same prompts


def _paired(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    params = PairedParams.of(rule)
    z = params.z if ctx.limit is None else ctx.limit
    reference = ctx.baseline.series[_metric(rule)]
    counts = Counter(step for step, _ in series)
    pairs = [(s, v, reference[s]) for s, v in series if 0 <= s < len(reference) and counts[s] == 1]
    wanted = _paired_text(params, z)
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
    shape = ctx.baseline.run_shape
    run, ref = [v for _, v, _ in pairs], [r for _, _, r in pairs]
    lower = params.side == "lower"
    try:
        if lower:  # the paired reference values first, then the rest: all of it gives m and v_p
            paired = {s for s, _, _ in pairs}
            ref += [v for s, v in enumerate(reference) if s not in paired]
            effect = bands.paired_drop(
                run,
                ref,
                samples_per_rollout=shape.samples_per_rollout,
                groups=shape.prompts_per_rollout,
                run_sd=params.run_sd or 0.0,
                pool=params.pool,
            )
        else:
            effect = bands.paired_effect(run, ref, samples_per_rollout=shape.samples_per_rollout)
    except OverflowError:
        detail = "paired effect undefined: the values are too large to difference in floats"
        return rule_check(rule, "fail", math.nan, wanted, detail)
    ok = effect.mean_diff >= -z * effect.se if lower else abs(effect.mean_diff) <= z * effect.se
    observed_sd = "n/a" if effect.sd_observed is None else f"{effect.sd_observed:.4f}"
    detail = (
        f"Δ = {effect.mean_diff:+.3g} ± {effect.se:.3g} (SE) over {effect.n} rollouts paired "
        f"with {ctx.baseline.run_id}, {effect.z:+.2f} SE; sd of differences {observed_sd}, "
        f"binomial floor {effect.sd_binomial_floor:.4f}"
    )
    numbers = {"mean_diff": effect.mean_diff, "se": effect.se, "n": effect.n, "z": effect.z}
    return rule_check(
        rule, passed(ok), effect.mean_diff, wanted, detail, numbers={**numbers, "z_max": z}
    )


def _paired_text(params: PairedParams, z: float) -> str:
    if params.side == "lower":
        pooled = f", reference pooled with {params.pool:g}" if params.pool is not None else ""
        return f"mean paired Δ ≥ -{z:g} SE (binomial SE{pooled})"
    return f"|mean paired Δ| ≤ {z:g} SE"


def _paired_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float:
    params = PairedParams.of(rule)
    reference = baseline.series[_metric(rule)]
    k = min(k, len(reference))  # rollouts beyond the reference's pair with nothing
    if params.side != "lower":
        return float(k)
    shape = baseline.run_shape
    return 1.0 / bands.paired_drop_variance(
        reference,
        k,
        samples_per_rollout=shape.samples_per_rollout,
        groups=shape.prompts_per_rollout,
        run_sd=params.run_sd or 0.0,
        pool=params.pool,
    )


def _paired_valid(rule: Rule, baseline: Baseline) -> Problem | None:
    metric = _metric(rule)
    if metric not in baseline.series:
        return (
            ".metric",
            f"paired comparison needs a per-rollout series of {metric}",
            "add it to evidence.series or drop the rule",
        )
    params = PairedParams.of(rule)
    if params.side != "lower" and (params.pool is not None or params.run_sd is not None):
        return (".side", "pool and run_sd apply to side lower only", "set side to lower")
    return None if params.pool is None else _pool_problem(params.pool, baseline, metric)


# --- no_rising_trend: Mann-Kendall Z (one-sided, Hamed-Rao for AR(1)) at most z -------------

MIN_VALUES = 4  # judged at a look of at least this many rollouts


@dataclass(frozen=True)
class TrendParams(_DropNone):
    z: float
    rho: float | None = None


def hamed_rao_factor(n: int, rho: float) -> float:
    """Hamed & Rao's (1998) inflation of Mann-Kendall's ``Var S`` for AR(1) ``rho``."""
    if n < 4 or rho == 0.0:
        return 1.0
    total = math.fsum(
        (n - k) * (n - k - 1) * (n - k - 2) * (6 / math.pi) * math.asin(rho**k / 2)
        for k in range(1, n - 2)
    )
    return 1.0 + 2.0 * total / (n * (n - 1) * (n - 2))


def mann_kendall_s(values: Sequence[float]) -> int:
    """Pairs that rose minus pairs that fell."""
    return sum(
        int(later > earlier) - int(later < earlier)
        for i, earlier in enumerate(values)
        for later in values[i + 1 :]
    )


def mann_kendall_z(values: list[float]) -> float:
    """Continuity- and tie-corrected; 0 below 2 values."""
    n = len(values)
    if n < 2:
        return 0.0
    s = mann_kendall_s(values)
    ties = sum(t * (t - 1) * (2 * t + 5) for t in Counter(values).values() if t > 1)
    var = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var <= 0 or s == 0:
        return 0.0
    return (s - math.copysign(1, s)) / math.sqrt(var)


def theil_sen(steps: list[int], values: list[float]) -> tuple[float, float]:
    """(slope, intercept); by hand: scipy.stats' import would cost the gate 0.4 s."""
    slopes = [
        (values[j] - values[i]) / (steps[j] - steps[i])
        for i in range(len(values))
        for j in range(i + 1, len(values))
        if steps[j] != steps[i]
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median(v - slope * s for s, v in zip(steps, values, strict=True))
    return slope, intercept


def _trend(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    params = TrendParams.of(rule)
    z_max = params.z if ctx.limit is None else ctx.limit
    wanted = _trend_text(z_max, params.rho)
    points = sorted(series)
    undefined = non_finite_failure(rule, points, wanted, "trend")
    if undefined is not None:
        return undefined
    steps, values = [s for s, _ in points], [v for _, v in points]
    z = mann_kendall_z(values) / math.sqrt(hamed_rao_factor(len(values), params.rho or 0.0))
    slope, intercept = theil_sen(steps, values)
    mean = numeric.mean(values)
    relative = f" ({slope / mean:+.2%} of the mean per step)" if mean else ""
    detail = (
        f"Mann-Kendall Z {z:+.2f} over {len(values)} values; Theil-Sen slope "
        f"{fmt(slope)} per step{relative}"
    )
    if z > z_max:
        detail = f"rising trend: {detail}"
    numbers = {"z": z, "z_max": z_max, "slope": slope, "intercept": intercept}
    numbers |= {"first_step": steps[0], "last_step": steps[-1]}
    return rule_check(rule, passed(z <= z_max), z, wanted, detail, numbers=numbers)


def _trend_text(z: float, rho: float | None) -> str:
    if rho:
        return f"Mann-Kendall Z ≤ {z:g} (no rising trend; Hamed-Rao, lag-1 {rho:g})"
    return f"Mann-Kendall Z ≤ {z:g} (no rising trend)"


def _trend_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float | None:
    if k < MIN_VALUES:
        return None
    rho = TrendParams.of(rule).rho or 0.0
    return k * (k - 1) * (2 * k + 5) / 18.0 * hamed_rao_factor(k, rho)


# --- log_mean_within: the mean of logarithms within z SE of the reference's (two-sided) ----


@dataclass(frozen=True)
class LogMeanParams(Params):
    z: float
    rho: float
    run_sd: float


def log_mean_z(
    logs: list[float], spread: bands.Spread, *, run_sd: float, rho: float
) -> tuple[float, float]:
    """(z, its SE) of the mean of ``logs`` against ``spread``, ``sd²`` pooled with the run's."""
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


def _non_positive(
    rule: Rule, series: Sequence[tuple[int, float]], wanted: str, what: str
) -> Check | None:
    zero = [s for s, v in series if v <= 0]
    if not zero:
        return None
    detail = f"{what} undefined: non-positive value (no logarithm) at {steps_text(zero)}"
    return rule_check(rule, "fail", math.nan, wanted, detail, failing_steps=tuple(zero))


def _log_mean(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    params = LogMeanParams.of(rule)
    bound = params.z if ctx.limit is None else ctx.limit
    wanted = _log_mean_text(bound)
    undefined = non_finite_failure(rule, series, wanted, "geometric mean") or _non_positive(
        rule, series, wanted, "geometric mean"
    )
    if undefined is not None:
        return undefined
    spread = log_spread(ctx.baseline, _metric(rule))
    logs = [math.log(v) for _, v in series]
    z, se = log_mean_z(logs, spread, run_sd=params.run_sd, rho=params.rho)
    value = math.exp(math.fsum(logs) / len(logs))
    low, high = math.exp(spread.mean - bound * se), math.exp(spread.mean + bound * se)
    detail = (
        f"geometric mean {fmt(value)} of {len(logs)} values vs reference "
        f"{fmt(math.exp(spread.mean))}: {z:+.2f} SE (limit ±{bound:g}; band for this run's "
        f"spread [{fmt(low)}, {fmt(high)}])"
    )
    numbers = {"value": value, "z": z, "z_max": bound, "low": low, "high": high}
    return rule_check(rule, passed(abs(z) <= bound), value, wanted, detail, numbers=numbers)


def _log_mean_text(bound: float) -> str:
    return f"|log-scale mean shift| ≤ {bound:g} SE (two-sided)"


def _log_mean_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float:
    p = LogMeanParams.of(rule)
    spread = log_spread(baseline, _metric(rule))
    sampling = bands.mean_variance(k, p.rho) + bands.mean_variance(spread.n, p.rho)
    return 1.0 / (spread.sd**2 * sampling + 2 * p.run_sd**2)


def _log_reference(rule: Rule, baseline: Baseline) -> str:
    spread = log_spread(baseline, _metric(rule))
    params = rule.params
    pool = params.get("pool")
    pooled = f", pooled with the other run's mean {pool:g}" if pool else ""
    return (
        f"log-scale mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"rho {params['rho']:g}, run_sd {params['run_sd']:g}{pooled}"
    )


def _log_valid(rule: Rule, baseline: Baseline) -> Problem | None:
    """The reference has a log-scale spread; a ``pool`` is positive and a mean band's cover."""
    metric = _metric(rule)
    try:
        log_spread(baseline, metric)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot take the reference's log-scale spread of {metric}: {exc}",
            "add a positive series, or a summary with a positive min, mean and max",
        )
    pool = rule.params.get("pool")
    if pool is not None and pool <= 0:
        return (".pool", f"pool {pool:g} has no logarithm", "pool a positive mean, or drop pool")
    return None if pool is None else _pool_problem(pool, baseline, metric)


# --- step_rise: the second half of a run rising above its first half (GLS, AR(1)) ---------

MIN_HALF = 2  # rollouts each half needs for a spread


@dataclass(frozen=True)
class StepParams(_DropNone):
    alpha: float
    rho: float
    run_sd: float
    pool: float | None = None  # the other published run's mean (a cover of the mean band)


def reference_level(
    spread: bands.Spread, sd2: float, *, run_sd: float, rho: float, pool: float | None
) -> tuple[float, float]:
    """(level, variance) of the log-scale reference level, ``pool`` averaged in as
    ``ln(pool) - sd²/2``."""
    sampling = sd2 * bands.mean_variance(spread.n, rho)
    if pool is None:
        return spread.mean, sampling + 2 * run_sd**2
    other = math.log(pool) - spread.sd**2 / 2
    return (spread.mean + other) / 2, sampling / 2 + 1.5 * run_sd**2


def _whitened(values: list[float], rho: float) -> list[float]:
    scale = math.sqrt(1.0 - rho * rho)
    return [values[0]] + [(values[t] - rho * values[t - 1]) / scale for t in range(1, len(values))]


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def _normal_equations(
    n: int, c: int, sd2: float, v_ref: float, rho: float
) -> tuple[float, float, float, list[float], list[float]]:
    ones = _whitened([1.0] * n, rho)
    after = _whitened([0.0] * c + [1.0] * (n - c), rho)
    a11 = _dot(ones, ones) / sd2 + 1 / v_ref
    return a11, _dot(ones, after) / sd2, _dot(after, after) / sd2, ones, after


def step_rise_z(
    run: list[float],
    spread: bands.Spread,
    *,
    run_sd: float,
    rho: float,
    pool: float | None = None,
    split: int | None = None,
) -> tuple[float, float, float]:
    """(z, head mean, tail mean) of the GLS step at ``split`` (default ``N // 2``), the
    reference level one more observation of the level (``docs/gate-and-statistics.md``)."""
    n = len(run)
    c = n // 2 if split is None else split
    head = math.fsum(run[:c]) / c
    tail = math.fsum(run[c:]) / (n - c)
    residual = math.fsum((v - head) ** 2 for v in run[:c]) + math.fsum(
        (v - tail) ** 2 for v in run[c:]
    )
    dof_ref = spread.n - 1
    sd2 = (dof_ref * spread.sd**2 + residual) / (dof_ref + n - 2)
    if sd2 <= 0:
        return 0.0, head, tail
    level, v_ref = reference_level(spread, sd2, run_sd=run_sd, rho=rho, pool=pool)
    a11, a12, a22, ones, after = _normal_equations(n, c, sd2, v_ref, rho)
    values = _whitened(run, rho)
    b1 = _dot(ones, values) / sd2 + level / v_ref
    b2 = _dot(after, values) / sd2
    det = a11 * a22 - a12 * a12
    return (a11 * b2 - a12 * b1) / det / math.sqrt(a11 / det), head, tail


def threshold(alpha: float, n_run: int, n_ref: int, rho: float = 0.0) -> float:
    """One-sided t quantile at ``alpha``, the pooled dof times ``(1 - rho²) / (1 + rho²)``."""
    dof = max(1, n_ref - 1 + n_run - 2) * (1 - rho * rho) / (1 + rho * rho)
    return bands.t_quantile(1.0 - alpha, max(1.0, dof))


def _split(metric: str, baseline: Baseline, rollouts: int) -> int:
    return len(step_range(metric, baseline, rollouts)) // 2


def _step_text(limit: float, alpha: float) -> str:
    return f"second-half rise ≤ {limit:.2f} SE (one-sided, α {alpha:.3g})"


def _step_rise(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    metric = _metric(rule)
    params = StepParams.of(rule)
    spread = log_spread(ctx.baseline, metric)
    points = sorted(series)
    p = params.alpha if ctx.limit is None else upper_tail(ctx.limit)
    limit = threshold(p, len(points), spread.n, params.rho)
    wanted = _step_text(limit, p)
    undefined = non_finite_failure(rule, points, wanted, "step")
    if undefined is not None:
        return undefined
    values = [v for _, v in points]
    c = _split(metric, ctx.baseline, ctx.rollouts)
    if c < MIN_HALF or len(values) - c < MIN_HALF:
        detail = (
            f"{len(values)} values: too few to compare the halves split at index {c} "
            f"(each needs {MIN_HALF})"
        )
        return rule_check(rule, "pass", None, wanted, detail)
    undefined = _non_positive(rule, points, wanted, "step")
    if undefined is not None:
        return undefined
    logs = [math.log(v) for v in values]
    z, head, tail = step_rise_z(
        logs, spread, run_sd=params.run_sd, rho=params.rho, pool=params.pool, split=c
    )
    head, tail = math.exp(head), math.exp(tail)  # geometric means, for the detail and plot
    split = points[c][0]
    detail = (
        f"second half (from step {split}) geometric mean {fmt(tail)} vs first half {fmt(head)}: "
        f"rise {z:+.2f} SE (limit {limit:.2f})"
    )
    if z > limit:
        detail = f"step up: {detail}"
    numbers = {"z": z, "z_max": limit, "head": head, "tail": tail, "first_step": points[0][0]}
    numbers |= {"split_step": split, "last_step": points[-1][0]}
    return rule_check(rule, passed(z <= limit), z, wanted, detail, numbers=numbers)


def _step_expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    params = StepParams.of(rule)
    n_ref = log_spread(baseline, _metric(rule)).n
    return _step_text(threshold(params.alpha, rollouts, n_ref, params.rho), params.alpha)


def _step_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float | None:
    metric = _metric(rule)
    p = StepParams.of(rule)
    c = _split(metric, baseline, n)
    length = len(step_range(metric, baseline, k))
    if c < MIN_HALF or length - c < MIN_HALF:
        return None
    spread = log_spread(baseline, metric)
    sd2 = spread.sd**2
    _, v_ref = reference_level(spread, sd2, run_sd=p.run_sd, rho=p.rho, pool=p.pool)
    a11, a12, a22, _, _ = _normal_equations(length, c, sd2, v_ref, p.rho)
    return (a11 * a22 - a12 * a12) / a11


def _z_rate(rule: Rule) -> float:
    return upper_tail(BandParams.of(rule).derive.k if "derive" in rule.params else rule.params["z"])


def _sides(sides: int) -> Callable[[Rule, Baseline, int], tuple[float, int]]:
    return lambda rule, baseline, rollouts: (_z_rate(rule), sides)


def _band_spec(name: str, spending: bool) -> KindSpec:
    return KindSpec(
        name, BandParams, _band, lambda r, b, n: bands.band_for(r, b, n).describe(),
        reference=_band_reference, validate=_band_valid, needs_spread=True,
        rederive=_band_rederive, looks="spending" if spending else "at_once",
        information=_mean_information if spending else None,
        nominal=_sides(2) if spending else None,
    )  # fmt: skip


def _threshold(rule: Rule) -> float:
    return ThresholdParams.of(rule).threshold


_SPECS = (
    KindSpec(
        "job_status", JobStatusParams, _job_status,
        lambda r, b, n: JobStatusParams.of(r).expected_status, needs_series=False,
    ),
    KindSpec("steps_complete", NoParams, _steps_complete, _steps_expected, looks="at_once"),
    KindSpec("finite", NoParams, _finite, lambda r, b, n: "every value finite", looks="at_once"),
    KindSpec(
        "all_below", ThresholdParams, _all_below,
        lambda r, b, n: f"0 values above {_threshold(r):g}", validate=_all_below_valid,
        summary=lambda r, vs: {"above_spike_threshold": sum(v > _threshold(r) for v in vs)},
        looks="at_once",
    ),
    KindSpec(
        "multiple_of", GridParams, _multiple_of,
        lambda r, b, n: _grid_text(GridParams.of(r)),
        validate=_multiple_of_valid, looks="at_once",
    ),
    KindSpec(
        "near_zero", AtolParams, _near_zero, lambda r, b, n: f"|value| ≤ {AtolParams.of(r).atol:g}",
        validate=_near_zero_valid, looks="at_once",
    ),
    KindSpec(
        "sd_at_least", FloorParams, _sd_at_least, lambda r, b, n: f"sd ≥ {floor_for(r, b, n):.4g}",
        reference=_sd_at_least_reference, validate=_sd_at_least_valid,
        rederive=lambda rule, draft, rollouts: {"floor": floor_for(rule, draft, rollouts)},
    ),
    _band_spec("mean_within", spending=True),
    _band_spec("max_within", spending=False),
    KindSpec(
        "paired_mean_diff", PairedParams, _paired,
        lambda r, b, n: _paired_text(PairedParams.of(r), PairedParams.of(r).z),
        reference=lambda rule, baseline: (
            f"series of {len(baseline.series[_metric(rule)])} rollouts, "
            f"mean {numeric.mean(baseline.series[_metric(rule)]):.6g}"
        ),
        validate=_paired_valid, reference_series=True, looks="spending",
        information=_paired_information,
        nominal=lambda r, b, n: (_z_rate(r), 1 if r.params.get("side") == "lower" else 2),
    ),
    KindSpec(
        "no_rising_trend", TrendParams, _trend,
        lambda r, b, n: _trend_text(TrendParams.of(r).z, TrendParams.of(r).rho),
        looks="spending", information=_trend_information, nominal=_sides(1),
    ),
    KindSpec(
        "log_mean_within", LogMeanParams, _log_mean,
        lambda r, b, n: _log_mean_text(LogMeanParams.of(r).z), reference=_log_reference,
        validate=_log_valid, needs_spread=True, looks="spending",
        information=_log_mean_information, nominal=_sides(2),
    ),
    KindSpec(
        "step_rise", StepParams, _step_rise, _step_expected, reference=_log_reference,
        validate=_log_valid, needs_spread=True, looks="spending", information=_step_information,
        nominal=lambda r, b, n: (StepParams.of(r).alpha, 1),
    ),
)  # fmt: skip
KINDS: Mapping[KindName, KindSpec] = {s.name: s for s in sorted(_SPECS, key=lambda s: s.name)}

"""The acceptance gate: one run's evidence + a baseline -> checks -> a verdict.

Pure and read-only: :func:`judge` takes a :class:`~miles_amd.evidence.types.RunEvidence` (already
read by ``miles_amd.evidence``) and a :class:`~miles_amd.baseline.model.Baseline` and
returns a
:class:`Verdict`; it opens no file. Writing the report is ``miles_amd.report.report``'s job.

What is judged, in this order:

1. **Evidence** (built in, always required): every source read cleanly (``evidence.readable``:
   a corrupt or truncated event file, bad JSON, an unreadable job.json is a failed check
   naming the file, never silently skipped), and the sources agree (``evidence.consistent``:
   two sources with different values for one metric at one step fail). Both make the verdict
   ``fail`` (exit 1), not ``error``: the run is not accepted, and the other checks still run
   on what was read. ``error`` (exit 2) is kept for evidence that is not there at all.
2. **Sentinels**: each ``fatal`` hit of ``job.log`` is a failed check naming the sentinel,
   its count and first line. ``known`` hits never fail; the report lists every hit.
3. **Baseline rules**, each with its tolerance from the baseline file:

   - ``job_status``: job.json's status equals the expected one (``SUCCEEDED``).
   - ``steps_complete``: the metric has every step ``0..N-1`` exactly once. ``N`` is the
     expected rollout count (``expected_rollouts``, default the baseline's) for ``rollout/*``
     and ``perf/*`` metrics (logged at ``rollout/step``) and that times
     ``train_steps_per_rollout`` for ``train/*`` metrics (logged at ``train/step``).
   - ``finite``: no NaN/inf value; names metric and step.
   - ``all_below``: no value above the threshold (the spike rule); counts the spikes and
     names each rollout. NaN counts as not below.
   - ``mean_within`` / ``max_within``: the mean / max lies in the band the baseline derives
     for ``N`` rollouts (``Baseline.band_for``).
   - ``multiple_of``: every value is within ``atol`` of a multiple of ``quantum``.
   - ``near_zero``: every ``|value| <= atol``.
   - ``paired_mean_diff``: the mean per-rollout difference to the baseline's series, over the
     rollouts both have, is within ``z`` standard errors
     (``miles_amd.baseline.bands.paired_effect``).

   A rule whose metric has no series is ``not_measured`` when optional and ``fail`` with
   "not measured" when required: a missing metric is never a pass. No rule demands a reward
   trend.

Verdict: ``error`` when nothing at all was readable (no metric, no job.json, no sentinel
hit); else ``fail`` when any check is ``fail`` or ``error``; else ``pass``.

:func:`hard_failures` is the fail-fast subset for a watcher on a partial run: it applies the
very same rule functions (``all_below``, ``finite``, fatal sentinels) to whatever has been
read so far and returns only the checks that already failed; a partial run can still pass
every other rule later, but not these.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from miles_amd.baseline.bands import paired_effect
from miles_amd.baseline.model import Baseline, Rule
from miles_amd.evidence.types import Conflict, RunEvidence, SentinelHit, Series, SourceProblem

Status = Literal["pass", "fail", "not_measured", "error"]
VerdictName = Literal["pass", "fail", "error"]

EXIT_CODES: Mapping[VerdictName, int] = {"pass": 0, "fail": 1, "error": 2}
_LIST_LIMIT = 8  # steps/problems named in one detail line before "... (N more)"


@dataclass(frozen=True)
class Check:
    """The outcome of one rule on one run."""

    name: str
    kind: str
    metric: str | None
    required: bool
    status: Status
    observed: float | int | str | None
    expected: str
    detail: str
    rationale: str = ""
    failing_steps: tuple[int, ...] = ()  # steps to mark on the plot
    numbers: Mapping[str, float] = field(default_factory=dict)  # structured figures

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for one run against one baseline."""

    verdict: VerdictName
    reason: str
    run_dir: str
    baseline_name: str
    baseline_path: str
    baseline_run_id: str
    expected_rollouts: int
    checks: tuple[Check, ...]
    sentinels: tuple[SentinelHit, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[SourceProblem, ...] = ()
    conflicts: tuple[Conflict, ...] = ()

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.failed)


@dataclass(frozen=True)
class RuleContext:
    """What a rule function needs besides its series: the evidence, baseline and rollout count."""

    evidence: RunEvidence
    baseline: Baseline
    rollouts: int

    def axis(self, metric: str) -> str:
        return "train/step" if metric.startswith("train/") else "rollout/step"

    def expected_steps(self, metric: str) -> range:
        per_rollout = self.baseline.run_shape.train_steps_per_rollout
        if metric.startswith("train/"):
            return range(self.rollouts * per_rollout)
        return range(self.rollouts)

    def where(self, metric: str, step: int) -> str:
        """Name a point by its rollout: ``rollout 3`` (and its train step when they differ)."""
        per_rollout = self.baseline.run_shape.train_steps_per_rollout
        if metric.startswith("train/") and per_rollout != 1:
            return f"rollout {step // per_rollout} (train/step {step})"
        return f"rollout {step}"


# ---------------------------------------------------------------------------- formatting


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LIST_LIMIT])
    if len(items) > _LIST_LIMIT:
        shown += f", ... ({len(items) - _LIST_LIMIT} more)"
    return shown


def _steps_text(steps: Iterable[int]) -> str:
    return _listed([str(s) for s in steps])


def _grid(quantum: float) -> str:
    """``1/64`` for a unit fraction, else the number."""
    inverse = 1 / quantum
    return f"1/{round(inverse)}" if abs(inverse - round(inverse)) < 1e-9 else f"{quantum:g}"


def _check(rule: Rule, status: Status, observed, expected: str, detail: str, **extra) -> Check:
    return Check(
        name=rule.id,
        kind=rule.kind,
        metric=rule.metric,
        required=rule.required,
        status=status,
        observed=observed,
        expected=expected,
        detail=detail,
        rationale=rule.rationale,
        **extra,
    )


def _passed(ok: bool) -> Status:
    return "pass" if ok else "fail"


# ---------------------------------------------------------------------------- rule functions
# Each takes the rule, the metric's non-empty series and the context, and returns one Check.


def check_steps_complete(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    expected = ctx.expected_steps(rule.metric)
    counts = Counter(step for step, _ in series)
    missing = [s for s in expected if s not in counts]
    duplicated = sorted(s for s, c in counts.items() if c > 1)
    unexpected = sorted(s for s in counts if s not in expected)
    problems = []
    if missing:
        problems.append(f"missing {ctx.axis(rule.metric)} {_steps_text(missing)}")
    if duplicated:
        shown = [f"{s} ({counts[s]}x)" for s in duplicated]
        problems.append(f"duplicated {_listed(shown)}")
    if unexpected:
        problems.append(f"unexpected {_steps_text(unexpected)}")
    steps = sorted(counts)
    observed = f"{len(series)} points at {len(steps)} steps" + (
        f" ({steps[0]}..{steps[-1]})" if steps else ""
    )
    detail = "; ".join(problems) if problems else f"every {ctx.axis(rule.metric)} once"
    return _check(
        rule,
        _passed(not problems),
        observed,
        _expected_text(rule, ctx),
        detail,
        failing_steps=tuple(duplicated + unexpected),
        numbers={"missing": len(missing), "duplicated": len(duplicated)},
    )


def check_finite(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    bad = [(s, v) for s, v in series if not math.isfinite(v)]
    shown = [f"{ctx.where(rule.metric, s)}: {_fmt(v)}" for s, v in bad]
    detail = f"non-finite {rule.metric} at {_listed(shown)}" if bad else "every value finite"
    return _check(
        rule,
        _passed(not bad),
        f"{len(bad)} non-finite of {len(series)}",
        _expected_text(rule, ctx),
        detail,
        failing_steps=tuple(s for s, _ in bad),
        numbers={"non_finite": len(bad)},
    )


def check_all_below(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.threshold is not None
    threshold = rule.threshold
    above = [(s, v) for s, v in series if v > threshold]
    nan = [(s, v) for s, v in series if math.isnan(v)]
    finite = [v for _, v in series if math.isfinite(v)]
    parts = []
    if above:
        shown = [f"{ctx.where(rule.metric, s)} ({_fmt(v)})" for s, v in above]
        parts.append(f"{len(above)} spike(s) above {threshold:g}: {_listed(shown)}")
    if nan:
        parts.append(f"NaN at {_listed([ctx.where(rule.metric, s) for s, _ in nan])}")
    if not parts:
        top = max(series, key=lambda p: p[1])
        parts.append(
            f"0 spikes above {threshold:g}; max {_fmt(top[1])} at {ctx.where(rule.metric, top[0])}"
        )
    return _check(
        rule,
        _passed(not above and not nan),
        len(above),
        _expected_text(rule, ctx),
        "; ".join(parts),
        failing_steps=tuple(s for s, _ in above + nan),
        numbers={
            "spikes": len(above),
            "max": max(finite) if finite else math.nan,
            "threshold": threshold,
        },
    )


def _statistic_check(
    rule: Rule, series: Series, ctx: RuleContext, name: str, stat: Callable[[list[float]], float]
) -> Check:
    band = ctx.baseline.band_for(rule, ctx.rollouts)
    values = [v for _, v in series]
    bad = [(s, v) for s, v in series if not math.isfinite(v)]
    value = math.nan if bad else stat(values)
    ok = band.contains(value)
    detail = f"{name} {_fmt(value)} of {len(values)} values; band for {ctx.rollouts} rollouts"
    if bad:
        detail = f"{name} undefined: non-finite at {_steps_text([s for s, _ in bad])}"
    elif not ok:
        detail = f"{name} {_fmt(value)} outside {band.describe()} ({len(values)} values)"
    failing: tuple[int, ...] = tuple(s for s, _ in bad)
    if rule.kind == "max_within" and not ok and not bad:
        failing = tuple(s for s, v in series if not band.contains(v))
    numbers = {"value": value}
    if band.low is not None:
        numbers["low"] = band.low
    if band.high is not None:
        numbers["high"] = band.high
    return _check(
        rule,
        _passed(ok),
        value,
        band.describe(),
        detail,
        failing_steps=failing,
        numbers=numbers,
    )


def _mean(values: list[float]) -> float:
    """The mean; NaN (in no band) when finite values sum beyond the float range."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.nan


def check_mean_within(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    return _statistic_check(rule, series, ctx, "mean", _mean)


def check_max_within(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    return _statistic_check(rule, series, ctx, "max", max)


def check_multiple_of(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.quantum is not None and rule.atol is not None
    quantum, atol = rule.quantum, rule.atol

    def on_grid(value: float) -> bool:
        multiple = value / quantum
        if not math.isfinite(multiple):  # NaN, inf, or a finite value too large to divide
            return False
        return abs(value - round(multiple) * quantum) <= atol

    off = [(s, v) for s, v in series if not on_grid(v)]
    grid = _grid(quantum)
    if off:
        shown = [
            f"{ctx.where(rule.metric, s)}: {_fmt(v)} = {_fmt(v / quantum)}·{grid}" for s, v in off
        ]
        detail = f"{len(off)} value(s) off the {grid} grid: {_listed(shown)}"
    else:
        detail = f"every value a multiple of {grid} (±{atol:g})"
    return _check(
        rule,
        _passed(not off),
        f"{len(series) - len(off)}/{len(series)} on grid",
        _expected_text(rule, ctx),
        detail,
        failing_steps=tuple(s for s, _ in off),
        numbers={"off_grid": len(off)},
    )


def check_near_zero(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.atol is not None
    atol = rule.atol
    bad = [(s, v) for s, v in series if not abs(v) <= atol]
    magnitudes = [abs(v) for _, v in series]
    worst = math.nan if any(math.isnan(m) for m in magnitudes) else max(magnitudes)
    if bad:
        shown = [f"{ctx.where(rule.metric, s)} ({_fmt(v)})" for s, v in bad]
        detail = f"{len(bad)} value(s) beyond ±{atol:g}: {_listed(shown)}"
    else:
        detail = f"every |value| ≤ {atol:g}"
    return _check(
        rule,
        _passed(not bad),
        worst,
        _expected_text(rule, ctx),
        detail,
        failing_steps=tuple(s for s, _ in bad),
        numbers={"max_abs": worst, "atol": atol},
    )


def check_paired_mean_diff(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.z is not None
    reference = ctx.baseline.series[rule.metric]
    counts = Counter(step for step, _ in series)
    pairs = [(s, v, reference[s]) for s, v in series if 0 <= s < len(reference) and counts[s] == 1]
    run_id = ctx.baseline.run_id
    expected = _expected_text(rule, ctx)
    if not pairs:
        return _check(
            rule,
            "fail" if rule.required else "not_measured",
            None,
            expected,
            f"not measured: no rollout of the run pairs with {run_id}'s rollouts "
            f"0..{len(reference) - 1}",
        )
    bad = [s for s, v, _ in pairs if not math.isfinite(v)]
    if bad:
        return _check(
            rule,
            "fail",
            math.nan,
            expected,
            f"paired effect undefined: non-finite at rollout {_steps_text(bad)}",
            failing_steps=tuple(bad),
        )
    try:
        effect = paired_effect(
            [v for _, v, _ in pairs],
            [r for _, _, r in pairs],
            samples_per_rollout=ctx.baseline.run_shape.samples_per_rollout,
        )
    except OverflowError:
        detail = "paired effect undefined: the values are too large to difference in floats"
        return _check(rule, "fail", math.nan, expected, detail)
    ok = abs(effect.mean_diff) <= rule.z * effect.se
    observed_sd = "n/a" if effect.sd_observed is None else f"{effect.sd_observed:.4f}"
    detail = (
        f"Δ = {effect.mean_diff:+.3g} ± {effect.se:.3g} (SE) over {effect.n} rollouts paired "
        f"with {run_id}, {effect.z:+.2f} SE; sd of differences {observed_sd}, binomial floor "
        f"{effect.sd_binomial_floor:.4f}"
    )
    return _check(
        rule,
        _passed(ok),
        effect.mean_diff,
        expected,
        detail,
        numbers={
            "mean_diff": effect.mean_diff,
            "se": effect.se,
            "n": effect.n,
            "z": effect.z,
            "z_max": rule.z,
        },
    )


_METRIC_RULES: Mapping[str, Callable[[Rule, Series, RuleContext], Check]] = {
    "steps_complete": check_steps_complete,
    "finite": check_finite,
    "all_below": check_all_below,
    "mean_within": check_mean_within,
    "max_within": check_max_within,
    "multiple_of": check_multiple_of,
    "near_zero": check_near_zero,
    "paired_mean_diff": check_paired_mean_diff,
}

# The rules that can fire on a partial run and mean the run is already lost.
_HARD_KINDS = ("all_below", "finite")


def check_job_status(rule: Rule, ctx: RuleContext) -> Check:
    job = ctx.evidence.job
    expected = rule.expected_status or "SUCCEEDED"
    if job is None:
        unreadable = [p for p in ctx.evidence.problems if p.source == "job_json"]
        if unreadable:
            return _check(
                rule, "error", None, expected, f"job.json unreadable: {unreadable[0].detail}"
            )
        status: Status = "fail" if rule.required else "not_measured"
        return _check(rule, status, None, expected, "not measured: no job.json in the run dir")
    detail = f"Ray job {job.job_id} ended {job.status}"
    if job.message:
        detail += f": {' '.join(job.message.split())[:200]}"
    detail += _stopped_by(job.extra)
    return _check(rule, _passed(job.status == expected), job.status, expected, detail)


def _stopped_by(extra: Mapping[str, object]) -> str:
    """The driver's note on why it stopped the job (job.json ``stopped_by``/``failfast``)."""
    stopped_by = extra.get("stopped_by")
    if not stopped_by:
        return ""
    trip = extra.get("failfast")
    if stopped_by != "fail-fast" or not isinstance(trip, Mapping):
        return f"; stopped by the driver: {stopped_by}"
    where = f" at step {trip['step']}" if trip.get("step") is not None else ""
    latency = extra.get("failfast_latency_s")
    after = f", stopped {latency:.1f} s after it appeared" if isinstance(latency, float) else ""
    return f"; stopped by fail-fast: {trip.get('rule')}{where}{after}"


def _not_measured(rule: Rule, ctx: RuleContext) -> Check:
    detail = f"not measured: no {rule.metric} in any source (TensorBoard, CI history, job.log)"
    status: Status = "fail" if rule.required else "not_measured"
    return _check(rule, status, None, _expected_text(rule, ctx), detail)


def _expected_text(rule: Rule, ctx: RuleContext) -> str:
    """The expectation of a rule as a report shows it (the same text the checks use)."""
    assert rule.metric is not None
    if rule.kind in ("mean_within", "max_within"):
        return ctx.baseline.band_for(rule, ctx.rollouts).describe()
    if rule.kind == "steps_complete":
        last = len(ctx.expected_steps(rule.metric)) - 1
        return f"{ctx.axis(rule.metric)} 0..{last}, each once"
    if rule.kind == "all_below":
        return f"0 values above {rule.threshold:g}"
    if rule.kind == "multiple_of":
        return f"multiples of {_grid(rule.quantum or 1.0)} (±{rule.atol:g})"
    if rule.kind == "near_zero":
        return f"|value| ≤ {rule.atol:g}"
    if rule.kind == "paired_mean_diff":
        return f"|Δ| ≤ {rule.z:g} SE"
    return "every value finite"


def evaluate_rule(rule: Rule, ctx: RuleContext) -> Check:
    """Apply one baseline rule to the run; a missing metric is never a pass."""
    if rule.kind == "job_status":
        return check_job_status(rule, ctx)
    assert rule.metric is not None
    series = ctx.evidence.series.get(rule.metric, ())
    if not series:
        return _not_measured(rule, ctx)
    return _METRIC_RULES[rule.kind](rule, series, ctx)


# ---------------------------------------------------------------------------- built-in checks


def evidence_checks(evidence: RunEvidence) -> tuple[Check, Check]:
    """``evidence.readable`` and ``evidence.consistent``; both fail the run, never pass it."""
    problems = [str(p) for p in evidence.problems]
    readable = Check(
        name="evidence.readable",
        kind="evidence",
        metric=None,
        required=True,
        status=_passed(not problems),
        observed=len(problems),
        expected="0 unreadable sources",
        detail=(
            f"{len(problems)} source problem(s): {_listed(problems)}"
            if problems
            else "every source read cleanly"
        ),
        rationale="corrupt, truncated or malformed evidence cannot vouch for the run",
    )
    conflicts = [
        f"{c.metric} at step {c.step}: "
        + ", ".join(f"{src}={_fmt(v)}" for src, v in sorted(c.values.items()))
        for c in evidence.conflicts
    ]
    consistent = Check(
        name="evidence.consistent",
        kind="evidence",
        metric=None,
        required=True,
        status=_passed(not conflicts),
        observed=len(conflicts),
        expected="sources agree",
        detail=(
            f"{len(conflicts)} conflict(s): {_listed(conflicts)}"
            if conflicts
            else "no two sources disagree"
        ),
        rationale="two sources with different values for one step: neither can be trusted",
    )
    return readable, consistent


def sentinel_checks(hits: Iterable[SentinelHit]) -> list[Check]:
    """One failed check per ``fatal`` sentinel; ``known`` hits are reported, never judged."""
    checks = []
    for hit in hits:
        if hit.severity != "fatal":
            continue
        detail = f"{hit.count}x in job.log, first at line {hit.first_line}: {hit.first_text[:200]}"
        if hit.reference:
            detail += f" [{hit.reference}]"
        checks.append(
            Check(
                name=f"sentinel.{hit.name}",
                kind="sentinel",
                metric=None,
                required=True,
                status="fail",
                observed=hit.count,
                expected="absent",
                detail=detail,
                rationale="a fatal log signature: the run is broken whatever its metrics say",
                numbers={"first_line": hit.first_line},
            )
        )
    return checks


# ---------------------------------------------------------------------------- entry points


def _readable(evidence: RunEvidence) -> bool:
    return bool(evidence.series) or evidence.job is not None or bool(evidence.sentinels)


def _reason(verdict: VerdictName, checks: Sequence[Check], evidence: RunEvidence) -> str:
    if verdict == "error":
        why = "; ".join(str(p) for p in evidence.problems[:3]) or "no metrics and no job.json"
        return f"nothing readable in {evidence.run_dir}: {why}"
    failed = [c.name for c in checks if c.failed]
    if failed:
        return f"{len(failed)} check(s) failed: {_listed(failed)}"
    passed = sum(c.status == "pass" for c in checks)
    unmeasured = sum(c.status == "not_measured" for c in checks)
    return f"{passed} checks passed; {unmeasured} optional not measured"


def judge(
    evidence: RunEvidence, baseline: Baseline, *, expected_rollouts: int | None = None
) -> Verdict:
    """Judge a finished run: every built-in check and every baseline rule; see the module doc.

    ``expected_rollouts`` overrides the baseline's rollout count (a 3-rollout smoke, a
    1000-rollout benchmark): it sets the expected steps and rescales the bands.
    """
    rollouts = baseline.run_shape.rollouts if expected_rollouts is None else expected_rollouts
    if rollouts < 1:
        raise ValueError(f"expected_rollouts must be >= 1, got {rollouts}")
    ctx = RuleContext(evidence, baseline, rollouts)
    checks = [*evidence_checks(evidence), *sentinel_checks(evidence.sentinels)]
    checks += [evaluate_rule(rule, ctx) for rule in baseline.rules]
    if not _readable(evidence):
        verdict: VerdictName = "error"
    elif any(c.failed for c in checks):
        verdict = "fail"
    else:
        verdict = "pass"
    return Verdict(
        verdict=verdict,
        reason=_reason(verdict, checks, evidence),
        run_dir=evidence.run_dir,
        baseline_name=baseline.name,
        baseline_path=baseline.path,
        baseline_run_id=baseline.run_id,
        expected_rollouts=rollouts,
        checks=tuple(checks),
        sentinels=tuple(evidence.sentinels),
        sources=dict(evidence.sources),
        problems=tuple(evidence.problems),
        conflicts=tuple(evidence.conflicts),
    )


def hard_failures(evidence: RunEvidence, baseline: Baseline) -> list[Check]:
    """Checks that already failed on a partial run and mean the run is lost.

    A spike above the threshold (names the rollout), a non-finite gated value (names metric
    and step), a fatal sentinel. These are the rule functions :func:`judge` applies
    (``check_all_below``, ``check_finite``, ``sentinel_checks``), applied to what has been
    read so far; a metric not logged yet is no failure here.
    """
    ctx = RuleContext(evidence, baseline, baseline.run_shape.rollouts)
    failed = []
    for rule in baseline.rules:
        if rule.kind not in _HARD_KINDS or rule.metric is None:
            continue
        series = evidence.series.get(rule.metric, ())
        if series:
            check = _METRIC_RULES[rule.kind](rule, series, ctx)
            if check.failed:
                failed.append(check)
    failed += sentinel_checks(evidence.sentinels)
    return failed

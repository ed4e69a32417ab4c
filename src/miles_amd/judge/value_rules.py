"""Rules on the values of one run alone: job status, completeness, finiteness, spikes, grids.

The check, expected-value sentence, plot hint and tolerance validation of the kinds
``job_status``, ``steps_complete``, ``finite``, ``all_below``, ``multiple_of`` and
``near_zero``; :data:`miles_amd.judge.rules.KINDS` declares which function is which, and its
module doc says what each kind judges and why its tolerance is derived or bounded. Pure: no
file is read.
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
    Status,
    axis,
    fmt,
    grid,
    listed,
    passed,
    rule_check,
    step_range,
    steps_text,
)

if TYPE_CHECKING:
    from miles_amd.baseline.model import Baseline, Rule
    from miles_amd.evidence.types import Series
    from miles_amd.run_dir import JobRecord

THRESHOLD_MAX_RATIO = 20.0  # a spike threshold is at most 20x the reference's largest value
GRID_ATOL_DIVISOR = 100.0  # a grid's atol is at most 1% of its step
THRESHOLD_NEAR = 1.5  # a spike threshold is drawn as a line when within 1.5x the run's max


# ---------------------------------------------------------------------------- job_status


def check_job_status(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    job = ctx.evidence.job
    expected = expected_job_status(rule, ctx.baseline, ctx.rollouts)
    if job is None:
        unreadable = [p for p in ctx.evidence.problems if p.source == "job_json"]
        if unreadable:
            detail = f"job.json unreadable: {unreadable[0].detail}"
            return rule_check(rule, "error", None, expected, detail)
        status: Status = "fail" if rule.required else "not_measured"
        return rule_check(rule, status, None, expected, "not measured: no job.json in the run dir")
    detail = f"Ray job {job.job_id} ended {job.status}"
    if job.message:
        detail += f": {' '.join(job.message.split())[:200]}"
    detail += _stopped_by(job)
    return rule_check(
        rule, passed(job.status == rule.expected_status), job.status, expected, detail
    )


def _stopped_by(job: JobRecord) -> str:
    """The driver's note on why it stopped the job (job.json ``stopped_by``/``failfast``)."""
    if not job.stopped_by:
        return ""
    trip = job.failfast
    if job.stopped_by != "fail-fast" or trip is None:
        return f"; stopped by the driver: {job.stopped_by}"
    where = f" at step {trip['step']}" if trip.get("step") is not None else ""
    latency = job.failfast_latency_s
    after = f", stopped {latency:.1f} s after it appeared" if latency is not None else ""
    return f"; stopped by fail-fast: {trip.get('rule')}{where}{after}"


def expected_job_status(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return str(rule.expected_status)


# ---------------------------------------------------------------------------- steps_complete


def check_steps_complete(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    expected = ctx.expected_steps(rule.metric)
    counts = Counter(step for step, _ in series)
    missing = [s for s in expected if s not in counts]
    duplicated = sorted(s for s, c in counts.items() if c > 1)
    unexpected = sorted(s for s in counts if s not in expected)
    problems = []
    if missing:
        problems.append(f"missing {axis(rule.metric)} {steps_text(missing)}")
    if duplicated:
        problems.append(f"duplicated {listed([f'{s} ({counts[s]}x)' for s in duplicated])}")
    if unexpected:
        problems.append(f"unexpected {steps_text(unexpected)}")
    steps = sorted(counts)
    observed = f"{len(series)} points at {len(steps)} steps" + (
        f" ({steps[0]}..{steps[-1]})" if steps else ""
    )
    detail = "; ".join(problems) if problems else f"every {axis(rule.metric)} once"
    return rule_check(
        rule,
        passed(not problems),
        observed,
        expected_steps(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(duplicated + unexpected),
        numbers={"missing": len(missing), "duplicated": len(duplicated)},
    )


def expected_steps(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    assert rule.metric is not None
    steps = step_range(rule.metric, baseline, rollouts)
    return f"{axis(rule.metric)} 0..{steps[-1]}, each once"


# ---------------------------------------------------------------------------- finite


def check_finite(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    bad = [(s, v) for s, v in series if not math.isfinite(v)]
    shown = [f"{ctx.where(rule.metric, s)}: {fmt(v)}" for s, v in bad]
    detail = f"non-finite {rule.metric} at {listed(shown)}" if bad else "every value finite"
    return rule_check(
        rule,
        passed(not bad),
        f"{len(bad)} non-finite of {len(series)}",
        expected_finite(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(s for s, _ in bad),
        numbers={"non_finite": len(bad)},
    )


def expected_finite(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return "every value finite"


# ---------------------------------------------------------------------------- all_below


def check_all_below(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.threshold is not None
    threshold = rule.threshold
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
        expected_threshold(rule, ctx.baseline, ctx.rollouts),
        "; ".join(parts),
        failing_steps=tuple(s for s, _ in above + nan),
        numbers={
            "spikes": len(above),
            "max": max(finite, default=math.nan),
            "threshold": threshold,
        },
    )


def expected_threshold(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"0 values above {rule.threshold:g}"


def plot_threshold(ax: Any, check: Check, finite: list[float]) -> bool:
    """The spike threshold as a line when the data reach near it; else a note at the top.

    A threshold far above every value (0.15 over a healthy 0.015..0.021) would squeeze the
    data into a strip on a linear axis and hide their spread on a log one, so it is named
    instead (a legend entry), with how far above the run's max it lies.
    """
    threshold = check.numbers["threshold"]
    top = max(finite, default=threshold)
    if top <= 0 or threshold <= THRESHOLD_NEAR * top:
        label = f"spike threshold {threshold:g}"
        ax.axhline(threshold, color="darkred", linewidth=1, label=label, gid="threshold")
        return False
    note = f"spike threshold {threshold:g}: off scale, {threshold / top:.1f}x this run's max"
    ax.plot([], [], color="darkred", linewidth=1, label=note, gid="threshold")
    return False


def reference_max(baseline: Baseline, metric: str) -> float | None:
    """The reference run's largest value of ``metric``: its series, else its summary's max."""
    if metric in baseline.series:
        return max(baseline.series[metric])
    top = baseline.summaries.get(metric, {}).get("max")
    return None if top is None else float(top)


def validate_threshold(rule: Rule, baseline: Baseline) -> Problem | None:
    assert rule.metric is not None and rule.threshold is not None
    top = reference_max(baseline, rule.metric)
    if top is None or top <= 0:
        return (
            ".metric",
            f"no positive reference max of {rule.metric} to bound the threshold",
            ("add the reference's series, or a summary with its max"),
        )
    if not top < rule.threshold <= THRESHOLD_MAX_RATIO * top:
        return (
            ".threshold",
            (
                f"threshold {rule.threshold:g} outside its sane range ({top:g}, "
                f"{THRESHOLD_MAX_RATIO * top:g}]: above the reference's max {top:g} (the reference "
                f"passes its own rule) and at most {THRESHOLD_MAX_RATIO:g}x it"
            ),
            "use a spike threshold in that range",
        )
    return None


def spike_summary(rule: Rule, values: list[float]) -> dict[str, Any]:
    assert rule.threshold is not None
    return {"above_spike_threshold": sum(v > rule.threshold for v in values)}


# ---------------------------------------------------------------------------- multiple_of


def check_multiple_of(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.quantum is not None and rule.atol is not None
    quantum, atol = rule.quantum, rule.atol

    def on_grid(value: float) -> bool:
        multiple = value / quantum
        if not math.isfinite(multiple):  # NaN, inf, or a finite value too large to divide
            return False
        return abs(value - round(multiple) * quantum) <= atol

    off = [(s, v) for s, v in series if not on_grid(v)]
    step = grid(quantum)
    if off:
        shown = [
            f"{ctx.where(rule.metric, s)}: {fmt(v)} = {fmt(v / quantum)}·{step}" for s, v in off
        ]
        detail = f"{len(off)} value(s) off the {step} grid: {listed(shown)}"
    else:
        detail = f"every value a multiple of {step} (±{atol:g})"
    return rule_check(
        rule,
        passed(not off),
        f"{len(series) - len(off)}/{len(series)} on grid",
        expected_grid(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(s for s, _ in off),
        numbers={"off_grid": len(off)},
    )


def expected_grid(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    assert rule.quantum is not None and rule.atol is not None
    return f"multiples of {grid(rule.quantum)} (±{rule.atol:g})"


def validate_grid(rule: Rule, baseline: Baseline) -> Problem | None:
    """``quantum`` is derived (1/samples_per_rollout); ``atol`` at most 1% of it."""
    assert rule.quantum is not None and rule.atol is not None
    samples = baseline.run_shape.samples_per_rollout
    if not math.isclose(rule.quantum, 1.0 / samples, rel_tol=1e-12):
        return (
            ".quantum",
            (
                f"quantum {rule.quantum:g} is not 1/{samples} (a fraction over "
                f"run_shape.samples_per_rollout = {samples} samples)"
            ),
            f"set it to {1.0 / samples!r}",
        )
    limit = rule.quantum / GRID_ATOL_DIVISOR
    if rule.atol > limit:
        return (
            ".atol",
            (
                f"atol {rule.atol:g} exceeds 1/{GRID_ATOL_DIVISOR:g} of the grid step "
                f"({limit:.4g}); it only absorbs float rounding, and at half a step every "
                "value is on the grid"
            ),
            f"use an atol of at most {limit:.4g}",
        )
    return None


# ---------------------------------------------------------------------------- near_zero


def check_near_zero(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None and rule.atol is not None
    atol = rule.atol
    bad = [(s, v) for s, v in series if not abs(v) <= atol]
    magnitudes = [abs(v) for _, v in series]
    worst = math.nan if any(math.isnan(m) for m in magnitudes) else max(magnitudes)
    if bad:
        shown = [f"{ctx.where(rule.metric, s)} ({fmt(v)})" for s, v in bad]
        detail = f"{len(bad)} value(s) beyond ±{atol:g}: {listed(shown)}"
    else:
        detail = f"every |value| ≤ {atol:g}"
    return rule_check(
        rule,
        passed(not bad),
        worst,
        expected_near_zero(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(s for s, _ in bad),
        numbers={"max_abs": worst, "atol": atol},
    )


def expected_near_zero(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"|value| ≤ {rule.atol:g}"


def plot_near_zero(ax: Any, check: Check, finite: list[float]) -> bool:
    atol = check.numbers["atol"]
    ax.axhspan(-atol, atol, color="tab:green", alpha=0.3, label=f"|value| ≤ {atol:g}")
    return False


def near_zero_atol(baseline: Baseline) -> float:
    """Half the smallest per-token rate one token makes, rounded down to 4 digits."""
    shape = baseline.run_shape
    one_token = bands.single_token_fraction(shape.samples_per_rollout, shape.max_response_tokens)
    return bands.round_outward(one_token / 2, up=False)


def validate_near_zero(rule: Rule, baseline: Baseline) -> Problem | None:
    derived = near_zero_atol(baseline)
    if rule.atol is None or not math.isclose(rule.atol, derived, rel_tol=1e-12):
        shape = baseline.run_shape
        return (
            ".atol",
            (
                f"atol {rule.atol:g} is not the derived {derived:g} (half of 1/("
                f"{shape.samples_per_rollout} samples x {shape.max_response_tokens} tokens), "
                "rounded down to 4 significant digits)"
            ),
            f"set it to {derived!r}",
        )
    return None

"""The rule registry: every kind of baseline rule, declared once, with all it means.

This is the one place a kind of rule is declared: adding one means writing its functions
(beside their kin in ``value_rules`` or ``band_rules``), one :class:`RuleKind` entry in
:data:`KINDS`, and its name and fields in ``baseline.schema.json`` (a test holds the two
lists equal). Each entry declares:

- ``check``: how a run is judged (the rule, the metric's non-empty series, the context ->
  one :class:`~miles_amd.judge.checks.Check`);
- ``expected``: the one sentence stating the tolerance, shown as a check's ``expected`` by
  the gate and as the rule's tolerance by ``baseline diff`` (both say the same thing);
- ``plot``: the hint drawn on the metric's panel of ``metrics.png`` (a band, a bound, a
  threshold); it returns True to ask for a log y axis;
- ``reference``: the reference data the tolerance is taken from, for ``baseline diff``;
- ``validate``: the loader's check that a tolerance is the one its derivation gives, or lies
  in its declared sane range, so an absurd but self-consistent baseline is refused;
- ``derive_method``: the ``miles_amd.baseline.bands`` method whose band the loader
  re-derives and ``baseline record`` recomputes from the recorded run (None: the tolerance
  does not depend on the reference run's values and is kept as reviewed);
- ``summary``: figures ``baseline record`` adds to the metric's summary;
- ``recorded``: tolerance fields ``baseline record`` re-derives from the recorded run (other
  than a band), e.g. the reward's sd floor from its mean;
- ``hard``: the rule can lose a partial run for good (the watcher's fail-fast set);
- ``reference_series``: the rule needs the reference's per-rollout series (so a recorded
  baseline needs the run's own series of that metric).

What each kind judges, and where its tolerance comes from:

- ``job_status``: job.json's status is ``SUCCEEDED`` (the only value the schema allows).
- ``steps_complete``: every step ``0..N-1`` exactly once (``N`` = rollouts for ``rollout/*``
  and ``perf/*``, times ``train_steps_per_rollout`` for ``train/*``). No tolerance.
- ``finite``: no NaN/inf value. No tolerance.
- ``all_below``: no value above ``threshold`` (the spike rule); NaN counts as not below.
  Bounded: above the reference's largest value, at most 20x it.
- ``mean_within`` / ``max_within``: the mean / max lies in the band derived for ``N``
  rollouts (``Baseline.band_for``); the band is re-derived; ``k``, ``run_sd`` (a run-level
  effect) and ``rho`` (lag-1 autocorrelation) are bounded by the schema; a ``cover`` value
  may stretch the band to at most twice the derived reach.
- ``multiple_of``: every value within ``atol`` of a multiple of ``quantum``; ``quantum`` is
  derived (``1 / samples_per_rollout``), ``atol`` at most 1% of it.
- ``near_zero``: every ``|value| <= atol``; ``atol`` is derived (half the smallest per-token
  rate one token can make, rounded down to 4 significant digits).
- ``no_rising_trend``: the one-sided Mann-Kendall Z of the series, Hamed-Rao corrected for
  the declared lag-1 ``rho``, is at most ``z`` (``miles_amd.judge.trend_rules``); ``z`` and
  ``rho`` are bounded by the schema and calibrated by ``benchmarks/bench_calibration.py``.
- ``step_rise``: the second half's mean rises above a level from the first half and the
  reference by at most the Student t quantile at ``alpha`` (``miles_amd.judge.step_rules``);
  ``alpha``, ``rho`` and ``run_sd`` are bounded by the schema.
- ``sd_at_least``: the run's sample sd is at least ``floor`` (the binomial spread of a 0/1
  reward at its ``Φ(-z)`` quantile, ``miles_amd.baseline.bands.binomial_sd_floor``);
  ``floor`` is derived and re-derived, ``z`` bounded by the schema.
- ``paired_mean_diff``: the mean per-rollout difference to the reference series lies within
  ``z`` standard errors (``miles_amd.baseline.bands.paired_effect``); with ``side: lower``
  only a drop fails, with the exact binomial SE and the reference pooled with ``pool`` (the
  other published run, a cover value of the metric's mean band; ``bands.paired_drop``);
  ``z`` and ``run_sd`` are bounded by the schema.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from miles_amd.judge import band_rules as band
from miles_amd.judge import step_rules as step
from miles_amd.judge import trend_rules as trend
from miles_amd.judge import value_rules as value
from miles_amd.judge.checks import Check, Problem, RuleContext, Status, rule_check

if TYPE_CHECKING:
    from miles_amd.baseline.model import Baseline, Rule
    from miles_amd.evidence.types import Series


def _no_reference(rule: Rule, baseline: Baseline) -> str:
    return "-"


def _nothing_to_validate(rule: Rule, baseline: Baseline) -> Problem | None:
    return None


@dataclass(frozen=True)
class RuleKind:
    """Everything one kind of rule means; see the module doc."""

    check: Callable[[Rule, Series, RuleContext], Check]
    expected: Callable[[Rule, Baseline, int], str]
    plot: Callable[[Any, Check, list[float]], bool] | None = None
    reference: Callable[[Rule, Baseline], str] = _no_reference
    validate: Callable[[Rule, Baseline], Problem | None] = _nothing_to_validate
    derive_method: str | None = None
    summary: Callable[[Rule, list[float]], dict[str, Any]] | None = None
    recorded: Callable[[Rule, Baseline, int], dict[str, Any]] | None = None
    hard: bool = False
    needs_series: bool = True  # False: judged from job.json, not from a metric
    reference_series: bool = False  # compares with the reference's per-rollout series


KINDS: Mapping[str, RuleKind] = {
    "job_status": RuleKind(
        check=value.check_job_status, expected=value.expected_job_status, needs_series=False
    ),
    "steps_complete": RuleKind(check=value.check_steps_complete, expected=value.expected_steps),
    "finite": RuleKind(check=value.check_finite, expected=value.expected_finite, hard=True),
    "all_below": RuleKind(
        check=value.check_all_below,
        expected=value.expected_threshold,
        plot=value.plot_threshold,
        validate=value.validate_threshold,
        summary=value.spike_summary,
        hard=True,
    ),
    "mean_within": RuleKind(
        check=band.check_band,
        expected=band.expected_band,
        plot=band.plot_mean_band,
        reference=band.reference_spread,
        validate=band.validate_band,
        derive_method="mean_band",
    ),
    "max_within": RuleKind(
        check=band.check_band,
        expected=band.expected_band,
        plot=band.plot_max_bound,
        reference=band.reference_spread,
        validate=band.validate_band,
        derive_method="max_band",
    ),
    "multiple_of": RuleKind(
        check=value.check_multiple_of, expected=value.expected_grid, validate=value.validate_grid
    ),
    "near_zero": RuleKind(
        check=value.check_near_zero,
        expected=value.expected_near_zero,
        plot=value.plot_near_zero,
        validate=value.validate_near_zero,
    ),
    "paired_mean_diff": RuleKind(
        check=band.check_paired,
        expected=band.expected_paired,
        reference=band.reference_series,
        validate=band.validate_paired,
        reference_series=True,
    ),
    "no_rising_trend": RuleKind(
        check=trend.check_trend, expected=trend.expected_trend, plot=trend.plot_trend
    ),
    "sd_at_least": RuleKind(
        check=trend.check_sd_floor,
        expected=trend.expected_floor,
        reference=trend.reference_mean,
        validate=trend.validate_floor,
        recorded=trend.recorded_floor,
    ),
    "step_rise": RuleKind(
        check=step.check_step,
        expected=step.expected_step,
        plot=step.plot_step,
        reference=step.reference_step,
        validate=step.validate_step,
    ),
}


def evaluate_rule(rule: Rule, ctx: RuleContext) -> Check:
    """Apply one baseline rule to the run; a missing metric is never a pass."""
    kind = KINDS[rule.kind]
    if not kind.needs_series:
        return kind.check(rule, (), ctx)
    assert rule.metric is not None
    series = ctx.evidence.series.get(rule.metric, ())
    if series:
        return kind.check(rule, series, ctx)
    detail = f"not measured: no {rule.metric} in any source (TensorBoard, CI history, job.log)"
    status: Status = "fail" if rule.required else "not_measured"
    return rule_check(rule, status, None, expected_text(rule, ctx.baseline, ctx.rollouts), detail)


def expected_text(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    """The one sentence stating ``rule``'s tolerance for a run of ``rollouts``."""
    return KINDS[rule.kind].expected(rule, baseline, rollouts)


def validate_rule(rule: Rule, baseline: Baseline) -> Problem | None:
    """Whether ``rule``'s tolerance is derived as declared or lies in its sane range."""
    method = KINDS[rule.kind].derive_method
    if rule.derive is not None and rule.derive.method != method:
        return (
            ".derive.method",
            f"{rule.kind} takes method {method}, not {rule.derive.method}",
            (f"set it to {method}"),
        )
    return KINDS[rule.kind].validate(rule, baseline)

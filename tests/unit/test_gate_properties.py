"""Properties of miles_amd.judge.gate: no damage to the evidence can turn into a pass."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.types import JobRecord, RunEvidence
from miles_amd.judge.gate import judge
from miles_amd.rules.model import Baseline

REQUIRED = ("train/train_rollout_logprob_abs_diff", "rollout/raw_reward", "train/pg_clipfrac")
BASELINES = {name: load_baseline(name) for name in ("stock", "patched")}


def clean_series(baseline: Baseline) -> dict[str, list[tuple[int, float]]]:
    patched = BASELINES["patched"]
    return {
        REQUIRED[0]: list(enumerate(patched.series[REQUIRED[0]])),
        REQUIRED[1]: [(i, round(v * 64) / 64) for i, v in enumerate(patched.series[REQUIRED[1]])],
        REQUIRED[2]: [(i, 0.0) for i in range(baseline.run_shape.rollouts)],
    }


def run(series: dict[str, list[tuple[int, float]]]) -> RunEvidence:
    return RunEvidence(
        run_dir="runs/p",
        series={m: tuple(sorted(ps, key=lambda p: p[0])) for m, ps in series.items()},
        sources=dict.fromkeys(series, "ci_history"),
        job=JobRecord("raysubmit_p", "SUCCEEDED"),
    )


baselines = st.sampled_from(sorted(BASELINES))
metrics = st.sampled_from(REQUIRED)
steps = st.integers(min_value=0, max_value=19)


@settings(max_examples=60, deadline=None)
@given(
    name=baselines,
    metric=metrics,
    step=steps,
    damage=st.sampled_from(["lost", "duplicated", math.nan, math.inf, -math.inf]),
)
def test_a_lost_duplicated_or_non_finite_step_never_passes(
    name: str, metric: str, step: int, damage: str | float
) -> None:
    # pg_clipfrac is optional in stock, but a measured series is judged all the same
    baseline = BASELINES[name]
    series = clean_series(baseline)
    if damage == "lost":
        series[metric] = [p for p in series[metric] if p[0] != step]
    elif damage == "duplicated":
        series[metric] = [*series[metric], series[metric][step]]
    else:
        assert isinstance(damage, float)
        series[metric] = [(s, damage if s == step else v) for s, v in series[metric]]
    verdict = judge(run(series), baseline)
    assert verdict.verdict == "fail"
    if isinstance(damage, float):
        finite = next(c for c in verdict.checks if c.kind == "finite" and c.metric == metric)
        assert finite.status == "fail" and finite.failing_steps == (step,)


@pytest.mark.parametrize("name", sorted(BASELINES))
@pytest.mark.parametrize("metric", REQUIRED[:2])
def test_the_undamaged_run_passes_and_a_missing_required_metric_never_does(name, metric) -> None:
    baseline = BASELINES[name]
    series = clean_series(baseline)
    assert judge(run(series), baseline).verdict == "pass"
    del series[metric]
    assert judge(run(series), baseline).verdict == "fail"


@settings(max_examples=30, deadline=None)
@given(step=steps, value=st.floats(min_value=0.1500001, max_value=1e6))
def test_any_spike_fails_and_is_named(step: int, value: float) -> None:
    baseline = BASELINES["patched"]
    series = clean_series(baseline)
    series[REQUIRED[0]] = [(s, value if s == step else v) for s, v in series[REQUIRED[0]]]
    verdict = judge(run(series), baseline)
    spikes = next(c for c in verdict.checks if c.name == "logprob_abs_diff.spikes")
    assert spikes.status == "fail" and spikes.observed == 1
    assert f"rollout {step} (" in spikes.detail


@settings(max_examples=40, deadline=None)
@given(
    name=baselines,
    metric=metrics,
    step=steps,
    value=st.floats(allow_nan=True, allow_infinity=True),
)
@example(name="patched", metric=REQUIRED[1], step=0, value=1.3756120685036768e154)
@example(name="patched", metric=REQUIRED[0], step=3, value=1.7e308)
@example(name="stock", metric=REQUIRED[1], step=5, value=-1.7e308)
def test_any_single_value_is_judged_without_crashing(
    name: str, metric: str, step: int, value: float
) -> None:
    baseline = BASELINES[name]
    series = clean_series(baseline)
    original = dict(series[metric])[step]
    series[metric] = [(s, value if s == step else v) for s, v in series[metric]]
    verdict = judge(run(series), baseline)
    if not math.isfinite(value):
        assert verdict.verdict == "fail"
    if value == original:
        assert verdict.verdict == "pass"

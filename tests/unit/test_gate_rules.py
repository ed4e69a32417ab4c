"""miles_amd.judge.gate on constructed RunEvidence: every rule passes one case and fails another."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.types import Conflict, JobRecord, RunEvidence, SentinelHit, SourceProblem
from miles_amd.judge.gate import Check, Verdict, early_failures, judge
from miles_amd.rules.model import Baseline
from tests.constants import CLIPFRAC, KL, LOGPROB, REWARD

RESPONSE = "rollout/response_len/mean"
TRUNCATED = "rollout/truncated_ratio"
GRAD_NORM = "train/grad_norm"
SUCCEEDED = JobRecord("raysubmit_1", "SUCCEEDED")


def published(baseline: Baseline) -> dict[str, list[float]]:
    """The patched run's published per-rollout values (rewards as the k/64 they round from)."""
    return {
        LOGPROB: list(baseline.series[LOGPROB]),
        REWARD: [round(v * 64) / 64 for v in baseline.series[REWARD]],
        CLIPFRAC: [0.0] * 20,
    }


def evidence(
    values: dict[str, list[float]],
    *,
    job: JobRecord | None = SUCCEEDED,
    **fields,
) -> RunEvidence:
    series = {metric: tuple(enumerate(vs)) for metric, vs in values.items()}
    return RunEvidence(
        run_dir="runs/x",
        series=series,
        sources=dict.fromkeys(series, "tensorboard"),
        job=job,
        **fields,
    )


def check(verdict: Verdict, name: str) -> Check:
    (found,) = [c for c in verdict.checks if c.name == name]
    return found


def with_values(baseline: Baseline, **changes: dict[int, float]) -> dict[str, list[float]]:
    """The published values with single points replaced: ``LOGPROB={3: 0.2}``."""
    values = published(baseline)
    keys = {"logprob": LOGPROB, "reward": REWARD, "clipfrac": CLIPFRAC}
    for short, points in changes.items():
        for step, value in points.items():
            values[keys[short]][step] = value
    return values


# ---------------------------------------------------------------------------- the reference run


def test_published_patched_run_passes_patched_and_stock(patched: Baseline, stock: Baseline) -> None:
    for baseline in (patched, stock):
        verdict = judge(evidence(published(patched)), baseline)
        assert verdict.verdict == "pass", verdict.reason
        assert verdict.exit_code == 0
        assert not verdict.failures
    verdict = judge(evidence(published(patched)), patched)
    assert check(verdict, "raw_reward.paired").status == "pass"
    # summary-only metrics are not in this evidence: shown as not measured, never as passed
    for name in ("train_rollout_kl.mean", "response_len.mean", "truncated_ratio.mean"):
        assert check(verdict, name).status == "not_measured"
        assert check(verdict, name).detail.startswith("not measured")


# ---------------------------------------------------------------------------- job status


def test_job_status_succeeded_passes_and_failed_fails(patched: Baseline) -> None:
    ok = judge(evidence(published(patched)), patched)
    assert check(ok, "job.status").status == "pass"
    failed_job = JobRecord("raysubmit_1", "FAILED", message="Job entrypoint command failed")
    bad = judge(evidence(published(patched), job=failed_job), patched)
    status = check(bad, "job.status")
    assert status.status == "fail"
    assert status.observed == "FAILED"
    assert "Job entrypoint command failed" in status.detail
    assert bad.verdict == "fail"


def test_job_status_fails_a_succeeded_job_whose_full_log_was_lost(patched: Baseline) -> None:
    """job.log holds only what was streamed: a fatal line may be missing, so no pass."""
    partial = JobRecord(
        "raysubmit_1", "SUCCEEDED", final_log_error="the final log could not be fetched (x)"
    )
    judged = judge(evidence(published(patched), job=partial), patched)
    status = check(judged, "job.status")
    assert status.status == "fail" and judged.verdict == "fail"
    assert "job.log is partial: the final log could not be fetched (x)" in status.detail


def test_job_status_without_job_json_is_not_measured_or_error(patched: Baseline) -> None:
    missing = judge(evidence(published(patched), job=None), patched)
    assert check(missing, "job.status").status == "not_measured"
    assert missing.verdict == "pass"
    broken = SourceProblem("job_json", "runs/x/job.json", "bad JSON at line 1 column 2")
    unreadable = judge(evidence(published(patched), job=None, problems=(broken,)), patched)
    assert check(unreadable, "job.status").status == "error"
    assert "job.json unreadable" in check(unreadable, "job.status").detail
    assert unreadable.verdict == "fail"


# ---------------------------------------------------------------------------- steps


def test_steps_missing_step_fails(patched: Baseline) -> None:
    values = published(patched)
    run = evidence(values)
    run.series[LOGPROB] = tuple(p for p in run.series[LOGPROB] if p[0] != 7)
    result = check(judge(run, patched), "logprob_abs_diff.steps")
    assert result.status == "fail"
    assert "missing train/step 7" in result.detail


def test_steps_duplicate_and_unexpected_fail(patched: Baseline) -> None:
    run = evidence(published(patched))
    run.series[REWARD] = tuple(sorted((*run.series[REWARD], (4, 0.5), (20, 0.5))))
    result = check(judge(run, patched), "raw_reward.steps")
    assert result.status == "fail"
    assert "duplicated 4 (2x)" in result.detail
    assert "unexpected 20" in result.detail
    assert set(result.failing_steps) == {4, 20}


def test_required_metric_absent_fails_as_not_measured(patched: Baseline) -> None:
    values = published(patched)
    del values[CLIPFRAC]
    verdict = judge(evidence(values), patched)
    for name in ("pg_clipfrac.steps", "pg_clipfrac.finite", "pg_clipfrac.near_zero"):
        assert check(verdict, name).status == "fail"
        assert check(verdict, name).detail.startswith("not measured")
    assert verdict.verdict == "fail"


def test_optional_metric_measured_is_judged(patched: Baseline) -> None:
    values = published(patched)
    values[KL] = [8.8e-4] * 19  # one step short
    verdict = judge(evidence(values), patched)
    assert check(verdict, "train_rollout_kl.mean").status == "pass"
    assert check(verdict, "train_rollout_kl.steps").status == "fail"
    assert verdict.verdict == "fail"


# ---------------------------------------------------------------------------- finite


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_value_fails_naming_metric_and_step(patched: Baseline, bad: float) -> None:
    verdict = judge(evidence(with_values(patched, reward={11: bad})), patched)
    result = check(verdict, "raw_reward.finite")
    assert result.status == "fail"
    assert "non-finite rollout/raw_reward at rollout 11" in result.detail
    assert result.failing_steps == (11,)
    # the statistics over it cannot pass either
    assert check(verdict, "raw_reward.mean").status == "fail"
    assert check(verdict, "raw_reward.batch_fingerprint").status == "fail"
    assert check(verdict, "raw_reward.paired").status == "fail"


def test_non_finite_grad_norm_fails_although_optional(patched: Baseline) -> None:
    values = published(patched)
    values[GRAD_NORM] = [0.3] * 20
    assert check(judge(evidence(values), patched), "grad_norm.finite").status == "pass"
    values[GRAD_NORM][5] = math.nan
    verdict = judge(evidence(values), patched)
    assert check(verdict, "grad_norm.finite").status == "fail"
    assert verdict.verdict == "fail"


# ---------------------------------------------------------------------------- spikes


def test_spikes_are_counted_and_named(patched: Baseline) -> None:
    verdict = judge(evidence(with_values(patched, logprob={3: 0.21, 12: 0.4})), patched)
    spikes = check(verdict, "logprob_abs_diff.spikes")
    assert spikes.status == "fail"
    assert spikes.observed == 2
    assert spikes.numbers["spikes"] == 2
    assert "2 spike(s) above 0.15: rollout 3 (0.21), rollout 12 (0.4)" in spikes.detail
    assert spikes.failing_steps == (3, 12)


def test_value_at_the_threshold_is_no_spike(patched: Baseline) -> None:
    verdict = judge(evidence(with_values(patched, logprob={3: 0.15})), patched)
    spikes = check(verdict, "logprob_abs_diff.spikes")
    assert spikes.status == "pass"
    assert spikes.observed == 0
    assert check(verdict, "logprob_abs_diff.max").status == "fail"  # far above the spread


# ---------------------------------------------------------------------------- mean / max bands


def test_logprob_mean_outside_band_fails(patched: Baseline) -> None:
    values = published(patched)
    values[LOGPROB] = [v + 0.0045 for v in values[LOGPROB]]
    result = check(judge(evidence(values), patched, looks=False), "logprob_abs_diff.mean")
    assert result.status == "fail"
    assert "outside [0.01288, 0.02107]" in result.detail  # the written band: no looks
    assert result.numbers["low"] == 0.01288
    # with looks its last look's bound is a little above 4 SE (the rate the looks before it
    # spent): the band it is judged with at the end is a little wider
    looked = check(judge(evidence(values), patched), "logprob_abs_diff.mean")
    assert looked.status == "fail"
    assert looked.numbers["low"] < 0.01288 and looked.numbers["high"] > 0.02107


def test_collapsed_logprob_diff_fails_the_lower_edge(patched: Baseline) -> None:
    values = published(patched)
    values[LOGPROB] = [0.0] * 20
    assert check(judge(evidence(values), patched), "logprob_abs_diff.mean").status == "fail"


def test_logprob_max_above_bound_fails_and_marks_the_point(patched: Baseline) -> None:
    verdict = judge(evidence(with_values(patched, logprob={9: 0.03})), patched)
    result = check(verdict, "logprob_abs_diff.max")
    assert result.status == "fail"
    assert result.failing_steps == (9,)
    assert check(verdict, "logprob_abs_diff.spikes").status == "pass"


def test_reward_mean_outside_band_fails(patched: Baseline, stock: Baseline) -> None:
    values = published(patched)
    values[REWARD] = [0.25] * 20
    for baseline in (patched, stock):
        result = check(judge(evidence(values), baseline), "raw_reward.mean")
        assert result.status == "fail"
        assert result.observed == 0.25


def test_kl_response_length_and_truncation_bands(patched: Baseline) -> None:
    values = published(patched)
    values.update({KL: [8.8e-4] * 20, RESPONSE: [2900.0] * 20, TRUNCATED: [0.4] * 20})
    verdict = judge(evidence(values), patched)
    for name in ("train_rollout_kl.mean", "response_len.mean"):
        assert check(verdict, name).status == "pass"
    assert check(verdict, "truncated_ratio.mean").status == "pass"
    values.update({KL: [5e-3] * 20, RESPONSE: [4000.0] * 20, TRUNCATED: [0.95] * 20})
    verdict = judge(evidence(values), patched)
    for name in ("train_rollout_kl.mean", "response_len.mean"):
        assert check(verdict, name).status == "fail"
    assert check(verdict, "truncated_ratio.mean").status == "fail"
    assert verdict.verdict == "fail"


# ---------------------------------------------------------------------------- fingerprint


def test_reward_off_the_64th_grid_fails(patched: Baseline) -> None:
    verdict = judge(evidence(with_values(patched, reward={4: 0.6})), patched)
    result = check(verdict, "raw_reward.batch_fingerprint")
    assert result.status == "fail"
    assert "rollout 4: 0.6 = 38.4·1/64" in result.detail
    assert result.failing_steps == (4,)


def test_published_4_decimal_rewards_are_off_the_exact_grid(patched: Baseline) -> None:
    values = published(patched)
    values[REWARD] = list(patched.series[REWARD])  # 0.6094 instead of 39/64
    result = check(judge(evidence(values), patched), "raw_reward.batch_fingerprint")
    assert result.status == "fail"
    assert result.observed == "5/20 on grid"  # 0.5, 0.5625 (2x), 0.75, 0.625


# ---------------------------------------------------------------------------- near zero


@pytest.mark.parametrize("bad", [0.01, -0.001, 4e-6])
def test_clipfrac_above_tolerance_fails(patched: Baseline, bad: float) -> None:
    verdict = judge(evidence(with_values(patched, clipfrac={2: bad})), patched)
    result = check(verdict, "pg_clipfrac.near_zero")
    assert result.status == "fail"
    assert result.failing_steps == (2,)


def test_clipfrac_float_noise_passes(patched: Baseline) -> None:
    verdict = judge(evidence(with_values(patched, clipfrac={2: 1e-7})), patched)
    assert check(verdict, "pg_clipfrac.near_zero").status == "pass"


# ---------------------------------------------------------------------------- paired effect


def test_paired_reward_drop_fails_with_the_effect_reported(patched: Baseline) -> None:
    values = published(patched)
    values[REWARD] = [max(0.0, v - 5 / 64) for v in values[REWARD]]  # 5 fewer correct of 64
    verdict = judge(evidence(values), patched, looks=False)
    paired = check(verdict, "raw_reward.paired")
    assert paired.status == "fail"
    # against the level pooled with the stock run's 0.57 on the same prompts
    pooled = -5 / 64 - (0.57 - statistics.fmean(patched.series[REWARD])) / 2
    assert paired.numbers["mean_diff"] == pytest.approx(pooled, abs=1e-4)
    assert paired.numbers["n"] == 20
    assert paired.numbers["z"] < -3
    assert "over 20 rollouts paired with jvvnhop9" in paired.detail
    # the unpaired band is wider: the same drop still passes it
    assert check(verdict, "raw_reward.mean").status == "pass"


def test_paired_noise_within_binomial_spread_passes(patched: Baseline) -> None:
    values = published(patched)
    values[REWARD] = [v + (1 / 64 if i % 2 else -1 / 64) for i, v in enumerate(values[REWARD])]
    paired = check(judge(evidence(values), patched), "raw_reward.paired")
    assert paired.status == "pass"
    assert abs(paired.numbers["z"]) < 3


def test_paired_uses_only_the_overlapping_rollouts(patched: Baseline) -> None:
    rewards = published(patched)[REWARD]
    values = {
        LOGPROB: [0.017] * 40,
        REWARD: rewards + rewards,
        CLIPFRAC: [0.0] * 40,
    }
    verdict = judge(evidence(values), patched, expected_rollouts=40)
    assert check(verdict, "raw_reward.paired").numbers["n"] == 20
    assert verdict.verdict == "pass", verdict.reason


def test_stock_has_no_paired_rule(stock: Baseline, patched: Baseline) -> None:
    verdict = judge(evidence(published(patched)), stock)
    assert not [c for c in verdict.checks if c.kind == "paired_mean_diff"]


# ---------------------------------------------------------------------------- rollout count


def test_three_rollout_smoke_is_judged_with_wider_bands(patched: Baseline) -> None:
    values = {metric: vs[:3] for metric, vs in published(patched).items()}
    verdict = judge(evidence(values), patched, expected_rollouts=3)
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.expected_rollouts == 3
    full = check(judge(evidence(published(patched)), patched), "logprob_abs_diff.mean")
    smoke = check(verdict, "logprob_abs_diff.mean")
    assert smoke.numbers["low"] < full.numbers["low"]
    assert smoke.expected != full.expected
    assert check(verdict, "logprob_abs_diff.steps").expected == "train/step 0..2, each once"
    # the same three rollouts against the default 20 fail the step rules
    short = judge(evidence(values), patched)
    assert check(short, "logprob_abs_diff.steps").status == "fail"
    assert "missing train/step 3, 4, 5" in check(short, "logprob_abs_diff.steps").detail


def test_long_run_gets_a_higher_max_bound(patched: Baseline) -> None:
    values = {LOGPROB: [0.017] * 1000, REWARD: [0.5, 0.625] * 500, CLIPFRAC: [0.0] * 1000}
    values[LOGPROB][500] = 0.0275  # above the 20-rollout bound 0.02705, fine for 1000
    verdict = judge(evidence(values), patched, expected_rollouts=1000)
    assert check(verdict, "logprob_abs_diff.max").status == "pass"
    assert verdict.verdict == "pass", verdict.reason


def test_expected_rollouts_must_be_positive(patched: Baseline) -> None:
    with pytest.raises(ValueError, match="expected_rollouts must be >= 1"):
        judge(evidence(published(patched)), patched, expected_rollouts=0)


# ---------------------------------------------------------------------------- evidence problems


def test_source_problem_fails_the_run_with_a_named_check(patched: Baseline) -> None:
    problem = SourceProblem("tensorboard", "runs/x/tensorboard/ev", "offset 120: truncated record")
    verdict = judge(evidence(published(patched), problems=(problem,)), patched)
    readable = check(verdict, "evidence.readable")
    assert readable.status == "fail"
    assert "tensorboard: runs/x/tensorboard/ev: offset 120: truncated record" in readable.detail
    assert verdict.verdict == "fail"
    assert verdict.exit_code == 1


def test_conflict_between_sources_fails_the_run(patched: Baseline) -> None:
    conflict = Conflict(LOGPROB, 3, {"tensorboard": 0.0172, "job_log": 0.9})
    verdict = judge(evidence(published(patched), conflicts=(conflict,)), patched)
    consistent = check(verdict, "evidence.consistent")
    assert consistent.status == "fail"
    assert f"{LOGPROB} at step 3: job_log=0.9, tensorboard=0.0172" in consistent.detail
    assert verdict.verdict == "fail"


def test_nothing_readable_is_an_error(patched: Baseline) -> None:
    problem = SourceProblem("run_dir", "runs/x", "no metric source in the run directory")
    verdict = judge(evidence({}, job=None, problems=(problem,)), patched)
    assert verdict.verdict == "error"
    assert verdict.exit_code == 2
    assert verdict.reason.startswith("nothing readable in runs/x")
    assert check(verdict, "logprob_abs_diff.steps").status == "fail"


def test_job_json_alone_is_readable_and_fails(patched: Baseline) -> None:
    verdict = judge(evidence({}, job=JobRecord("raysubmit_1", "FAILED")), patched)
    assert verdict.verdict == "fail"
    assert check(verdict, "job.status").status == "fail"


# ---------------------------------------------------------------------------- sentinels


FATAL = SentinelHit(
    name="hip_memory_access_fault",
    severity="fatal",
    count=3,
    first_line=812,
    first_text="Memory access fault by GPU node-9 (Agent handle: 0x55d1c7a0)",
    reference="",
)
KNOWN = SentinelHit(
    name="megatron_router_dtype_dropped",
    severity="known",
    count=8,
    first_line=40,
    first_text="Using a large number of experts (e.g. >=32) without fp32 routing.",
    reference="radixark/miles#3263",
)


def test_fatal_sentinel_fails_naming_count_and_first_line(patched: Baseline) -> None:
    verdict = judge(evidence(published(patched), sentinels=(FATAL, KNOWN)), patched)
    fatal = check(verdict, "sentinel.hip_memory_access_fault")
    assert fatal.status == "fail"
    assert fatal.observed == 3
    assert "3x in job.log, first at line 812: Memory access fault" in fatal.detail
    assert verdict.verdict == "fail"
    assert verdict.sentinels == (FATAL, KNOWN)


def test_known_sentinel_is_listed_but_never_fails(patched: Baseline) -> None:
    verdict = judge(evidence(published(patched), sentinels=(KNOWN,)), patched)
    assert verdict.verdict == "pass"
    assert verdict.sentinels == (KNOWN,)
    assert not [c for c in verdict.checks if c.kind == "sentinel"]


# ---------------------------------------------------------------------------- fail fast


def test_early_failures_on_a_partial_run(patched: Baseline) -> None:
    """One rollout past the first look: a spike before the look lifts the mean there; the
    reward's NaN after it fails at once, and no look has judged it yet."""
    first = patched.run_shape.looks[0]
    partial = {metric: vs[: first + 1] for metric, vs in published(patched).items()}
    assert early_failures(evidence(partial, job=None), patched) == []
    partial[LOGPROB][4] = 0.31
    partial[REWARD][first] = math.nan
    found = early_failures(evidence(partial, job=None, sentinels=(FATAL, KNOWN)), patched)
    names = [c.name for c in found]
    assert names == [
        "logprob_abs_diff.spikes",
        "logprob_abs_diff.mean",  # at the first look: the spike lifts the mean
        "logprob_abs_diff.max",
        "raw_reward.finite",
        "raw_reward.batch_fingerprint",  # NaN is off the 1/64 grid: at once too
        "sentinel.hip_memory_access_fault",
    ]
    assert "rollout 4 (0.31)" in found[0].detail
    assert found[1].look == first and found[1].detail.startswith(f"look at rollout {first}: mean")
    assert f"rollout/raw_reward at rollout {first}" in found[3].detail


def test_early_failures_are_the_final_gates_checks(patched: Baseline) -> None:
    values = with_values(patched, logprob={8: 0.5})
    values[GRAD_NORM] = [0.2] * 20
    values[GRAD_NORM][2] = math.inf
    run = evidence(values, sentinels=(FATAL,))
    early = early_failures(run, patched)
    final = {c.name: c for c in judge(run, patched).checks}
    assert [c.name for c in early] == [
        "logprob_abs_diff.spikes",
        "logprob_abs_diff.mean",
        "logprob_abs_diff.max",
        "grad_norm.finite",
        "sentinel.hip_memory_access_fault",
    ]
    for c in early:
        assert final[c.name] == c
    assert final["logprob_abs_diff.mean"].look == 10  # its first failing look


def test_early_failures_ignore_what_a_partial_run_has_not_logged(patched: Baseline) -> None:
    assert early_failures(evidence({}, job=None), patched) == []
    rollout_only = evidence({REWARD: [0.5]}, job=None)
    assert early_failures(rollout_only, patched) == []
    assert replace(rollout_only, sentinels=(KNOWN,)).sentinels == (KNOWN,)
    assert early_failures(replace(rollout_only, sentinels=(KNOWN,)), patched) == []


# ---------------------------------------------------------------------------- one sentence


@pytest.mark.parametrize("name", ["stock", "patched"])
def test_the_gate_and_the_diff_state_each_tolerance_in_the_same_sentence(name: str) -> None:
    """One expected-value sentence per rule kind (its ``expected``), wherever it is shown."""
    from miles_amd.baseline.diff import diff_baselines

    baseline = load_baseline(name)
    shown = {c.name: c.expected for c in judge(evidence({}, job=None), baseline).checks}
    rows = diff_baselines(baseline, baseline).rules
    assert {row.rule_id: row.after.tolerance for row in rows if row.after} == {
        rule.id: shown[rule.id] for rule in baseline.rules
    }

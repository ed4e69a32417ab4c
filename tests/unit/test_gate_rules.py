"""miles_amd.judge.gate on constructed RunEvidence: every rule passes one case and fails another."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace

import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.types import Conflict, JobRecord, RunEvidence, SentinelHit, SourceProblem
from miles_amd.judge.gate import Check, Verdict, early_failures, judge
from miles_amd.rules.model import Baseline
from tests.constants import CLIPFRAC, KL, LOGPROB, REWARD
from tests.run_dirs import published_values

RESPONSE = "rollout/response_len/mean"
TRUNCATED = "rollout/truncated_ratio"
GRAD_NORM = "train/grad_norm"
SUCCEEDED = JobRecord("raysubmit_1", "SUCCEEDED")


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
    values = published_values()
    keys = {"logprob": LOGPROB, "reward": REWARD, "clipfrac": CLIPFRAC}
    for short, points in changes.items():
        for step, value in points.items():
            values[keys[short]][step] = value
    return values


def with_series(patched: Baseline, metric: str, values: list[float]) -> dict[str, list[float]]:
    return {**published_values(), metric: values}


def without_step(patched: Baseline) -> RunEvidence:
    run = evidence(published_values())
    run.series[LOGPROB] = tuple(p for p in run.series[LOGPROB] if p[0] != 7)
    return run


def with_extra_steps(patched: Baseline) -> RunEvidence:
    run = evidence(published_values())
    run.series[REWARD] = tuple(sorted((*run.series[REWARD], (4, 0.5), (20, 0.5))))
    return run


def without_clipfrac(patched: Baseline) -> dict[str, list[float]]:
    values = published_values()
    del values[CLIPFRAC]
    return values


def grad_norm(bad_at: int | None) -> dict[str, list[float]]:
    values = [0.3] * 20
    if bad_at is not None:
        values[bad_at] = math.nan
    return {GRAD_NORM: values}


FAILED_JOB = JobRecord("raysubmit_1", "FAILED", message="Job entrypoint command failed")
PARTIAL_LOG = JobRecord(
    "raysubmit_1", "SUCCEEDED", final_log_error="the final log could not be fetched (x)"
)
BROKEN_JOB = SourceProblem("job_json", "runs/x/job.json", "bad JSON at line 1 column 2")
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
TRUNCATED_EVENTS = SourceProblem(
    "tensorboard", "runs/x/tensorboard/ev", "offset 120: truncated record"
)
NO_SOURCE = SourceProblem("run_dir", "runs/x", "no metric source in the run directory")


# (what the run is, verdict, {check: (status, text in its detail, failing steps or None)})
def valued(**changes: dict[int, float]) -> Callable[[Baseline], RunEvidence]:
    return lambda b: evidence(with_values(b, **changes))


Expected = dict[str, tuple[str, str, tuple[int, ...] | None]]


def _summaries_at(kl: float, length: float, truncated: float) -> Callable[[Baseline], RunEvidence]:
    values = {**published_values(), KL: [kl] * 20, RESPONSE: [length] * 20,
              TRUNCATED: [truncated] * 20}  # fmt: skip
    return lambda _: evidence(values)


CASES: dict[str, tuple[Callable[[Baseline], RunEvidence], str, Expected]] = {
    "the published run": (
        lambda b: evidence(published_values()), "pass",
        {
            "job.status": ("pass", "", None),
            "raw_reward.paired": ("pass", "", None),
            # summary-only metrics are not in this evidence: not measured, never passed
            "train_rollout_kl.mean": ("not_measured", "not measured", None),
            "response_len.mean": ("not_measured", "not measured", None),
            "truncated_ratio.mean": ("not_measured", "not measured", None),
        },
    ),
    "a failed job": (
        lambda b: evidence(published_values(), job=FAILED_JOB), "fail",
        {"job.status": ("fail", "Job entrypoint command failed", None)},
    ),
    "a job whose full log was lost": (  # a fatal line may be missing: no pass
        lambda b: evidence(published_values(), job=PARTIAL_LOG), "fail",
        {"job.status": ("fail", "job.log is partial: the final log could not be fetched", None)},
    ),
    "no job.json": (
        lambda b: evidence(published_values(), job=None), "pass",
        {"job.status": ("not_measured", "not measured", None)},
    ),
    "an unreadable job.json": (
        lambda b: evidence(published_values(), job=None, problems=(BROKEN_JOB,)), "fail",
        {"job.status": ("error", "job.json unreadable", None)},
    ),
    "job.json alone": (
        lambda b: evidence({}, job=JobRecord("raysubmit_1", "FAILED")), "fail",
        {"job.status": ("fail", "", None)},
    ),
    "a missing step": (
        without_step, "fail", {"logprob_abs_diff.steps": ("fail", "missing train/step 7", None)}
    ),
    "a duplicated and an unexpected step": (
        with_extra_steps, "fail",
        {"raw_reward.steps": ("fail", "duplicated 4 (2x); unexpected 20", (4, 20))},
    ),
    "a required metric absent": (
        lambda b: evidence(without_clipfrac(b)), "fail",
        {f"pg_clipfrac.{r}": ("fail", "not measured", None)
         for r in ("steps", "finite", "near_zero")},
    ),
    "an optional metric measured one step short": (
        lambda b: evidence(with_series(b, KL, [8.8e-4] * 19)), "fail",
        {"train_rollout_kl.mean": ("pass", "", None), "train_rollout_kl.steps": ("fail", "", None)},
    ),
    "a finite optional grad norm": (
        lambda b: evidence({**published_values(), **grad_norm(None)}), "pass",
        {"grad_norm.finite": ("pass", "", None)},
    ),
    "a NaN optional grad norm": (
        lambda b: evidence({**published_values(), **grad_norm(5)}), "fail",
        {"grad_norm.finite": ("fail", "", (5,))},
    ),
    "two spikes": (
        lambda b: evidence(with_values(b, logprob={3: 0.21, 12: 0.4})), "fail",
        {"logprob_abs_diff.spikes": (
            "fail", "2 spike(s) above 0.15: rollout 3 (0.21), rollout 12 (0.4)", (3, 12)
        )},
    ),
    "a value at the threshold": (  # no spike, but far above the spread
        lambda b: evidence(with_values(b, logprob={3: 0.15})), "fail",
        {
            "logprob_abs_diff.spikes": ("pass", "0 spikes above 0.15", None),
            "logprob_abs_diff.max": ("fail", "", (3,)),
        },
    ),
    "a collapsed logprob gap": (
        lambda b: evidence(with_series(b, LOGPROB, [0.0] * 20)), "fail",
        {"logprob_abs_diff.mean": ("fail", "outside", None)},
    ),
    "a max above its bound, no spike": (
        lambda b: evidence(with_values(b, logprob={9: 0.03})), "fail",
        {"logprob_abs_diff.max": ("fail", "", (9,)), "logprob_abs_diff.spikes": ("pass", "", None)},
    ),
    "a low reward": (
        lambda b: evidence(with_series(b, REWARD, [0.25] * 20)), "fail",
        {"raw_reward.mean": ("fail", "mean 0.25 outside", None)},
    ),
    **{
        f"summary-banded metrics {where}": (
            _summaries_at(kl, length, truncated),
            verdict,
            {f"{name}.mean": (verdict, "", None)
             for name in ("train_rollout_kl", "response_len", "truncated_ratio")},
        )
        for where, kl, length, truncated, verdict in (
            ("inside", 8.8e-4, 2900.0, 0.4, "pass"), ("outside", 5e-3, 4000.0, 0.95, "fail")
        )
    },
    "a reward off the 1/64 grid": (
        lambda b: evidence(with_values(b, reward={4: 0.6})), "fail",
        {"raw_reward.batch_fingerprint": ("fail", "rollout 4: 0.6 = 38.4·1/64", (4,))},
    ),
    "the published 4-decimal rewards": (  # 0.6094 is not 39/64: 5 of 20 on the grid
        lambda b: evidence(with_series(b, REWARD, list(b.series[REWARD]))), "fail",
        {"raw_reward.batch_fingerprint": ("fail", "15 value(s) off the 1/64 grid", None)},
    ),
    "clipfrac float noise": (
        lambda b: evidence(with_values(b, clipfrac={2: 1e-7})), "pass",
        {"pg_clipfrac.near_zero": ("pass", "every |value| ≤", None)},
    ),
    **{
        f"a clipfrac of {bad:g}": (
            valued(clipfrac={2: bad}), "fail",
            {"pg_clipfrac.near_zero": ("fail", "1 value(s) beyond", (2,))},
        )
        for bad in (0.01, -0.001, 4e-6)
    },
    **{
        f"a reward of {bad}": (  # the statistics over it cannot pass either
            valued(reward={11: bad}), "fail",
            {
                "raw_reward.finite": ("fail", "non-finite rollout/raw_reward at rollout 11", (11,)),
                "raw_reward.mean": ("fail", "mean undefined", (11,)),
                "raw_reward.batch_fingerprint": ("fail", "", (11,)),
                "raw_reward.paired": ("fail", "paired effect undefined", (11,)),
            },
        )
        for bad in (math.nan, math.inf, -math.inf)
    },
    "a truncated source": (
        lambda b: evidence(published_values(), problems=(TRUNCATED_EVENTS,)), "fail",
        {"evidence.readable": (
            "fail", "tensorboard: runs/x/tensorboard/ev: offset 120: truncated record", None
        )},
    ),
    "two sources disagreeing": (
        lambda b: evidence(
            published_values(),
            conflicts=(Conflict(LOGPROB, 3, {"tensorboard": 0.0172, "job_log": 0.9}),),
        ),
        "fail",
        {"evidence.consistent": (
            "fail", f"{LOGPROB} at step 3: job_log=0.9, tensorboard=0.0172", None
        )},
    ),
    "nothing readable": (
        lambda b: evidence({}, job=None, problems=(NO_SOURCE,)), "error",
        {"logprob_abs_diff.steps": ("fail", "not measured", None)},
    ),
    "a fatal and a known sentinel": (  # a known one is listed, never judged
        lambda b: evidence(published_values(), sentinels=(FATAL, KNOWN)), "fail",
        {"sentinel.hip_memory_access_fault": (
            "fail", "3x in job.log, first at line 812: Memory access fault", None
        )},
    ),
    "a known sentinel": (lambda b: evidence(published_values(), sentinels=(KNOWN,)), "pass", {}),
    "paired noise within the binomial spread": (
        lambda b: evidence(with_series(b, REWARD, [
            v + (1 / 64 if i % 2 else -1 / 64) for i, v in enumerate(published_values()[REWARD])
        ])),
        "pass",
        {"raw_reward.paired": ("pass", "over 20 rollouts paired with jvvnhop9", None)},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_each_rule_passes_and_fails_naming_what_it_saw(patched: Baseline, case: str) -> None:
    make, verdict_name, expected = CASES[case]
    run = make(patched)
    verdict = judge(run, patched)
    assert verdict.verdict == verdict_name, verdict.reason
    assert verdict.exit_code == {"pass": 0, "fail": 1, "error": 2}[verdict_name]
    assert verdict.sentinels == run.sentinels  # every hit listed, only a fatal one judged
    judged = [c.name for c in verdict.checks if c.kind == "sentinel"]
    assert judged == [f"sentinel.{h.name}" for h in run.sentinels if h.severity == "fatal"]
    if verdict_name == "error":
        assert verdict.reason.startswith("nothing readable in runs/x")
    for name, (status, text, steps) in expected.items():
        found = check(verdict, name)
        assert found.status == status, found
        assert text in found.detail, found.detail
        assert steps is None or found.failing_steps == steps, found.failing_steps


def test_the_published_run_passes_stock_too_which_has_no_paired_rule(
    patched: Baseline, stock: Baseline
) -> None:
    verdict = judge(evidence(published_values()), stock)
    assert verdict.verdict == "pass", verdict.reason
    assert not [c for c in verdict.checks if c.kind == "paired_mean_diff"]
    assert check(judge(evidence(published_values()), stock), "raw_reward.mean").status == "pass"
    low = check(
        judge(evidence(with_series(patched, REWARD, [0.25] * 20)), stock), "raw_reward.mean"
    )
    assert low.status == "fail" and low.observed == 0.25


def test_a_mean_band_without_and_with_looks(patched: Baseline) -> None:
    values = published_values()
    values[LOGPROB] = [v + 0.0045 for v in values[LOGPROB]]
    result = check(judge(evidence(values), patched, looks=False), "logprob_abs_diff.mean")
    assert result.status == "fail"
    assert "outside [0.01288, 0.02107]" in result.detail  # the written band: no looks
    assert result.numbers["low"] == 0.01288
    # with looks the last look's bound is a little above 4 SE (the looks before it spent a
    # little): the band it is judged with at the end is a little wider
    looked = check(judge(evidence(values), patched), "logprob_abs_diff.mean")
    assert looked.status == "fail"
    assert looked.numbers["low"] < 0.01288 and looked.numbers["high"] > 0.02107


def test_a_paired_reward_drop_fails_inside_the_wider_unpaired_band(patched: Baseline) -> None:
    values = published_values()
    values[REWARD] = [max(0.0, v - 5 / 64) for v in values[REWARD]]  # 5 fewer correct of 64
    verdict = judge(evidence(values), patched, looks=False)
    paired = check(verdict, "raw_reward.paired")
    assert paired.status == "fail"
    # against the level pooled with the stock run's 0.57 on the same prompts
    pooled = -5 / 64 - (0.57 - statistics.fmean(patched.series[REWARD])) / 2
    assert paired.numbers["mean_diff"] == pytest.approx(pooled, abs=1e-4)
    assert paired.numbers["n"] == 20 and paired.numbers["z"] < -3
    assert check(verdict, "raw_reward.mean").status == "pass"


# ---------------------------------------------------------------------------- rollout count


def test_the_rollout_count_rescales_steps_and_bands(patched: Baseline) -> None:
    values = {metric: vs[:3] for metric, vs in published_values().items()}
    verdict = judge(evidence(values), patched, expected_rollouts=3)
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.expected_rollouts == 3
    full = check(judge(evidence(published_values()), patched), "logprob_abs_diff.mean")
    smoke = check(verdict, "logprob_abs_diff.mean")
    assert smoke.numbers["low"] < full.numbers["low"]
    assert smoke.expected != full.expected
    assert check(verdict, "logprob_abs_diff.steps").expected == "train/step 0..2, each once"
    # the same three rollouts against the default 20 fail the step rules
    short = check(judge(evidence(values), patched), "logprob_abs_diff.steps")
    assert short.status == "fail" and "missing train/step 3, 4, 5" in short.detail
    # a longer run pairs only the reference's rollouts and gets a higher max bound
    rewards = published_values()[REWARD]
    long = {LOGPROB: [0.017] * 40, REWARD: rewards + rewards, CLIPFRAC: [0.0] * 40}
    verdict = judge(evidence(long), patched, expected_rollouts=40)
    assert check(verdict, "raw_reward.paired").numbers["n"] == 20
    assert verdict.verdict == "pass", verdict.reason
    longer = {LOGPROB: [0.017] * 1000, REWARD: [0.5, 0.625] * 500, CLIPFRAC: [0.0] * 1000}
    longer[LOGPROB][500] = 0.0275  # above the 20-rollout bound 0.02705, fine for 1000
    verdict = judge(evidence(longer), patched, expected_rollouts=1000)
    assert verdict.verdict == "pass", verdict.reason
    with pytest.raises(ValueError, match="expected_rollouts must be >= 1"):
        judge(evidence(published_values()), patched, expected_rollouts=0)


# ---------------------------------------------------------------------------- fail fast


def test_early_failures_on_a_partial_run(patched: Baseline) -> None:
    """One rollout past the first look: a spike before the look lifts the mean there; the
    reward's NaN after it fails at once, and no look has judged it yet."""
    first = patched.run_shape.looks[0]
    partial = {metric: vs[: first + 1] for metric, vs in published_values().items()}
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

"""The fail-fast watcher on real run dirs: the gate's hard rules, timed on the job's clock."""

from __future__ import annotations

import math

from miles_amd.baseline.model import load_baseline
from miles_amd.judge.gate import early_failures
from miles_amd.run.watcher import FailFastWatcher, Trip, first_metric_line_time, line_time
from miles_amd.run_dir import RunDir
from tests.constants import REWARD
from tests.run_dirs import write_run

ABS_DIFF = "train/train_rollout_logprob_abs_diff"
PATCHED = load_baseline("patched")


def judge(evidence):
    return early_failures(evidence, PATCHED)


def values(n: int, **changes: tuple[int, float]) -> dict[str, list[float]]:
    out = {ABS_DIFF: [0.017] * n, REWARD: [32 / 64] * n}
    for key, (step, value) in changes.items():
        out[{"abs_diff": ABS_DIFF, "reward": REWARD}[key]][step] = value
    return out


def test_a_healthy_run_does_not_trip_a_spike_does_timed_from_the_log(tmp_path) -> None:
    assert FailFastWatcher(write_run(tmp_path / "healthy", values(5)), judge).poll() is None
    run = write_run(tmp_path / "run", values(6, abs_diff=(4, 0.4)))
    trip = FailFastWatcher(run, judge).poll()
    assert trip is not None and trip.rule == "logprob_abs_diff.spikes" and trip.step == 4
    lines = RunDir(run).job_log.read_text().splitlines()
    assert trip.fault_time == first_metric_line_time(lines, 4) is not None


def test_nan_trips_with_the_finite_rule(tmp_path) -> None:
    trip = FailFastWatcher(write_run(tmp_path / "run", values(4, abs_diff=(2, math.nan))), judge)
    tripped = trip.poll()
    assert tripped is not None and tripped.step == 2
    assert tripped.rule in ("logprob_abs_diff.finite", "logprob_abs_diff.spikes")


def test_fatal_sentinel_trips_with_its_line(tmp_path) -> None:
    run = write_run(tmp_path / "run", values(3))
    with RunDir(run).job_log.open("a") as log:
        log.write(
            "(SGLangEngine pid=7) [2026-01-01 00:00:09 TP0] Current LoRA backend does not "
            "support LoRA on MoE layers; skipping MoE layer\n"
        )
    trip = FailFastWatcher(run, judge).poll()
    assert trip is not None and trip.rule.startswith("sentinel.")
    assert trip.line == len(RunDir(run).job_log.read_text().splitlines())
    assert trip.fault_time == line_time("[2026-01-01 00:00:09 TP0]")


def test_a_trip_is_timed_later_when_its_line_arrives_from_miles_or_sglang_stamps() -> None:
    trip = Trip("r", "d", step=3, line=None, fault_time=None, detected_at=0.0)
    assert trip.timed_from([]).fault_time is None
    line = "(MegatronTrainRayActor pid=1) [2026-01-01 00:00:05.250 ] log_utils.py:1 - step 3: {}"
    assert trip.timed_from([line]).fault_time == line_time(line)
    assert line_time("x [2026-01-01 00:00:05.250 ] y") - line_time("[2026-01-01 00:00:05 TP0]") == (
        0.25
    )
    assert line_time("2026-01-01 00:00:05,250 INFO no brackets") is None

"""The whole hardware path on CPU: replayed runs through the real driver, watcher and gate.

The healthy replay PASSes, judged at every look; every fault of ``miles_amd.testing.faults``
ends red with the checks and driver stop its entry names: at once (fail-fast, latency read from
the job's own clock), at the look that decides it, by the timeout, or by itself; the known
sentinel passes and is reported (docs/rehearsal.md).
"""

from __future__ import annotations

import json

import pytest

from miles_amd.app.train import TrainResult
from miles_amd.baseline.model import load_baseline
from miles_amd.records.job import JobRecord
from miles_amd.run.watcher import LOG_TIME
from miles_amd.run_dir import RunDir
from miles_amd.testing.faults import FAULTS
from tests.support.fake_aiter import fake_aiter
from tests.support.rehearsal import expectation_problems, rehearse

pytestmark = pytest.mark.rehearsal

WATCH_INTERVAL_S = 2.0  # must dominate Ray's log streaming lag (about 1 s)
FAIL_FAST = sorted(k for k, f in FAULTS.items() if f.driver_stop == "fail-fast")
AT_A_LOOK = sorted(k for k, f in FAULTS.items() if f.driver_stop == "look")
BY_ITSELF_OR_TIMEOUT = sorted(k for k, f in FAULTS.items() if f.driver_stop in (None, "timeout"))


def test_healthy_replay_passes(healthy_run: TrainResult) -> None:
    result = healthy_run
    assert expectation_problems(None, result) == []
    assert result.outcome.status == "SUCCEEDED" and result.exit_code == 0
    report = json.loads((RunDir(result.outcome.run_dir).report / "report.json").read_text())
    assert report["verdict"] == "pass" and report["expected_rollouts"] == 20
    # judged at every look, decided at none: a healthy run is never stopped early
    looks = list(load_baseline("patched").run_shape.looks)
    assert report["looks"] == looks and report["decided_at_rollout"] is None
    job = JobRecord.from_json(RunDir(result.outcome.run_dir).job_json.read_text())
    assert (job.stopped_by, job.look) == (None, None)
    passed = {c["name"] for c in report["checks"] if c["status"] == "pass"}
    assert {"logprob_abs_diff.spikes", "raw_reward.paired", "job.status"} <= passed
    assert (RunDir(result.outcome.run_dir).report / "metrics.png").stat().st_size > 0


@pytest.mark.parametrize("fault", BY_ITSELF_OR_TIMEOUT)
def test_fault_ends_with_its_reason(fault, cluster_env, tmp_path, state_dir) -> None:
    timeout_s = 8 if fault == "hang" else 120
    result = rehearse(
        cluster_env, tmp_path / "run", fault=fault, timeout_s=timeout_s, state_dir=state_dir
    )
    assert expectation_problems(fault, result) == []
    if fault == "hang":
        assert result.outcome.status == "STOPPED"
    elif FAULTS[fault].fails_run:
        assert result.exit_code == 1 and result.verdict == "fail"
    else:  # the known sentinel passes and is reported
        assert result.verdict == "pass"
        report = RunDir(tmp_path / "run").report
        hits = {h["name"]: h for h in json.loads((report / "report.json").read_text())["sentinels"]}
        assert hits["megatron_moe_router_not_fp32"]["count"] == 8
        assert "megatron_moe_router_not_fp32" in (report / "report.md").read_text()


def watched(fault: str, at: int, cluster_env, tmp_path, state_dir) -> tuple[RunDir, JobRecord]:
    """``fault`` from rollout ``at``, paced for the watcher to see it while the job runs."""
    result = rehearse(
        cluster_env,
        tmp_path / "run",
        fault=fault,
        at=at,
        pace_s=0.5,
        watch_interval_s=WATCH_INTERVAL_S,
        state_dir=state_dir,
    )
    assert expectation_problems(fault, result) == []
    run = RunDir(tmp_path / "run")
    return run, JobRecord.from_json(run.job_json.read_text())


@pytest.mark.parametrize("fault", FAIL_FAST)
def test_fail_fast_stops_within_two_intervals(fault, cluster_env, tmp_path, state_dir) -> None:
    run, job = watched(fault, 3, cluster_env, tmp_path, state_dir)
    assert job.status == "STOPPED" and job.failfast is not None
    # a fault at rollout 3, or (wrong-batch-shape) every rollout from the first
    assert job.failfast["step"] in ((3, None) if FAULTS[fault].uses_at else (0,))
    latency = job.failfast_latency_s
    bound = 2 * WATCH_INTERVAL_S + stamp_resolution_s(run, job)
    assert latency is not None and 0 <= latency <= bound, job
    assert "step 19:" not in run.job_log.read_text(), "the job ran to the end despite the fault"
    report_md = (run.report / "report.md").read_text()
    assert "stopped by fail-fast" in report_md


@pytest.mark.parametrize("fault", AT_A_LOOK)
def test_a_look_stops_the_run_where_it_is_decided(fault, cluster_env, tmp_path, state_dir) -> None:
    run, job = watched(
        fault, 3 if fault == "reward-collapse" else 0, cluster_env, tmp_path, state_dir
    )
    report = json.loads((run.report / "report.json").read_text())
    assert job.status == "STOPPED" and job.stopped_by == "look" and job.look is not None
    assert job.look.rollout == report["decided_at_rollout"] < 20, (job, report)
    assert job.look.rule == report["decided_by"] and job.look.alpha_spent > 0
    assert "step 19:" not in run.job_log.read_text(), "the job ran to the end despite the look"
    report_md = (run.report / "report.md").read_text()
    assert f"decided at the look at rollout {job.look.rollout} of 20" in report_md
    assert f"stopped at the look at rollout {job.look.rollout}: {job.look.rule}" in report_md


def stamp_resolution_s(run: RunDir, job: JobRecord) -> float:
    """How late after its stamp the fault may have appeared: 1 s on SGLang's whole-second
    stamp (the fatal sentinel's line), 1 ms on miles' own."""
    line = (job.failfast or {}).get("line")
    if not isinstance(line, int):
        return 0.001  # a metric line's step: miles stamps it to the millisecond
    match = LOG_TIME.search(run.job_log.read_text().splitlines()[line - 1])
    return 0.001 if match is not None and match.group(2) else 1.0


@pytest.mark.parametrize(
    ("env_name", "layout", "fixed", "status"),
    [
        ("AITER_PATCHED_DIR", "checkout", True, "pass"),  # the patched build the rule chooses
        ("PYTHONPATH", "wheel", False, "fail"),  # a stock aiter under the patched label
    ],
)
def test_the_replayed_job_records_the_aiter_its_runtime_env_imports(
    env_name, layout, fixed, status, cluster_env, tmp_path, state_dir
) -> None:
    """The job's own ``MILES_AMD_AITER_FIX`` line names the fake aiter's header (its runtime
    env's PYTHONPATH); the gate's allreduce.fix reads it."""
    entry, header = fake_aiter(tmp_path / "aiter", fixed=fixed, layout=layout)
    env = {**cluster_env, env_name: str(entry)}
    result = rehearse(
        env, tmp_path / "run", num_rollout=3, state_dir=state_dir, aiter_variant="patched"
    )
    run = RunDir(tmp_path / "run")
    log = run.job_log.read_text().splitlines()
    lines = [line for line in log if line.startswith("MILES_AMD_AITER_FIX ")]
    assert len(lines) == 1, lines
    value = json.loads(lines[0].removeprefix("MILES_AMD_AITER_FIX "))["value"]
    assert value.startswith(f"{'fixed' if fixed else 'not fixed'}: {header} sha256:"), value
    report = json.loads((run.report / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "allreduce.fix"]
    assert check["status"] == status, check["detail"]
    if status == "fail":
        assert f"job: patched run on not fixed: {header}" in check["detail"]
        assert result.exit_code == 1

"""The whole hardware path on CPU: replayed runs through the real driver, watcher and gate.

The healthy replay of the embedded jvvnhop9 run must PASS against the patched baseline,
judged at every look and run to its last rollout; every fault of ``miles_amd.testing.faults``
must end red with the gate checks and the driver stop its catalogue entry names (never
PASS): at once (fail-fast), at the first look that decides it (a reward collapse, a doubled
KL: stopped before rollout 20, job.json and the report naming the look), by the timeout, or
by itself; the known-issue sentinel passes and is reported.
Fail-fast latency is read from the job's own clock (its log stamps and the driver's stop
request in job.json), never from sleeps in the test.
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

# The watcher sees log signatures only after Ray streams the job's log (about 1 s behind):
# the interval must dominate that. SGLang stamps its lines to the whole second, which the
# latency bound allows for (stamp_resolution_s).
WATCH_INTERVAL_S = 2.0
FAIL_FAST = sorted(k for k, f in FAULTS.items() if f.driver_stop == "fail-fast")
AT_A_LOOK = sorted(k for k, f in FAULTS.items() if f.driver_stop == "look")
# The known sentinel ends by itself too; its own test below runs it once.
ENDS_BY_ITSELF = sorted(
    k for k, f in FAULTS.items() if f.driver_stop is None and k != "known-sentinel"
)


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


@pytest.mark.parametrize("fault", ENDS_BY_ITSELF)
def test_fault_ends_red_with_its_reason(fault, cluster_env, tmp_path, state_dir) -> None:
    result = rehearse(cluster_env, tmp_path / "run", fault=fault, state_dir=state_dir)
    assert expectation_problems(fault, result) == []
    if FAULTS[fault].fails_run:
        assert result.exit_code == 1 and result.verdict == "fail"


def test_known_sentinel_passes_and_is_reported(cluster_env, tmp_path, state_dir) -> None:
    result = rehearse(cluster_env, tmp_path / "run", fault="known-sentinel", state_dir=state_dir)
    assert expectation_problems("known-sentinel", result) == []
    assert result.verdict == "pass"
    run = RunDir(tmp_path / "run")
    report = json.loads((run.report / "report.json").read_text())
    hits = {h["name"]: h for h in report["sentinels"]}
    assert hits["megatron_moe_router_not_fp32"]["count"] == 8
    assert "megatron_moe_router_not_fp32" in (run.report / "report.md").read_text()


def watched(fault: str, at: int, cluster_env, tmp_path, state_dir) -> tuple[RunDir, JobRecord]:
    """``fault`` from rollout ``at``, paced for the watcher to see it while the job runs: the
    run dir and its job.json, once the fault's catalogue entry is what the run showed."""
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
    """Stopped by the driver at the first look whose statistic crosses its boundary (a
    reward collapse from rollout 3, the KL doubled from the start: at rollout 6), not at
    20; job.json records the look and the rule, and the report says the same."""
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
    """How much later than its stamp the fault may have appeared: 1 s on a whole-second
    stamp (SGLang's, as on the fatal sentinel's line), 1 ms on miles' own. The latency in
    job.json is measured from the stamp, so it overstates the true latency by up to this."""
    line = (job.failfast or {}).get("line")
    if not isinstance(line, int):
        return 0.001  # a metric line's step: miles stamps it to the millisecond
    match = LOG_TIME.search(run.job_log.read_text().splitlines()[line - 1])
    return 0.001 if match is not None and match.group(2) else 1.0


def test_hang_is_stopped_by_the_timeout(cluster_env, tmp_path, state_dir) -> None:
    result = rehearse(cluster_env, tmp_path / "run", fault="hang", timeout_s=8, state_dir=state_dir)
    assert expectation_problems("hang", result) == []
    assert result.outcome.status == "STOPPED"


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
    """The job's own line (``miles_amd.aiter_fix`` inside the submitted job, with its runtime
    env's PYTHONPATH) names the fake aiter's header; the gate's allreduce.fix reads it."""
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

"""Issue 26 items 6 and 7 on job.json: a record that contradicts itself fails; on the hardware
path (``--require-env``) a run dir without job.json fails naming job.json and the fix.

Through the real CLI (typer's CliRunner on ``miles-amd gate``) on a copy of the example run;
the property test draws job.json records and asserts the gate's contract for each.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.records.job import JOB_STATES, STOP_REASONS, JobRecord
from tests.constants import EXAMPLE

pytestmark = pytest.mark.unit


def copy_example(root: Path) -> Path:
    run_dir = root / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
    return run_dir


def gate(run_dir: Path, *extra: str):
    args = ["gate", "--run-dir", str(run_dir), "--baseline", "patched", "--no-history", *extra]
    return CliRunner().invoke(app, args)


def job_check(run_dir: Path) -> dict:
    report = json.loads((run_dir / "report" / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "job.status"]
    return check


def write_job(run_dir: Path, **changes: object) -> None:
    record = json.loads((run_dir / "job.json").read_text())
    record.update(changes)
    (run_dir / "job.json").write_text(json.dumps(record))


def test_the_example_passes_with_its_job_json() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = copy_example(Path(scratch))
        result = gate(run_dir)
        assert result.exit_code == 0, result.output
        assert job_check(run_dir)["status"] == "pass"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"driver_exit_code": 137}, "driver exit code 137"),
        (
            {"stopped_by": "fail-fast", "failfast": {"rule": "logprob_abs_diff.spikes"}},
            "stopped by the driver (fail-fast)",
        ),
        ({"failfast": {"rule": "x"}}, "a fail-fast trip is recorded"),
    ],
)
def test_a_succeeded_record_that_contradicts_itself_fails(changes: dict, reason: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = copy_example(Path(scratch))
        write_job(run_dir, **changes)
        result = gate(run_dir)
        assert result.exit_code == 1, result.output
        check = job_check(run_dir)
        assert check["status"] == "fail"
        assert f"job.json contradicts itself: status SUCCEEDED but {reason}" in check["detail"]


def test_require_env_fails_a_run_dir_without_job_json_naming_it_and_the_fix() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = copy_example(Path(scratch))
        (run_dir / "job.json").unlink()
        assert gate(run_dir).exit_code == 0  # off the hardware path: optional, not measured
        assert job_check(run_dir)["status"] == "not_measured"
        result = gate(run_dir, "--require-env")
        assert result.exit_code == 1, result.output
        check = job_check(run_dir)
        assert check["status"] == "fail"
        assert "no job.json" in check["detail"] and "--require-env" in check["detail"]
        assert "fix:" in check["detail"]


records = st.fixed_dictionaries(
    {
        "status": st.sampled_from(sorted(JOB_STATES)),
        "driver_exit_code": st.one_of(st.none(), st.sampled_from([0, 1, 137, -9, 255])),
        "stopped_by": st.one_of(st.none(), st.sampled_from(sorted(STOP_REASONS))),
        "failfast": st.one_of(st.none(), st.just({"rule": "logprob_abs_diff.spikes", "step": 3})),
    }
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=records, require_env=st.booleans(), drop=st.booleans())
def test_the_gate_passes_only_a_consistent_succeeded_record(
    record: dict, require_env: bool, drop: bool
) -> None:
    """Exit 0/1/2 only, no traceback; a pass needs a SUCCEEDED record that agrees with itself
    (and, with --require-env, a job.json at all); nothing written outside the run dir."""
    if record["stopped_by"] == "look":  # a stop at a look records its look (JobRecord.look)
        look = {"rollout": 10, "rule": "train_rollout_kl.mean", "alpha_spent": 0.0005}
        record = {**record, "look": look}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        run_dir = copy_example(root)
        write_job(run_dir, **record)
        if drop:
            (run_dir / "job.json").unlink()
        result = gate(run_dir, *(["--require-env"] if require_env else []))
        assert result.exit_code in (0, 1, 2), result.output
        assert "Traceback" not in result.output
        assert sorted(p.name for p in root.iterdir()) == ["run"]
        job_ok = not drop and (
            JobRecord.from_dict({"job_id": "jvvnhop9", **record}).contradiction is None
            and record["status"] == "SUCCEEDED"
        )
        shown = "pass" if job_ok else ("not_measured" if drop and not require_env else "fail")
        assert job_check(run_dir)["status"] == shown, (record, drop, require_env)
        if require_env:  # the example has no env.json: the hardware path fails it regardless
            assert result.exit_code == 1
        else:
            assert result.exit_code == (0 if job_ok or drop else 1), (record, result.output)

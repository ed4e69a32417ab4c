"""``job.json``'s model: what the driver writes reads back equal; a bad field is named."""

from __future__ import annotations

import pytest

from miles_amd.files import atomic_write_text
from miles_amd.records.job import JobRecord, LookStop
from miles_amd.run_dir import RunDir
from tests.support.rehearsal import EXAMPLE_RUN

pytestmark = pytest.mark.unit

STOPPED = JobRecord(
    job_id="miles-amd-0123456789ab",
    status="STOPPED",
    message="Job was intentionally stopped.",
    start_time=1_767_225_600.25,
    end_time=1_767_225_700.5,
    driver_exit_code=None,
    stopped_by="fail-fast",
    stop_requested_at=1_767_225_699.0,
    failfast={"rule": "logprob_abs_diff.spikes", "step": 3, "line": None},
    failfast_latency_s=1.75,
    final_log_error="the final log could not be fetched from the job's node (gone)",
)


LOOK = (
    '{"job_id": "j", "status": "STOPPED", "stopped_by": "look", "look": '
    '{"rollout": 10, "rule": "train_rollout_kl.mean", "alpha_spent": 0.000473}}'
)


def test_records_read_back_equal(tmp_path) -> None:
    run = RunDir(tmp_path / "run")
    atomic_write_text(run.job_json, STOPPED.to_json())  # as the driver writes it
    assert JobRecord.from_json(run.job_json.read_text()) == STOPPED
    assert JobRecord.from_json(run.job_json.read_bytes()) == STOPPED
    example = JobRecord.from_json(RunDir(EXAMPLE_RUN).job_json.read_text())
    assert example.status == "SUCCEEDED" and example.driver_exit_code == 0
    minimal = JobRecord.from_json('{"job_id": "raysubmit_x", "status": "FAILED", "extra": 1}')
    assert minimal == JobRecord("raysubmit_x", "FAILED")
    record = JobRecord.from_json(LOOK)  # a stop at a look, with its look and rule
    assert record.stopped_by == "look"
    assert record.look == LookStop(10, "train_rollout_kl.mean", 0.000473)
    assert JobRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[]", "expected a JSON object"),
        ("{", "line 1 column 2: invalid JSON"),
        ('{"job_id": "j", "job_id": "k", "status": "FAILED"}', "duplicate key 'job_id'"),
        ('{"status": "SUCCEEDED"}', '"job_id"'),
        ('{"job_id": "j", "status": "DONE"}', '"status"'),
        ('{"job_id": "j", "status": "FAILED", "message": 3}', '"message"'),
        ('{"job_id": "j", "status": "FAILED", "end_time": 1e999}', r"\$\.end_time: non-finite"),
        ('{"job_id": "j", "status": "FAILED", "start_time": NaN}', r"\$\.start_time: non-finite"),
        ('{"job_id": "j", "status": "FAILED", "driver_exit_code": true}', '"driver_exit_code"'),
        ('{"job_id": "j", "status": "STOPPED", "stopped_by": "user"}', '"stopped_by"'),
        ('{"job_id": "j", "status": "STOPPED", "failfast": "spike"}', '"failfast"'),
        # a stop at a look: stopped_by "look" exactly with its look, each field checked
        ('{"job_id": "j", "status": "STOPPED", "stopped_by": "look"}', '"look" must be an'),
        (
            '{"job_id": "j", "status": "STOPPED", "stopped_by": "timeout", "look": '
            '{"rollout": 5, "rule": "r", "alpha_spent": 0.001}}',
            '"look" must be an object exactly when',
        ),
        (LOOK.replace('"rollout": 10', '"rollout": 0'), r'"look\.rollout"'),
        (LOOK.replace('"rollout": 10', '"rollout": true'), r'"look\.rollout"'),
        (LOOK.replace('"rule": "train_rollout_kl.mean"', '"rule": ""'), r'"look\.rule"'),
        (LOOK.replace('"alpha_spent": 0.000473', '"alpha_spent": 1.5'), r'"look\.alpha_spent"'),
        (LOOK.replace('"alpha_spent": 0.000473', '"alpha_spent": "x"'), r'"look\.alpha_spent"'),
        (LOOK.replace('"look": {', '"look": [{').replace("}}", "}]}"), '"look" must be an object'),
    ],
)
def test_a_bad_record_names_its_field(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("(", r"\(")):
        JobRecord.from_json(text)


class LostNodeClient:
    """Ray's Jobs API as seen once the job's node is gone: the head still answers for the
    job's state, but fetching its log from the node's agent fails (as aiohttp did in CI)."""

    def get_job_logs(self, job_id: str) -> str:
        raise RuntimeError(
            "Cannot connect to host 192.0.2.2:46195 ssl:default [Connect call failed]\nmore"
        )

    def get_job_info(self, job_id: str) -> object:
        from types import SimpleNamespace

        failed = SimpleNamespace(value="FAILED")
        return SimpleNamespace(
            status=failed, message="node died", start_time=1, end_time=2, driver_exit_code=None
        )


def test_a_lost_node_keeps_the_streamed_log_and_names_why_it_is_partial(tmp_path) -> None:
    from miles_amd.run.driver import RayJob

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.job_log.write_text("step 1\nstep 2")
    record = RayJob(LostNodeClient(), "miles-amd-x", run).write_final()
    assert record.status == "FAILED" and record.final_log_error is not None
    assert "192.0.2.2:46195" in record.final_log_error and "more" not in record.final_log_error
    assert JobRecord.from_json(run.job_json.read_text()) == record
    lines = run.job_log.read_text().splitlines()
    assert lines[:2] == ["step 1", "step 2"] and lines[2].startswith("[miles-amd] the final log")

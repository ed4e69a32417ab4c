"""A run directory read into RunEvidence: every source, every problem named."""

from __future__ import annotations

import gc
import io
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import Conflict, JobRecord, PlanRecord, SourceProblem
from miles_amd.testing.miles_writer import ActorPids, MilesRunWriter

ROLLOUTS = [
    {
        "train/train_rollout_logprob_abs_diff": 0.0208 - k / 1000,
        "train/grad_norm": 0.1 + k,
        "rollout/raw_reward": (32 + k) / 64,
        "rollout/response_len/mean": 2900.0 + k,
        "perf/rollout_time": math.nan if k == 2 else 95.0,
    }
    for k in range(4)
]
JOB = {
    "job_id": "raysubmit_abc",
    "status": "SUCCEEDED",
    "message": "Job finished successfully.",
    "start_time": 1.78e9,
    "end_time": 1.78e9 + 3960.5,
    "driver_exit_code": 0,
    "stopped_by": None,
}


def f32(value: float) -> float:
    return float(np.float32(value))


def write_run(
    root: Path, *, tensorboard: bool = True, ci_history: bool = True, log: bool = True
) -> Path:
    """A run directory as a real run leaves it: miles' three formats, job.json, env.json."""
    root.mkdir(parents=True, exist_ok=True)
    stream = io.StringIO()
    writer = MilesRunWriter(
        root / "tensorboard" if tensorboard else None,
        root / "ci_history" if ci_history else None,
        stream,
        pids=ActorPids.around(4200),
        clock=lambda: 1.78e9,
    )
    for k, metrics in enumerate(ROLLOUTS):
        writer.emit_rollout(k, metrics)
    writer.close()
    if log:
        (root / "job.log").write_text("Job started\n" + stream.getvalue(), encoding="utf-8")
    (root / "job.json").write_text(json.dumps(JOB), encoding="utf-8")
    env = {
        "facts": [{"name": "rocm", "status": "ok", "value": "7.2.0 (/opt/rocm/.info/version)"}],
        "ok": True,
        "aiter_variant": "patched",
    }
    (root / "env.json").write_text(json.dumps(env), encoding="utf-8")
    plan = {"recipe": {"num_rollout": 20}, "aiter_variant": "patched"}
    (root / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    return root


def test_a_complete_run_reads_every_source(tmp_path: Path) -> None:
    evidence = load_run(write_run(tmp_path / "run"))

    assert evidence.problems == () and evidence.conflicts == ()
    assert evidence.run_dir == str(tmp_path / "run")
    diff = evidence.series["train/train_rollout_logprob_abs_diff"]
    assert diff == tuple((k, f32(0.0208 - k / 1000)) for k in range(4))  # TensorBoard: float32
    assert evidence.sources["train/train_rollout_logprob_abs_diff"] == "tensorboard"
    assert evidence.sources["train/step"] == "job_log"  # only the log prints it
    assert math.isnan(evidence.series["perf/rollout_time"][2][1])
    assert evidence.job == JobRecord(
        job_id="raysubmit_abc",
        status="SUCCEEDED",
        message="Job finished successfully.",
        start_time=1.78e9,
        end_time=1.78e9 + 3960.5,
        driver_exit_code=0,
    )
    assert evidence.env is not None and evidence.env.problems == ()
    assert (evidence.env.rocm, evidence.env.aiter_variant, evidence.env.ok) == (
        "7.2",
        "patched",
        True,
    )
    assert evidence.plan == PlanRecord({"num_rollout": 20}, "patched")
    assert evidence.sentinels == ()


def test_a_missing_run_dir_or_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"run directory .*absent does not exist"):
        load_run(tmp_path / "absent")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file; pass the run's directory"):
        load_run(tmp_path / "file")


def biggest_event_file(root: Path) -> Path:
    return max((root / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_size)


def flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_damaged_event_file_is_a_problem_and_the_other_sources_still_count(
    tmp_path: Path,
) -> None:
    root = write_run(tmp_path / "run")
    event_file = biggest_event_file(root)
    flip_middle(event_file)
    (problem,) = load_run(root).problems
    assert problem.source == "tensorboard" and problem.path == str(event_file)
    assert "CRC mismatch" in problem.detail and problem.detail.startswith("offset ")
    assert load_run(root).sources["rollout/raw_reward"] == "ci_history"
    assert load_run(root).sources["perf/rollout_time"] == "job_log"
    root = write_run(tmp_path / "cut")
    biggest_event_file(root).write_bytes(biggest_event_file(root).read_bytes()[:-5])
    (problem,) = load_run(root).problems
    assert problem.source == "tensorboard" and "truncated" in problem.detail
    live = load_run(root, live=True)  # the write in flight
    assert live.problems == () and live.sources["perf/rollout_time"] == "tensorboard"


def test_empty_or_absent_metric_sources_are_problems_unless_live(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "tensorboard").mkdir(parents=True)
    (root / "ci_history").mkdir()
    (root / "job.log").write_text("no metrics here\n")
    evidence = load_run(root)
    assert [(p.source, p.detail.split(" (")[0]) for p in evidence.problems] == [
        ("tensorboard", "no event files"),
        ("ci_history", "no *.jsonl records"),
        ("job_log", "no metric lines"),
    ]
    assert evidence.series == {} and load_run(root, live=True).problems == ()
    writer = EventFileWriter(str(root / "tensorboard"))
    writer.add_event(Event(step=1))
    writer.close()
    (root / "ci_history" / "1.jsonl").write_text("\n")
    assert [p.detail for p in load_run(root).problems][:2] == [
        "the event files hold no scalar summaries",
        "the records hold no points",
    ]
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "job.json").write_text(json.dumps(JOB))
    evidence = load_run(bare)
    assert evidence.problems == (
        SourceProblem(
            "run_dir",
            str(bare),
            "no metric source (tensorboard/, ci_history/ or job.log) in the run directory",
        ),
    )
    assert evidence.job is not None and evidence.job.status == "SUCCEEDED"


@pytest.mark.parametrize(
    ("name", "text", "detail"),
    [
        ("job.json", "{not json", "line 1 column 2: invalid JSON"),
        ("job.json", "[1, 2]", "expected a JSON object, found list"),
        ("job.json", json.dumps({**JOB, "status": "succeeded"}), '"status" must be one of'),
        ("job.json", json.dumps({**JOB, "job_id": ""}), '"job_id" must be a non-empty string'),
        ("job.json", json.dumps({**JOB, "end_time": "late"}), '"end_time" must be a finite'),
        ("job.json", json.dumps({**JOB, "message": 3}), '"message" must be a string'),
        ("env.json", '"just a string"', "expected a JSON object, found str"),
        ("plan.json", json.dumps({"recipe": 3}), '"recipe"'),
        ("canary.json", "{}", '"schema_version" must be present, found nothing'),
    ],
)
def test_a_malformed_record_is_a_problem_naming_the_field(
    tmp_path: Path, name: str, text: str, detail: str
) -> None:
    root = write_run(tmp_path / "run")
    (root / name).write_text(text)
    evidence = load_run(root)
    record = name.replace(".", "_")
    assert getattr(evidence, record.removesuffix("_json")) is None
    (problem,) = evidence.problems
    assert (problem.source, problem.path) == (record, str(root / name))
    assert detail in problem.detail


def test_missing_records_are_none_not_problems(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    for name in ("job.json", "env.json", "plan.json"):
        (root / name).unlink()
    evidence = load_run(root)
    assert (evidence.job, evidence.env, evidence.plan, evidence.canary) == (None,) * 4
    assert evidence.problems == ()


def test_sources_that_disagree_are_conflicts(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    log = root / "job.log"
    log.write_text(log.read_text().replace("'train/grad_norm': 1.1", "'train/grad_norm': 1.3"))
    assert load_run(root).conflicts == (
        Conflict(
            "train/grad_norm", 1, {"tensorboard": f32(1.1), "ci_history": 1.1, "job_log": 1.3}
        ),
    )


def test_an_unreadable_log_line_is_a_problem_and_sentinels_are_attached(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    with (root / "job.log").open("a") as log:
        log.write("(SGLangEngine pid=1) Current LoRA backend does not support LoRA on MoE layers\n")
        log.write("(MegatronTrainRayActor pid=1) [x ] log_utils.py:1 - step 9: {'train/a': 1e\n")
    evidence = load_run(root)
    (problem,) = evidence.problems
    assert problem.source == "job_log" and problem.detail.startswith("line ")
    (hit,) = evidence.sentinels
    assert hit.name == "sglang_lora_skips_moe"
    assert f"line {hit.first_line + 1}:" in problem.detail


def test_reading_in_a_thread_leaves_the_garbage_collector_alone(tmp_path: Path) -> None:
    """The watcher reads in a thread beside the driver: the process-wide collector must not
    be switched off under the other thread (an earlier speed trick did that)."""
    root = write_run(tmp_path / "run")
    done, seen_disabled = threading.Event(), threading.Event()

    def read() -> None:
        for _ in range(20):
            load_run(root)
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    while not done.is_set():
        if not gc.isenabled():
            seen_disabled.set()
    reader.join()
    assert gc.isenabled() and not seen_disabled.is_set()

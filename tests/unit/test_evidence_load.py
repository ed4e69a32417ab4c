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


def test_a_missing_run_dir_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"run directory .*absent does not exist"):
        load_run(tmp_path / "absent")


def test_a_corrupt_event_file_is_a_problem_and_the_other_sources_still_count(
    tmp_path: Path,
) -> None:
    root = write_run(tmp_path / "run")
    event_file = max(
        (root / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_size
    )
    data = bytearray(event_file.read_bytes())
    data[len(data) // 2] ^= 0x40
    event_file.write_bytes(bytes(data))

    evidence = load_run(root)

    (problem,) = evidence.problems
    assert problem.source == "tensorboard" and problem.path == str(event_file)
    assert "CRC mismatch" in problem.detail and problem.detail.startswith("offset ")
    assert evidence.sources["rollout/raw_reward"] == "ci_history"
    assert evidence.sources["train/train_rollout_logprob_abs_diff"] == "ci_history"
    assert evidence.sources["perf/rollout_time"] == "job_log"


def test_a_truncated_event_file_is_a_problem_unless_the_run_is_live(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    event_file = max(
        (root / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_size
    )
    event_file.write_bytes(event_file.read_bytes()[:-5])

    strict = load_run(root)
    assert [p.source for p in strict.problems] == ["tensorboard"]
    assert "truncated" in strict.problems[0].detail

    live = load_run(root, live=True)
    assert live.problems == ()
    assert live.sources["perf/rollout_time"] == "tensorboard"


def test_empty_metric_sources_are_problems(tmp_path: Path) -> None:
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
    assert evidence.series == {}
    assert load_run(root, live=True).problems == ()


def test_event_files_without_scalars_are_a_problem(tmp_path: Path) -> None:
    root = tmp_path / "run"
    writer = EventFileWriter(str(root / "tensorboard"))
    writer.add_event(Event(step=1))
    writer.close()
    (problem,) = load_run(root).problems
    assert problem == SourceProblem(
        "tensorboard", str(root / "tensorboard"), "the event files hold no scalar summaries"
    )


def test_a_run_dir_without_any_metric_source_is_a_problem(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    (root / "job.json").write_text(json.dumps(JOB))
    evidence = load_run(root)
    assert [p.source for p in evidence.problems] == ["run_dir"]
    assert evidence.job is not None and evidence.job.status == "SUCCEEDED"


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("{not json", "line 1 column 2: invalid JSON"),
        ("[1, 2]", "expected a JSON object, found list"),
        (json.dumps({**JOB, "status": "succeeded"}), '"status" must be one of'),
        (json.dumps({k: v for k, v in JOB.items() if k != "job_id"}), '"job_id" must be'),
        (json.dumps({**JOB, "end_time": "late"}), '"end_time" must be a finite number'),
        (json.dumps({**JOB, "message": 3}), '"message" must be a string'),
    ],
)
def test_a_malformed_job_json_is_a_problem(tmp_path: Path, text: str, detail: str) -> None:
    root = write_run(tmp_path / "run")
    (root / "job.json").write_text(text)
    evidence = load_run(root)
    assert evidence.job is None
    (problem,) = evidence.problems
    assert problem.source == "job_json" and problem.path == str(root / "job.json")
    assert detail in problem.detail


def test_a_malformed_env_json_is_a_problem(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    (root / "env.json").write_text('"just a string"')
    evidence = load_run(root)
    assert evidence.env is None
    assert [(p.source, p.detail) for p in evidence.problems] == [
        ("env_json", "expected a JSON object, found str")
    ]


def test_missing_job_and_env_json_are_none_not_problems(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    (root / "job.json").unlink()
    (root / "env.json").unlink()
    evidence = load_run(root)
    assert (evidence.job, evidence.env, evidence.problems) == (None, None, ())


def test_sources_that_disagree_are_conflicts(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    log = root / "job.log"
    log.write_text(log.read_text().replace("'train/grad_norm': 1.1", "'train/grad_norm': 1.3"))
    evidence = load_run(root)
    assert evidence.conflicts == (
        Conflict(
            "train/grad_norm",
            1,
            {"tensorboard": f32(1.1), "ci_history": 1.1, "job_log": 1.3},
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
    assert [hit.name for hit in evidence.sentinels] == ["sglang_lora_skips_moe"]
    assert evidence.sentinels[0].first_line == problem_line(problem) - 1


def problem_line(problem: SourceProblem) -> int:
    return int(problem.detail.split(":")[0].removeprefix("line "))


def test_reading_in_a_thread_leaves_the_garbage_collector_alone(tmp_path: Path) -> None:
    """The watcher reads in a thread beside the driver: the process-wide collector must not
    be switched off under the other thread (an earlier speed trick did that)."""
    root = write_run(tmp_path / "run")
    seen_disabled = threading.Event()
    done = threading.Event()

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


def test_the_reader_spells_no_run_dir_file_name_itself() -> None:
    """The layout has one owner (``miles_amd.run_dir.RunDir``); load.py only asks it."""
    import ast

    import miles_amd.evidence.load as load
    from miles_amd.run_dir import RunDir

    names = {path.name for path in RunDir(Path("/r")).evidence} | {"env.json"}
    tree = ast.parse(Path(load.__file__).read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    spelled = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and node.value in names - {"tensorboard", "ci_history"}
    }
    assert spelled == set()

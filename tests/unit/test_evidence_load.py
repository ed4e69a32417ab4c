"""A run directory read into RunEvidence: every source, every problem named; the normal form
of a series and one series per metric across sources, with the steps where they disagree."""

from __future__ import annotations

import io
import json
import math
from array import array
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from miles_amd.evidence.load import load_run, merge_sources, values_agree
from miles_amd.evidence.types import (
    Conflict,
    JobRecord,
    PlanRecord,
    SourceProblem,
    columns_to_series,
)
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
    """What TensorBoard's float32 ``simple_value`` gives back (inf beyond float32's range)."""
    with np.errstate(over="ignore"):
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
        ("job.json", json.dumps({**JOB, "status": "succeeded"}), '"status" must be one of'),
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


points = st.lists(st.tuples(st.integers(-5, 5), st.floats(allow_nan=False)), max_size=30)


@given(points)
def test_the_normal_form_sorts_stably_keep_every_point_and_type_it(
    raw: list[tuple[int, float]],
) -> None:
    logged = [int(v) if v.is_integer() and abs(v) < 2**53 else v for _, v in raw]  # as JSON
    series = columns_to_series({"m": ([s for s, _ in raw], array("d", logged))}).get("m", ())
    assert sorted(series) == sorted(raw)  # a permutation: nothing dropped or added
    assert [s for s, _ in series] == sorted(s for s, _ in raw)
    for step in {s for s, _ in raw}:  # equal steps keep the order they were read in
        assert [v for s, v in series if s == step] == [v for s, v in raw if s == step]
    assert all(type(step) is int and type(value) is float for step, value in series)


def test_nan_survives_and_metrics_without_points_are_left_out() -> None:
    columns = columns_to_series({"b": ([1, 0], array("d", [math.nan, 1])), "a": ([], array("d"))})
    assert list(columns) == ["b"] and columns["b"][0] == (0, 1.0)
    assert math.isnan(columns["b"][1][1])


MERGES = {
    "preference: tensorboard, ci_history, job_log": (
        {
            "job_log": {"a": ((0, 0.1),), "b": ((0, 2.0),), "c": ((0, 3.0),)},
            "ci_history": {"a": ((0, 0.1),), "b": ((0, 2.0),)},
            "tensorboard": {"a": ((0, f32(0.1)),)},
        },
        {"a": ((0, f32(0.1)),), "b": ((0, 2.0),), "c": ((0, 3.0),)},
        {"a": "tensorboard", "b": "ci_history", "c": "job_log"},
        (),
    ),
    "a disagreement names every source at that step": (
        {
            "tensorboard": {"m": ((0, 1.0), (1, 2.0))},
            "ci_history": {"m": ((0, 1.0), (1, 2.0))},
            "job_log": {"m": ((0, 1.0), (1, 2.5))},
        },
        {"m": ((0, 1.0), (1, 2.0))},
        {"m": "tensorboard"},
        (Conflict("m", 1, {"tensorboard": 2.0, "ci_history": 2.0, "job_log": 2.5}),),
    ),
    "a step the preferred source lacks: not filled, still compared": (
        {
            "tensorboard": {"m": ((0, 1.0), (2, 3.0))},
            "ci_history": {"m": ((0, 1.0), (1, 2.0), (2, 3.0))},
            "job_log": {"m": ((0, 1.0), (1, 9.0), (2, 3.0))},
        },
        {"m": ((0, 1.0), (2, 3.0))},
        {"m": "tensorboard"},
        (Conflict("m", 1, {"ci_history": 2.0, "job_log": 9.0}),),
    ),
    "a duplicate within one source is no conflict": (
        {
            "tensorboard": {"m": ((0, 1.0), (1, 2.0), (1, 7.0))},
            "job_log": {"m": ((0, 1.0), (1, 7.0))},
        },
        {"m": ((0, 1.0), (1, 2.0), (1, 7.0))},
        {"m": "tensorboard"},
        (),
    ),
}


@pytest.mark.parametrize("case", MERGES, ids=list(MERGES))
def test_merging(case: str) -> None:
    per_source, series, sources, conflicts = MERGES[case]
    assert merge_sources(per_source) == (series, sources, conflicts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "agree"),
    [
        (math.nan, math.nan, True),
        (math.inf, math.inf, True),
        (-math.inf, math.inf, False),
        (math.inf, 1e39, False),  # float32 overflow: TensorBoard says inf, the log a number
        (math.nan, 0.0, False),
        (0.0, -0.0, True),
        (f32(0.1), 0.1, True),
        (1.0, 1.0 + 2e-6, False),
        (0.0, 1e-40, True),  # below float32's normal range
        (0.0, 1e-30, False),
    ],
)
def test_float_noise_tolerance(a: float, b: float, agree: bool) -> None:
    assert values_agree(a, b) is agree and values_agree(b, a) is agree
    _, _, conflicts = merge_sources(
        {"tensorboard": {"m": ((0, 0.5), (1, a))}, "job_log": {"m": ((0, 0.5), (1, b))}}
    )
    assert (conflicts == ()) is agree


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20))
def test_float32_storage_of_a_logged_value_is_never_a_conflict(values: list[float]) -> None:
    logged = tuple(enumerate(values))
    stored = tuple((step, f32(value)) for step, value in logged)
    _, _, conflicts = merge_sources({"tensorboard": {"m": stored}, "job_log": {"m": logged}})
    overflowed = {s for s, v in logged if math.isfinite(v) and math.isinf(f32(v))}
    assert {c.step for c in conflicts} == overflowed


point_lists = st.lists(
    st.tuples(
        st.integers(0, 6),
        st.sampled_from([0.0, -0.0, 1.0, f32(0.1), 0.1, 0.1 + 1e-9, 2.0, math.nan, math.inf]),
    ),
    max_size=8,
)


@given(point_lists, point_lists)
def test_conflicts_are_exactly_the_steps_where_values_disagree(a: list, b: list) -> None:
    """The fast whole-series check never hides a disagreement the point rule would find."""
    preferred = tuple(sorted(a, key=lambda p: p[0]))
    other = tuple(sorted(b, key=lambda p: p[0]))
    _, _, conflicts = merge_sources({"tensorboard": {"m": preferred}, "job_log": {"m": other}})
    expected = set()
    for step in {s for s, _ in preferred} & {s for s, _ in other}:
        reference = [v for s, v in preferred if s == step]
        if any(not any(values_agree(r, v) for r in reference) for s, v in other if s == step):
            expected.add(step)
    assert {c.step for c in conflicts} == expected

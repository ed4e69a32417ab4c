"""MilesRunWriter's three formats, read back with the strict readers and TensorBoard's own
EventAccumulator."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest

from miles_amd.evidence.ci_history import read_ci_history_dir
from miles_amd.evidence.load import load_run
from miles_amd.evidence.tensorboard import read_tensorboard_dir
from miles_amd.evidence.types import SeriesMap
from miles_amd.testing.miles_writer import (
    CI_CAPTURED_KEYS,
    ActorPids,
    MilesRunWriter,
    ci_history_text,
    format_log_time,
    log_kind,
    metric_log_lines,
)

PIDS = ActorPids(trainers=tuple(range(4242, 4250)), rollout_manager=4100, sglang_engine=4300)
FIXED_TIME = 1_795_000_000.25  # a fixed clock: reproducible timestamps

ROLLOUTS = [
    {
        "perf/rollout_time": 101.5 + k,
        "rollout/response_len/mean": 2900.0 + 10 * k,
        "rollout/truncated_ratio": 0.40625,
        "rollout/raw_reward": (32 + k) / 64,
        "rollout/log_probs": -0.31 - k / 100,
        "train/loss": 0.001 * (k + 1),
        "train/pg_clipfrac": 0.0,
        "train/train_rollout_logprob_abs_diff": 0.0208 - k / 1000,
        "train/train_rollout_kl": 6.95e-4 + k * 1e-5,
        "train/grad_norm": 0.12 + k / 10,
        "train/ppo_kl": 0.0,
    }
    for k in range(3)
]


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def write_run(tmp_path: Path, rollouts: list[dict[str, float]]) -> tuple[str, MilesRunWriter]:
    stream = io.StringIO()
    writer = MilesRunWriter(
        tmp_path / "tensorboard",
        tmp_path / "ci_history",
        stream,
        pids=PIDS,
        clock=lambda: FIXED_TIME,
    )
    for k, metrics in enumerate(rollouts):
        writer.emit_rollout(k, metrics)
    writer.close()
    return stream.getvalue(), writer


def log_series(text: str, run: Path) -> SeriesMap:
    """``text`` as the ``job.log`` of the run dir ``run``, read as the gate reads it."""
    run.mkdir()
    (run / "job.log").write_text(text, encoding="utf-8")
    evidence = load_run(run)
    assert evidence.problems == (), evidence.problems
    return evidence.series


def expected_series(rollouts: list[dict[str, float]]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for k, metrics in enumerate(rollouts):
        for key, value in metrics.items():
            out.setdefault(key, []).append((k, value))
    return out


def read_tensorboard_dir_files(event_file: Path) -> dict:
    """The scalars of one event file (copied alone into a directory of its own)."""
    with tempfile.TemporaryDirectory() as alone:
        shutil.copy(event_file, alone)
        return read_tensorboard_dir(alone)


def test_a_run_reads_back_from_all_three_formats_in_miles_form(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log, writer = write_run(tmp_path, ROLLOUTS)
    # TensorBoard: every scalar at the rollout step, as float32; one file per miles process,
    # the driver's the file-version header only (88 bytes); EventAccumulator agrees.
    want = {k: tuple((s, f32(v)) for s, v in p) for k, p in expected_series(ROLLOUTS).items()}
    assert read_tensorboard_dir(tmp_path / "tensorboard") == want
    assert set(writer.event_files) == {"driver", "rollout_manager", "trainer"}
    assert sorted((tmp_path / "tensorboard").iterdir()) == sorted(writer.event_files.values())
    assert writer.event_file == writer.event_files["trainer"]
    assert writer.event_files["driver"].stat().st_size == 88
    manager = read_tensorboard_dir_files(writer.event_files["rollout_manager"])
    assert set(manager) == {
        "perf/rollout_time",
        "rollout/response_len/mean",
        "rollout/truncated_ratio",
    }
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(ROLLOUTS[0])
    for key, points in want.items():
        assert [(e.step, e.value, e.wall_time) for e in acc.Scalars(key)] == [
            (s, v, FIXED_TIME) for s, v in points
        ]
    # CI history: the driver's 0-byte record, the trainer's captured keys in first-capture
    # order (the trainer logs raw_reward before the training step).
    files = sorted((tmp_path / "ci_history").iterdir(), key=lambda p: p.stat().st_size)
    assert len(files) == 2 and files[0].stat().st_size == 0
    assert all(re.fullmatch(r"\d+-[0-9a-f]{32}\.jsonl", f.name) for f in files)
    assert files[1].name.startswith("4242-")  # the trainer's pid
    records = [json.loads(line) for line in files[1].read_text().splitlines()]
    assert [r["metric"] for r in records] == ["rollout/raw_reward", *CI_CAPTURED_KEYS[:4]]
    assert records[0] == {
        "metric": "rollout/raw_reward",
        "series": [[k, m["rollout/raw_reward"]] for k, m in enumerate(ROLLOUTS)],
    }
    # The log parses back exactly; per rollout perf, rollout, step twice, in miles' form.
    want_log = {key: tuple(points) for key, points in expected_series(ROLLOUTS).items()}
    want_log["train/step"] = tuple((k, float(k)) for k in range(len(ROLLOUTS)))
    assert log_series(log, tmp_path / "log") == want_log
    lines = log.splitlines()
    assert len(lines) == 4 * len(ROLLOUTS)
    manager_time = format_log_time(FIXED_TIME, "rollout_manager")
    trainer_time = format_log_time(FIXED_TIME, "actor_cell0_rank0")
    trainer = f"\x1b[36m(MegatronTrainRayActor pid=4242)\x1b[0m {trainer_time}"
    assert lines[0].startswith(
        f"\x1b[36m(RolloutManager pid=4100)\x1b[0m {manager_time} metrics.py:89"
    )
    assert " - perf 0: {'perf/rollout_time': 101.5, 'rollout/response_len/mean': 2900.0" in lines[0]
    assert lines[1].startswith(f"{trainer} log_utils.py:123")
    assert " - rollout 0: {'rollout/raw_reward': 0.5, 'rollout/log_probs': -0.31}" in lines[1]
    # log_train_step's dict: the losses, then grad_norm, then the step; printed twice.
    assert lines[2].startswith(f"{trainer} log_utils.py:542")
    assert lines[2].endswith("'train/ppo_kl': 0.0, 'train/grad_norm': 0.12, 'train/step': 0}")
    assert lines[3] == lines[2].replace("log_utils.py:542", "model.py:854")


def test_each_rollout_is_flushed_before_close(tmp_path: Path) -> None:
    stream = io.StringIO()
    writer = MilesRunWriter(tmp_path / "tb", tmp_path / "ci", stream, pids=PIDS)
    writer.emit_rollout(0, ROLLOUTS[0])
    # Strict read (not live): the file must already end on a complete record.
    got = read_tensorboard_dir(tmp_path / "tb")
    assert got["train/grad_norm"] == ((0, f32(ROLLOUTS[0]["train/grad_norm"])),)
    ci = read_ci_history_dir(tmp_path / "ci")
    assert ci["rollout/raw_reward"] == ((0, ROLLOUTS[0]["rollout/raw_reward"]),)
    assert log_series(stream.getvalue(), tmp_path / "log")["train/loss"] == ((0, 0.001),)
    writer.emit_rollout(1, ROLLOUTS[1])
    assert len(read_tensorboard_dir(tmp_path / "tb")["train/grad_norm"]) == 2
    assert len(read_ci_history_dir(tmp_path / "ci")["train/grad_norm"]) == 2
    writer.close()


def test_non_finite_values_in_all_three_formats(tmp_path: Path) -> None:
    rollouts = [dict(ROLLOUTS[0]), dict(ROLLOUTS[1])]
    rollouts[1]["train/train_rollout_logprob_abs_diff"] = math.nan
    rollouts[1]["train/grad_norm"] = math.inf
    log, _ = write_run(tmp_path, rollouts)
    assert "'train/train_rollout_logprob_abs_diff': nan" in log
    assert "'train/grad_norm': inf" in log
    from_log = log_series(log, tmp_path / "log")
    assert math.isnan(from_log["train/train_rollout_logprob_abs_diff"][1][1])
    tb = read_tensorboard_dir(tmp_path / "tensorboard")
    assert math.isnan(tb["train/train_rollout_logprob_abs_diff"][1][1])
    assert tb["train/grad_norm"][1][1] == math.inf
    text = "".join(p.read_text() for p in (tmp_path / "ci_history").iterdir())
    assert '"NaN"' in text and '"Infinity"' in text
    for line in text.splitlines():
        json.loads(line, parse_constant=lambda token: pytest.fail(f"bare {token}"))
    ci = read_ci_history_dir(tmp_path / "ci_history")
    assert math.isnan(ci["train/train_rollout_logprob_abs_diff"][1][1])
    assert ci_history_text({"train/grad_norm": [(0, 1.5), (1, -math.inf)]}) == (
        '{"metric": "train/grad_norm", "series": [[0, 1.5], [1, "-Infinity"]]}\n'
    )


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("perf/rollout_time", "perf"),
        ("rollout/response_len/max", "perf"),
        ("rollout/truncated_ratio", "perf"),
        ("rollout/raw_reward", "rollout"),
        ("train/grad_norm", "step"),
        ("perf/actor_train_time", "trainer_perf"),
        ("perf/actor_train_tflops", "trainer_perf"),
        ("perf/wait_time_ratio", "trainer_perf"),
        ("perf/longest_sample_non_generation_time", "perf"),
        ("perf/cpu_memory_after_offload_train_gb", "tb_only"),
    ],
)
def test_message_kinds_follow_miles(key: str, kind: str) -> None:
    assert log_kind(key) == kind


def test_lines_only_for_kinds_with_keys_and_tensorboard_only_keys(tmp_path: Path) -> None:
    lines = metric_log_lines(7, {"train/loss": 1.0}, PIDS, FIXED_TIME)
    assert len(lines) == 2
    assert all(" - step 7: {'train/loss': 1.0, 'train/step': 7}" in x for x in lines)
    metrics = {"perf/actor_train_time": 12.5, "perf/cpu_memory_after_offload_train_gb": 80.25}
    log, writer = write_run(tmp_path, [metrics])
    (line,) = log.splitlines()
    assert "train_metric_utils.py:56 - perf 0: {'perf/actor_train_time': 12.5}" in line
    assert read_tensorboard_dir_files(writer.event_files["trainer"]) == {
        "perf/actor_train_time": ((0, 12.5),),
        "perf/cpu_memory_after_offload_train_gb": ((0, 80.25),),
    }


def test_outputs_off_unknown_keys_and_the_ci_file_before_a_capture(tmp_path: Path) -> None:
    stream = io.StringIO()
    writer = MilesRunWriter(None, tmp_path / "ci", stream, pids=PIDS)
    with pytest.raises(ValueError, match="eval/score"):  # refused before writing anything
        writer.emit_rollout(0, {"train/grad_norm": 1.0, "eval/score": 0.5})
    assert stream.getvalue() == "" and not (tmp_path / "ci").exists()
    writer.emit_rollout(0, {"train/loss": 0.1, "perf/rollout_time": 1.0})
    assert not (tmp_path / "ci").exists()  # no captured key yet
    writer.close()
    assert [p.stat().st_size for p in (tmp_path / "ci").iterdir()] == [0]  # the driver's
    off = MilesRunWriter(None, None, stream, pids=PIDS)
    off.emit_rollout(0, ROLLOUTS[0])
    off.close()
    assert off.event_file is None and list(tmp_path.iterdir()) == [tmp_path / "ci"]
    assert "step 0:" in stream.getvalue()


def test_log_time_is_local_with_milliseconds() -> None:
    local = time.localtime(FIXED_TIME)
    assert format_log_time(FIXED_TIME) == time.strftime("[%Y-%m-%d %H:%M:%S.250 main]", local)

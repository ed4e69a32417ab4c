"""MilesRunWriter writes miles' three formats; read back with the strict readers and with
TensorBoard's own EventAccumulator as an independent cross-check. Real files throughout."""

from __future__ import annotations

import io
import json
import math
import re
import struct
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
    encode_ci_value,
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


def test_tensorboard_scalars_read_back_at_the_rollout_step_as_float32(tmp_path: Path) -> None:
    _, writer = write_run(tmp_path, ROLLOUTS)
    got = read_tensorboard_dir(tmp_path / "tensorboard")
    want = {
        key: tuple((k, f32(v)) for k, v in points)
        for key, points in expected_series(ROLLOUTS).items()
    }
    assert got == want
    assert writer.event_file is not None and writer.event_file.parent == tmp_path / "tensorboard"
    # One file per miles process: the driver's holds the file-version header only (88 bytes).
    assert set(writer.event_files) == {"driver", "rollout_manager", "trainer"}
    files = sorted((tmp_path / "tensorboard").iterdir())
    assert files == sorted(writer.event_files.values())
    assert writer.event_files["driver"].stat().st_size == 88
    manager = read_tensorboard_dir_files(writer.event_files["rollout_manager"])
    assert set(manager) == {
        "perf/rollout_time",
        "rollout/response_len/mean",
        "rollout/truncated_ratio",
    }


def read_tensorboard_dir_files(event_file: Path) -> dict:
    """The scalars of one event file (copied alone into a directory of its own)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as alone:
        shutil.copy(event_file, alone)
        return read_tensorboard_dir(alone)


def test_tensorboard_cross_check_with_tensorboards_event_accumulator(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_run(tmp_path, ROLLOUTS)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(ROLLOUTS[0])
    for key, points in expected_series(ROLLOUTS).items():
        events = acc.Scalars(key)
        assert [(e.step, e.value) for e in events] == [(k, f32(v)) for k, v in points]
        assert {e.wall_time for e in events} == {FIXED_TIME}


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


def test_ci_history_is_miles_form_with_captured_keys_only(tmp_path: Path) -> None:
    write_run(tmp_path, ROLLOUTS)
    files = sorted((tmp_path / "ci_history").iterdir(), key=lambda p: p.stat().st_size)
    assert len(files) == 2 and files[0].stat().st_size == 0  # the driver's finish_tracking
    assert all(re.fullmatch(r"\d+-[0-9a-f]{32}\.jsonl", f.name) for f in files)
    assert files[1].name.startswith("4242-")  # the trainer's pid
    lines = files[1].read_text().splitlines()
    records = [json.loads(line) for line in lines]
    # First-capture order: the trainer logs raw_reward (rollout) before the training step.
    assert [r["metric"] for r in records] == [
        "rollout/raw_reward",
        "train/grad_norm",
        "train/ppo_kl",
        "train/train_rollout_logprob_abs_diff",
        "train/train_rollout_kl",
    ]
    assert set(r["metric"] for r in records) <= set(CI_CAPTURED_KEYS)
    assert records[0]["series"] == [[k, m["rollout/raw_reward"]] for k, m in enumerate(ROLLOUTS)]
    assert set(records[0]) == {"metric", "series"}


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


def test_log_lines_parse_back_exactly_and_keep_miles_form(tmp_path: Path) -> None:
    log, _ = write_run(tmp_path, ROLLOUTS)
    got = log_series(log, tmp_path / "log")
    want = {key: tuple(points) for key, points in expected_series(ROLLOUTS).items()}
    want["train/step"] = tuple((k, float(k)) for k in range(len(ROLLOUTS)))
    assert got == want
    lines = log.splitlines()
    assert len(lines) == 4 * len(ROLLOUTS)  # perf, rollout, step twice
    manager = format_log_time(FIXED_TIME, "rollout_manager")
    trainer = format_log_time(FIXED_TIME, "actor_cell0_rank0")
    cyan, reset = "\x1b[36m", "\x1b[0m"
    assert lines[0].startswith(f"{cyan}(RolloutManager pid=4100){reset} {manager} metrics.py:89")
    assert " - perf 0: {'perf/rollout_time': 101.5, 'rollout/response_len/mean': 2900.0" in lines[0]
    prefix = f"{cyan}(MegatronTrainRayActor pid=4242){reset} {trainer}"
    assert lines[1].startswith(f"{prefix} log_utils.py:123")
    assert " - rollout 0: {'rollout/raw_reward': 0.5, 'rollout/log_probs': -0.31}" in lines[1]
    # log_train_step's dict: the losses, then grad_norm, then the step; printed twice.
    assert lines[2].startswith(f"{prefix} log_utils.py:542")
    assert lines[2].endswith("'train/ppo_kl': 0.0, 'train/grad_norm': 0.12, 'train/step': 0}")
    assert lines[3] == lines[2].replace("log_utils.py:542", "model.py:854")


def test_format_log_time_is_local_time_with_milliseconds() -> None:
    import time

    local = time.localtime(FIXED_TIME)
    assert format_log_time(FIXED_TIME) == time.strftime("[%Y-%m-%d %H:%M:%S.250 main]", local)
    assert format_log_time(FIXED_TIME, "rollout_manager").endswith(".250 rollout_manager]")


def test_message_kinds_follow_miles() -> None:
    assert log_kind("perf/rollout_time") == "perf"
    assert log_kind("rollout/response_len/max") == "perf"
    assert log_kind("rollout/truncated_ratio") == "perf"
    assert log_kind("rollout/raw_reward") == "rollout"
    assert log_kind("train/grad_norm") == "step"
    assert log_kind("perf/actor_train_time") == "trainer_perf"
    assert log_kind("perf/actor_train_tflops") == "trainer_perf"
    assert log_kind("perf/wait_time_ratio") == "trainer_perf"
    assert log_kind("perf/longest_sample_non_generation_time") == "perf"
    assert log_kind("perf/cpu_memory_after_offload_train_gb") == "tb_only"
    with pytest.raises(ValueError, match="eval/score"):
        log_kind("eval/score")


def test_a_kind_without_keys_prints_no_line() -> None:
    lines = metric_log_lines(7, {"train/loss": 1.0}, PIDS, FIXED_TIME)
    assert len(lines) == 2 and all(
        " - step 7: {'train/loss': 1.0, 'train/step': 7}" in x for x in lines
    )


def test_trainer_perf_line_and_tensorboard_only_keys(tmp_path: Path) -> None:
    metrics = {"perf/actor_train_time": 12.5, "perf/cpu_memory_after_offload_train_gb": 80.25}
    log, writer = write_run(tmp_path, [metrics])
    (line,) = log.splitlines()
    assert "train_metric_utils.py:56 - perf 0: {'perf/actor_train_time': 12.5}" in line
    assert "cpu_memory" not in log
    trainer = read_tensorboard_dir_files(writer.event_files["trainer"])
    assert trainer == {
        "perf/actor_train_time": ((0, 12.5),),
        "perf/cpu_memory_after_offload_train_gb": ((0, 80.25),),
    }


def test_unknown_key_refuses_before_writing_anything(tmp_path: Path) -> None:
    stream = io.StringIO()
    writer = MilesRunWriter(None, tmp_path / "ci", stream, pids=PIDS)
    with pytest.raises(ValueError, match="eval/score"):
        writer.emit_rollout(0, {"train/grad_norm": 1.0, "eval/score": 0.5})
    assert stream.getvalue() == ""
    assert not (tmp_path / "ci").exists()


def test_without_dirs_only_the_log_is_written(tmp_path: Path) -> None:
    stream = io.StringIO()
    writer = MilesRunWriter(None, None, stream, pids=PIDS)
    writer.emit_rollout(0, ROLLOUTS[0])
    writer.close()
    assert writer.event_file is None
    assert list(tmp_path.iterdir()) == []
    assert "step 0:" in stream.getvalue()


def test_no_ci_file_until_a_captured_key_is_logged(tmp_path: Path) -> None:
    writer = MilesRunWriter(None, tmp_path / "ci", io.StringIO(), pids=PIDS)
    writer.emit_rollout(0, {"train/loss": 0.1, "perf/rollout_time": 1.0})
    assert not (tmp_path / "ci").exists()
    writer.close()
    assert [p.stat().st_size for p in (tmp_path / "ci").iterdir()] == [0]  # the driver's


def test_ci_values_encode_like_miles() -> None:
    assert encode_ci_value(0.25) == 0.25
    assert encode_ci_value(math.nan) == "NaN"
    assert encode_ci_value(-math.inf) == "-Infinity"
    text = ci_history_text({"train/grad_norm": [(0, 1.5), (1, math.inf)]})
    assert text == '{"metric": "train/grad_norm", "series": [[0, 1.5], [1, "Infinity"]]}\n'


def test_actor_pids_are_distinct() -> None:
    pids = ActorPids.around(1000)
    every = [*pids.trainers, pids.rollout_manager, pids.sglang_engine]
    assert len(pids.trainers) == 8 and len(set(every)) == len(every)

"""Rebuild ``examples/runs/jvvnhop9/`` from the published per-rollout series of run jvvnhop9.

Run: ``python examples/make_jvvnhop9.py [--out DIR]``. The output is byte-for-byte the same on
every run and machine (fixed clock in UTC, fixed pids and file names), so the committed
example can be checked against a fresh build.

The files are written by ``miles_amd.testing.miles_writer.MilesRunWriter``, the one place that knows
miles' output forms (the CPU rehearsal's replay uses it too): ``tensorboard/`` through
tensorboard's real ``EventFileWriter`` with torch ``SummaryWriter.add_scalar``'s events,
``ci_history/<pid>-<uuid>.jsonl`` in miles' CI-history form (the trainer's, and the driver's
0-byte record), and ``job.log`` with the trainer's ``rollout <i>:`` / ``step <i>:`` lines (the
step line twice, as miles prints it), one event file per miles process (driver, rollout
manager, trainer). This script adds ``job.json`` (the driver's
form, status SUCCEEDED) and ``README.md``. For reproducible bytes it pins what the writers
take from the machine: the EventFileWriter's clock (its file-version header) and the names
it and the CI-history writer derive from host, pid and a random uuid (renamed afterwards),
and the time zone of the log timestamps (UTC).

Values: only what the published evidence determines, read from the shipped patched baseline
(``baselines/gpt_oss_20b_lora/8gpu/mi355x/patched.json``).
``train/train_rollout_logprob_abs_diff`` is the published 4-decimal series.
``rollout/raw_reward`` is the published series mapped to the unique multiple of 1/64 within its
rounding (a fraction correct of 64 samples, e.g. 0.6094 -> 39/64 = 0.609375).
``train/pg_clipfrac`` is 0 at every step (published as 0, non-negative). Metrics published only
as summaries (train_rollout_kl, response length, truncation) are not invented as series.
Timestamps, pids and the uuid are placeholders: the run's start time was not published, only its
length (about 1h06m).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from miles_amd.baseline.model import load_baseline
from miles_amd.testing.miles_writer import ActorPids, MilesRunWriter

RUN_ID = "jvvnhop9"
PIDS = ActorPids.around(4232)  # placeholder pids; the trainer's rank 0 is 4242
DRIVER_PID = 4232  # placeholder pid of the driver (the job's entrypoint, train.py)
START = 1_767_225_600.0  # placeholder start: 2026-01-01 00:00:00 UTC
DURATION = 66 * 60.0  # "about 1h06m"
LOGPROB = "train/train_rollout_logprob_abs_diff"
REWARD = "rollout/raw_reward"
CLIPFRAC = "train/pg_clipfrac"
CI_UUID = uuid.uuid5(uuid.NAMESPACE_URL, "miles-amd/examples/runs/jvvnhop9").hex
DRIVER_CI_UUID = uuid.uuid5(uuid.NAMESPACE_URL, "miles-amd/examples/runs/jvvnhop9/driver").hex
DEFAULT_OUT = Path(__file__).resolve().parent / "runs" / RUN_ID

README = """\
# examples/runs/jvvnhop9: the published patched run, reconstructed

Reconstructed from the published per-rollout series of run jvvnhop9 (8x MI355X, ROCm 7.2,
aiter with ROCm/aiter#5694, 20 rollouts, Ray job SUCCEEDED); not a raw run directory.
Rebuild it with `python examples/make_jvvnhop9.py`; judge it with
`miles-amd gate --run-dir examples/runs/jvvnhop9 --baseline patched` (passes).

Written in miles' formats by `miles_amd.testing.miles_writer` (checked against miles' own
writer code by `tests/rehearsal/test_real_writers.py`): `tensorboard/` (one event file per
miles process: the driver's header-only file, the rollout manager's, the trainer's; torch
SummaryWriter's scalar events), `ci_history/*.jsonl` (the trainer's CI-history snapshot and
the driver's 0-byte record), `job.log` (the trainer's `rollout <i>:` line and its `step <i>:`
line, printed twice, behind Ray's coloured actor prefix), plus `job.json` in the driver's form
(SUCCEEDED).

It carries, for rollouts 0..19:

- `train/train_rollout_logprob_abs_diff`: the published 4-decimal series;
- `rollout/raw_reward`: the published series as the multiple of 1/64 it rounds from;
- `train/pg_clipfrac`: 0 at every step (published as 0; a non-negative rate).

It lacks every metric published only as a summary or not at all: `train/train_rollout_kl`,
`rollout/response_len/mean`, `rollout/truncated_ratio` (their rules are optional in the
patched baseline and show as not measured), `train/grad_norm`, `train/ppo_kl`, `perf/*` and
the other keys a real run logs. Timestamps (UTC), pids and the Ray job id are placeholders; only
the run's length (about 1h06m) was published.
"""


def _rollout_times(rollouts: int) -> Iterator[float]:
    """Placeholder wall time of each rollout's metric lines, spread over the run's length."""
    period = DURATION / rollouts
    for rollout in range(rollouts):
        yield START + 60.0 + period * (rollout + 0.9)


def _series(baseline) -> dict[str, list[float]]:
    samples = baseline.run_shape.samples_per_rollout
    return {
        REWARD: [round(v * samples) / samples for v in baseline.series[REWARD]],
        CLIPFRAC: [0.0] * baseline.run_shape.rollouts,
        LOGPROB: list(baseline.series[LOGPROB]),
    }


@contextmanager
def _utc() -> Iterator[None]:
    """Log timestamps in UTC (miles prints local time), restoring the caller's zone."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


def _write_metrics(out: Path, series: dict[str, list[float]]) -> None:
    from tensorboard.summary.writer import event_file_writer

    rollouts = len(series[REWARD])
    times = _rollout_times(rollouts)
    with _utc(), open(out / "job.log", "w", encoding="utf-8") as log:
        # The writer's file-version header takes its wall time from this module's clock.
        fixed_clock = SimpleNamespace(time=lambda: START)
        with mock.patch.object(event_file_writer, "time", fixed_clock):
            writer = MilesRunWriter(
                out / "tensorboard",
                out / "ci_history",
                log,
                pids=PIDS,
                clock=lambda: next(times),
                ci_record_name=f"{PIDS.trainers[0]}-{CI_UUID}.jsonl",
            )
        for rollout in range(rollouts):
            writer.emit_rollout(rollout, {key: values[rollout] for key, values in series.items()})
        writer.close()
    role_pids = {"driver": DRIVER_PID, "rollout_manager": PIDS.rollout_manager}
    role_pids["trainer"] = PIDS.trainers[0]
    for role, event_file in writer.event_files.items():
        name = f"events.out.tfevents.{int(START):010d}.{RUN_ID}.{role_pids[role]}.0"
        event_file.rename(event_file.with_name(name))
    assert writer.driver_ci_file is not None
    writer.driver_ci_file.rename(
        writer.driver_ci_file.with_name(f"{DRIVER_PID}-{DRIVER_CI_UUID}.jsonl")
    )


def _write_job_json(out: Path) -> None:
    job = {
        "job_id": RUN_ID,
        "status": "SUCCEEDED",
        "message": "Job finished successfully.",
        "start_time": START,
        "end_time": START + DURATION,
        "driver_exit_code": 0,
        "stopped_by": None,
        "stop_requested_at": None,
        "failfast": None,
        "failfast_latency_s": None,
    }
    (out / "job.json").write_text(json.dumps(job, indent=2) + "\n", encoding="utf-8")


def build(out: Path) -> Path:
    """Write the example run dir to ``out``, replacing it whole (never half-written)."""
    baseline = load_baseline("patched")
    series = _series(baseline)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_metrics(staging, series)
        _write_job_json(staging)
        (staging / "README.md").write_text(README, encoding="utf-8")
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="run dir to (re)write")
    args = parser.parse_args()
    print(build(args.out))


if __name__ == "__main__":
    main()

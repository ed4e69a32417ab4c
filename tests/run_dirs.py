"""Run directories for tests, written as miles and the driver leave them (real writers)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from miles_amd.baseline.model import resolve_baseline_path
from miles_amd.testing.miles_writer import ActorPids, MilesRunWriter
from tests.constants import CLIPFRAC, LOGPROB, REWARD


def published_values(rollouts: int = 20) -> dict[str, list[float]]:
    """The published jvvnhop9 series of the shipped patched baseline, first ``rollouts`` of
    them (rewards as the k/64 they round from), with ``pg_clipfrac`` 0."""
    patched = json.loads(resolve_baseline_path("patched").read_text(encoding="utf-8"))
    series = patched["evidence"]["series"]
    return {
        REWARD: [round(v * 64) / 64 for v in series[REWARD]][:rollouts],
        CLIPFRAC: [0.0] * rollouts,
        LOGPROB: series[LOGPROB][:rollouts],
    }


def write_run(
    run_dir: Path,
    values: dict[str, list[float]],
    *,
    status: str = "SUCCEEDED",
    rollouts: Iterable[int] | None = None,
    job_id: str = "raysubmit_t",
) -> Path:
    """TensorBoard, CI history and job.log by ``MilesRunWriter`` (``values``: metric ->
    per-rollout values; ``rollouts``: the steps emitted, default all), plus job.json."""
    run_dir.mkdir(parents=True)
    count = len(next(iter(values.values())))
    with open(run_dir / "job.log", "w", encoding="utf-8") as log:
        writer = MilesRunWriter(
            run_dir / "tensorboard",
            run_dir / "ci_history",
            log,
            pids=ActorPids.around(5000),
            clock=lambda: 1_767_225_600.0,
        )
        for rollout in rollouts if rollouts is not None else range(count):
            writer.emit_rollout(rollout, {key: vs[rollout] for key, vs in values.items()})
        writer.close()
    job = {
        "job_id": job_id,
        "status": status,
        "message": "",
        "start_time": 1_767_225_000.0,
        "end_time": 1_767_228_725.0,
        "driver_exit_code": 0 if status == "SUCCEEDED" else 1,
        "stopped_by": None,
    }
    (run_dir / "job.json").write_text(json.dumps(job, indent=2))
    return run_dir

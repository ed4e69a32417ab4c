"""Benchmark: the gate's strict read + judge of a long run vs TensorBoard's EventAccumulator.

Builds a synthetic long miles run (default 1000 rollouts, 150 scalar tags) in a temporary
run directory, in the forms miles writes:

- ``tensorboard/``: two event files, as miles' two logging processes write them (the trainer
  logs ``train/*`` and the trainer's ``rollout/*``; the rollout manager logs ``perf/*`` and
  the sample statistics), one event per scalar with ``Summary.Value.simple_value`` (torch's
  ``SummaryWriter.add_scalar`` form). The records are framed here with google-crc32c because
  tensorboard's ``EventFileWriter`` computes CRCs in pure Python (about 15 s for 150,000
  events); ``EventAccumulator`` checks every CRC when it loads the files, so its agreeing
  point for point (checked below) vouches for the framing independently.
- ``ci_history/<pid>-<uuid>.jsonl``, ``job.log`` (the perf/rollout/step lines of every
  rollout between noise lines) and ``job.json``, written by ``miles_amd.testing.miles_writer``'s
  formatters, so every source the gate reads is present and the sources are compared.

Then times, in this process:

- the gate: ``load_run`` (every record's CRCs checked, every source read and merged, the
  log scanned for sentinels) + ``judge`` against the shipped ``patched`` baseline with
  ``expected_rollouts`` set to the run's rollout count (bands rescaled to it); the median
  of ``--repeat`` runs;
- ``EventAccumulator(tensorboard_dir, size_guidance={"scalars": 0, "tensors": 0})``
  (0 keeps every point) ``.Reload()``, once (it is the slow side).

Both are wall-clock times with imports done beforehand (CPU times are printed too: on a
busy machine wall time includes waiting for a core). The last line reads
``gate_s=<seconds> accumulator_s=<seconds> ratio=<gate_s/accumulator_s>``. Target: ratio
at most 0.5 and gate_s under 1 s. Exits non-zero if the two readers disagree on a point or
the gate does not see the complete, consistent run it was given.

Figures it printed: docs/ci.md ("What the CPU suite and the benchmarks measure"). The one
speed trick kept is ``job_log``'s regex for dicts of plain numbers: without it (``ast`` only)
the gate misses the 1 s target; a process-wide ``gc.disable()``, a whole-file protobuf decoder
and a JSON fast path saved less than the noise and were removed.

Run: ``python benchmarks/bench_gate.py [--rollouts N] [--repeat K] [--quick]``;
``--quick`` (CI, ``benchmarks/run_quick.py``) is 100 rollouts x 30 tags, one gate run: the
same agreement checks on a small run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from google.protobuf.internal import api_implementation
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.evidence.tensorboard import masked_crc32c
from miles_amd.judge.gate import judge
from miles_amd.testing.miles_writer import (
    CI_CAPTURED_KEYS,
    ActorPids,
    ci_history_text,
    log_kind,
    metric_log_lines,
)

GATED = {  # metric -> (mean, sd) near the patched baseline's run
    "train/train_rollout_logprob_abs_diff": (0.017, 0.0017),
    "train/train_rollout_kl": (8.79e-4, 1.5e-4),
    "train/grad_norm": (0.12, 0.03),
    "train/ppo_kl": (0.0, 0.0),
    "train/pg_clipfrac": (0.0, 0.0),
    "rollout/raw_reward": (0.56, 0.09),
    "rollout/response_len/mean": (2920.0, 150.0),
    "rollout/truncated_ratio": (0.41, 0.05),
    "perf/rollout_time": (95.0, 10.0),
}
EPOCH = 1_780_000_000.0


def metric_names(n_tags: int) -> list[str]:
    """The gated keys plus fillers spread over miles' three message kinds, ``n_tags`` in all."""
    names = list(GATED)
    kinds = ("train/extra_{}", "rollout/extra_{}", "perf/extra_{}")
    index = 0
    while len(names) < n_tags:
        names.append(kinds[index % 3].format(index))
        index += 1
    return names


def synthetic_values(names: list[str], rollouts: int, seed: int) -> list[dict[str, float]]:
    """Per-rollout metric dicts; gated means pinned to the baseline's, reward on the 1/64 grid."""
    rng = random.Random(seed)
    columns: dict[str, list[float]] = {}
    for name in names:
        mean, sd = GATED.get(name, (rng.uniform(0.1, 100.0), 0.5))
        column = [rng.gauss(mean, sd) if sd else 0.0 for _ in range(rollouts)]
        shift = mean - statistics.fmean(column)
        columns[name] = [value + shift for value in column]
    columns["rollout/raw_reward"] = [
        min(64, max(0, round(value * 64))) / 64 for value in columns["rollout/raw_reward"]
    ]
    return [{name: columns[name][k] for name in names} for k in range(rollouts)]


def frame(payload: bytes) -> bytes:
    """One TFRecord: length, masked CRC of length, payload, masked CRC of payload."""
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def write_event_file(path: Path, rows: list[tuple[int, dict[str, float]]]) -> None:
    header = Event(wall_time=EPOCH, file_version="brain.Event:2").SerializeToString()
    records = [frame(header)]
    for step, metrics in rows:
        for tag, value in metrics.items():
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            event = Event(wall_time=EPOCH + step, step=step, summary=summary)
            records.append(frame(event.SerializeToString()))
    path.write_bytes(b"".join(records))


def pick(metrics: dict[str, float], keep: Callable[[str], bool]) -> dict[str, float]:
    return {key: value for key, value in metrics.items() if keep(key)}


def build_run(root: Path, rollouts: int, n_tags: int, seed: int) -> int:
    """Write the synthetic run into ``root``; returns the number of scalar points written."""
    names = metric_names(n_tags)
    per_rollout = synthetic_values(names, rollouts, seed)
    pids = ActorPids.around(4200)
    tensorboard = root / "tensorboard"
    tensorboard.mkdir(parents=True)
    trainer_rows = [
        (k, pick(m, lambda key: log_kind(key) != "perf")) for k, m in enumerate(per_rollout)
    ]
    manager_rows = [
        (k, pick(m, lambda key: log_kind(key) == "perf")) for k, m in enumerate(per_rollout)
    ]
    name = "events.out.tfevents.{:010d}.node0.{}.0"
    write_event_file(tensorboard / name.format(int(EPOCH), pids.trainers[0]), trainer_rows)
    write_event_file(tensorboard / name.format(int(EPOCH), pids.rollout_manager), manager_rows)

    ci_series = {
        key: [(k, m[key]) for k, m in enumerate(per_rollout)]
        for key in CI_CAPTURED_KEYS
        if key in names
    }
    (root / "ci_history").mkdir()
    (root / "ci_history" / f"{pids.trainers[0]}-{uuid.uuid4().hex}.jsonl").write_text(
        ci_history_text(ci_series), encoding="utf-8"
    )

    lines = []
    for k, metrics in enumerate(per_rollout):
        stamp = EPOCH + 300.0 * k
        for noise in range(10):
            lines.append(
                f"(SGLangEngine pid={pids.sglang_engine}) [2026-05-28 10:00:00 TP{noise % 4}] "
                f"Decode batch. #running-req: 64, #token: {4096 * noise}, gen throughput "
                f"(token/s): {1234.5 + noise:.2f}, #queue-req: 0"
            )
        lines.extend(metric_log_lines(k, metrics, pids, stamp))
    (root / "job.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    job = {
        "job_id": "raysubmit_bench",
        "status": "SUCCEEDED",
        "message": "Job finished successfully.",
        "start_time": EPOCH,
        "end_time": EPOCH + 300.0 * rollouts,
    }
    (root / "job.json").write_text(json.dumps(job), encoding="utf-8")
    return rollouts * len(names)


def timed(action: Callable[[], object]) -> tuple[float, float, object]:
    """``(wall seconds, CPU seconds of this process, result)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def accumulator_scalars(tensorboard_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = event_accumulator.EventAccumulator(
        str(tensorboard_dir),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0},
    )
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()[event_accumulator.SCALARS]
    }


def same_points(gate_series: dict, accumulated: dict) -> str | None:
    """``None`` when both readers hold the same points, else what differs."""
    for tag, points in accumulated.items():
        ours = gate_series.get(tag, ())
        if len(ours) != len(points):
            return f"{tag}: gate read {len(ours)} points, EventAccumulator {len(points)}"
        for (step, value), (their_step, their_value) in zip(ours, points, strict=True):
            if step != their_step or not (
                value == their_value or (math.isnan(value) and math.isnan(their_value))
            ):
                return (
                    f"{tag}: gate has ({step}, {value}), "
                    f"EventAccumulator ({their_step}, {their_value})"
                )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--tags", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=3, help="gate runs; the median is reported")
    parser.add_argument("--seed", type=int, default=20260528)
    parser.add_argument(
        "--quick", action="store_true", help="CI: 100 rollouts, 30 tags, 1 repeat (overrides)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rollouts, args.tags, args.repeat = 100, 30, 1

    baseline = load_baseline("patched")
    with tempfile.TemporaryDirectory(prefix="bench_gate_") as tmp:
        root = Path(tmp) / "run"
        build_seconds, _, points = timed(
            lambda: build_run(root, args.rollouts, args.tags, args.seed)
        )
        size = sum(f.stat().st_size for f in (root / "tensorboard").iterdir())
        print(
            f"run: {args.rollouts} rollouts x {args.tags} tags = {points} scalars, event files "
            f"{size / 1e6:.1f} MB, job.log {(root / 'job.log').stat().st_size / 1e6:.1f} MB, "
            f"built in {build_seconds:.1f} s; protobuf backend {api_implementation.Type()}"
        )

        def gate():
            evidence = load_run(root)
            return evidence, judge(evidence, baseline, expected_rollouts=args.rollouts)

        gate_runs = []
        for _ in range(max(1, args.repeat)):
            evidence = verdict = None  # drop the previous run's: each run starts alike
            wall, cpu, (evidence, verdict) = timed(gate)
            gate_runs.append((wall, cpu))
        gate_seconds = statistics.median(wall for wall, _ in gate_runs)
        gate_cpu = statistics.median(cpu for _, cpu in gate_runs)
        print(
            "gate (load_run + judge), wall: "
            + ", ".join(f"{wall:.3f}" for wall, _ in gate_runs)
            + f" s -> median {gate_seconds:.3f} s (CPU median {gate_cpu:.3f} s); "
            + f"verdict {verdict.verdict}: {verdict.reason}"
        )
        accumulator_seconds, accumulator_cpu, accumulated = timed(
            lambda: accumulator_scalars(root / "tensorboard")
        )
        print(
            f"EventAccumulator load (size guidance 0), wall: {accumulator_seconds:.3f} s "
            f"(CPU {accumulator_cpu:.3f} s)"
        )

        failures = []
        if evidence.problems or evidence.conflicts:
            failures.append(
                f"gate saw problems or conflicts: {evidence.problems} {evidence.conflicts}"
            )
        if sum(len(s) for m, s in evidence.series.items() if m != "train/step") != points:
            failures.append("gate did not read every scalar written")
        difference = same_points(evidence.series, accumulated)
        if difference or len(accumulated) != args.tags:
            failures.append(f"gate and EventAccumulator disagree: {difference or 'tag count'}")
        for failure in failures:
            print(f"ERROR: {failure}", file=sys.stderr)

    ratio = gate_seconds / accumulator_seconds
    print(f"gate_s={gate_seconds:.3f} accumulator_s={accumulator_seconds:.3f} ratio={ratio:.3f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Writes a run's metrics in miles' three output formats, one rollout at a time (the imitation).

- The exact form of what miles leaves behind for one rollout, so the replay and the embedded
  example produce evidence the readers cannot tell from a real run's; it needs neither torch
  nor miles, so it is the CPU default.
- Job log: miles' ``[time identity] file:line - message`` lines behind Ray's ANSI actor
  prefix; per rollout, miles' order: the rollout manager's ``perf k``, the trainer's
  ``rollout k``, ``step k`` twice, the trainer's ``perf k``; dicts as Python reprs
  (``nan``/``inf``); :data:`TENSORBOARD_ONLY_KEYS` not printed.
- TensorBoard: one event file per process (the driver's header-only one included), one
  ``simple_value`` event per scalar at the rollout's step, flushed after every rollout.
- CI history: the trainer's ``<pid>-<uuid32>.jsonl`` of ``{"metric", "series"}`` lines,
  rewritten atomically after each rollout that captured a value; :meth:`close` leaves the
  driver's 0-byte record.

Caveats:

- ``simple_value`` is float32: a value read back from TensorBoard is the float32 rounding.
- The reference is the real-writer mode (``real_writers``);
  ``tests/rehearsal/test_real_writers.py`` compares the two on the same values.
- Does not decide which values are written, whether they are good, or faults.

Explained in ``docs/rehearsal.md`` ("The imitation writer", with miles' file:line sources).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TextIO

LogKind = Literal["perf", "rollout", "step", "trainer_perf", "tb_only"]

# The keys miles' CiHistoryBackend captures (TARGET_METRIC_KEYS), in its order. Newer miles
# also captures two TITO mismatch rates of multi-turn rollouts; this single-turn math recipe
# never logs them.
CI_CAPTURED_KEYS: tuple[str, ...] = (
    "train/grad_norm",
    "train/ppo_kl",
    "train/train_rollout_logprob_abs_diff",
    "train/train_rollout_kl",
    "rollout/raw_reward",
)

# miles' step keys: logged inside the dicts, used as the TensorBoard step, never a scalar.
STEP_KEYS: tuple[str, ...] = ("train/step", "rollout/step")
# Logged by the trainer's log_cpu_memory with tracking.log only: TensorBoard, never the log.
TENSORBOARD_ONLY_KEYS: tuple[str, ...] = ("perf/cpu_memory_after_offload_train_gb",)

TRAINER_ACTOR = "MegatronTrainRayActor"
ROLLOUT_ACTOR = "RolloutManager"
SGLANG_ACTOR = "SGLangEngine"
DRIVER_IDENTITY = "main"
ROLLOUT_IDENTITY = "rollout_manager"
TRAINER_IDENTITY = "actor_cell0_rank0"
# Ray's colour around a worker's prefix (colorama CYAN ... RESET_ALL), also in a log file.
RAY_PREFIX_COLOUR = ("\x1b[36m", "\x1b[0m")

# Source locations of the metric messages in the pinned miles (readers must not depend on
# them; the real-writer mode finds them in the miles tree it runs).
PERF_SOURCE = "metrics.py:89"
ROLLOUT_SOURCE = "log_utils.py:123"
STEP_SOURCES = ("log_utils.py:542", "model.py:854")
TRAINER_PERF_SOURCE = "train_metric_utils.py:56"

_ROLLOUT_MANAGER_KEYS = (
    "rollout/response_len/",
    "rollout/truncated_ratio",
    "rollout/repetition_frac",
    "rollout/zero_std/",
    "rollout/prefix_cache_hit_rate",
    "rollout/avg_cached_tokens_per_sample",
    "rollout/weight_version/",
)
_TRAINER_PERF_NAMES = ("actor_train_tok_per_s", "step_time", "wait_time_ratio", "mfu_peak_tflops")
_TRAINER_PERF_SUFFIXES = ("_time", "_tflops", "_mfu")
_ROLLOUT_PERF_PREFIXES = ("rollout_time", "longest_", "non_generation_time")


@dataclass(frozen=True)
class ActorPids:
    """The pids Ray shows in its line prefixes: trainer ranks, rollout manager, SGLang."""

    trainers: tuple[int, ...]
    rollout_manager: int
    sglang_engine: int

    @classmethod
    def around(cls, pid: int, trainer_ranks: int = 8) -> ActorPids:
        """Plausible, distinct actor pids next to ``pid`` (Ray's workers are its neighbours)."""
        return cls(
            trainers=tuple(pid + 10 + rank for rank in range(trainer_ranks)),
            rollout_manager=pid + 5,
            sglang_engine=pid + 30,
        )


def _trainer_perf(name: str) -> bool:
    if name.startswith(_ROLLOUT_PERF_PREFIXES):
        return False
    return name in _TRAINER_PERF_NAMES or name.endswith(_TRAINER_PERF_SUFFIXES)


def log_kind(key: str) -> LogKind:
    """Which miles message carries ``key``; a key of no miles message is a ``ValueError``.

    ``perf``: the rollout manager's ``perf k:``; ``trainer_perf``: the trainer's; ``tb_only``:
    TensorBoard alone. The step keys (:data:`STEP_KEYS`) are no metrics: the writer adds them.
    """
    if key in STEP_KEYS:
        raise ValueError(f"{key!r} is miles' step key, not a metric; the writer adds it")
    if key in TENSORBOARD_ONLY_KEYS:
        return "tb_only"
    if key.startswith("perf/"):
        return "trainer_perf" if _trainer_perf(key.removeprefix("perf/")) else "perf"
    if key.startswith(_ROLLOUT_MANAGER_KEYS):
        return "perf"
    if key.startswith("rollout/"):
        return "rollout"
    if key.startswith("train/"):
        return "step"
    raise ValueError(
        f"metric {key!r}: miles logs only train/*, rollout/* and perf/* keys per rollout"
    )


def format_log_time(epoch_seconds: float, identity: str = DRIVER_IDENTITY) -> str:
    """``[YYYY-MM-DD HH:MM:SS.mmm <identity>]`` in local time, as miles' log format renders it."""
    moment = datetime.fromtimestamp(epoch_seconds)
    return f"[{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d} {identity}]"


def ray_line(actor: str, pid: int, body: str) -> str:
    """A worker's line as the Ray driver prints it: ``<cyan>(<actor> pid=<pid>)<reset> <body>``."""
    return f"{RAY_PREFIX_COLOUR[0]}({actor} pid={pid}){RAY_PREFIX_COLOUR[1]} {body}"


def _step_dict(step: Mapping[str, float], rollout: int) -> dict[str, float | int]:
    """``log_train_step``'s order: the losses, ``train/grad_norm``, then ``train/step``."""
    out: dict[str, float | int] = {k: v for k, v in step.items() if k != "train/grad_norm"}
    if "train/grad_norm" in step:
        out["train/grad_norm"] = step["train/grad_norm"]
    out["train/step"] = rollout
    return out


def group_metrics(metrics: Mapping[str, float]) -> dict[LogKind, dict[str, float]]:
    """``metrics`` split by the message that carries each key (caller's order kept)."""
    groups: dict[LogKind, dict[str, float]] = {
        "perf": {}, "rollout": {}, "step": {}, "trainer_perf": {}, "tb_only": {},
    }  # fmt: skip
    for key, value in metrics.items():
        groups[log_kind(key)][key] = value
    return groups


def metric_log_lines(
    rollout: int, metrics: Mapping[str, float], pids: ActorPids, epoch_seconds: float
) -> list[str]:
    """The metric lines miles prints for one rollout (kinds without keys left out).

    Keys keep the caller's order within each message; ``ValueError`` for a key of no message.
    """
    groups = group_metrics(metrics)
    manager = format_log_time(epoch_seconds, ROLLOUT_IDENTITY)
    trainer = format_log_time(epoch_seconds, TRAINER_IDENTITY)
    rank0 = pids.trainers[0]
    lines = []
    if groups["perf"]:
        body = f"{manager} {PERF_SOURCE} - perf {rollout}: {groups['perf']}"
        lines.append(ray_line(ROLLOUT_ACTOR, pids.rollout_manager, body))
    if groups["rollout"]:
        body = f"{trainer} {ROLLOUT_SOURCE} - rollout {rollout}: {groups['rollout']}"
        lines.append(ray_line(TRAINER_ACTOR, rank0, body))
    if groups["step"]:
        step = _step_dict(groups["step"], rollout)
        for source in STEP_SOURCES:
            body = f"{trainer} {source} - step {rollout}: {step}"
            lines.append(ray_line(TRAINER_ACTOR, rank0, body))
    if groups["trainer_perf"]:
        body = f"{trainer} {TRAINER_PERF_SOURCE} - perf {rollout}: {groups['trainer_perf']}"
        lines.append(ray_line(TRAINER_ACTOR, rank0, body))
    return lines


def encode_ci_value(value: float) -> float | str:
    """A CI-history value: finite floats as numbers, non-finite as miles' string markers."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def ci_history_text(series: Mapping[str, list[tuple[int, float]]]) -> str:
    """The CI-history file for ``series`` (metric -> points), one strict-JSON line a metric."""
    return "".join(
        json.dumps(
            {"metric": key, "series": [[step, encode_ci_value(v)] for step, v in points]},
            allow_nan=False,
        )
        + "\n"
        for key, points in series.items()
    )


class MilesRunWriter:
    """Emits rollouts as miles does: log lines to ``stream``, TensorBoard, CI history.

    ``tensorboard_dir=None`` writes no event file; ``ci_history_dir=None`` no CI history
    (as miles without ``--use-tensorboard`` / ``MILES_CI_GATE_RECORD_DIR``). ``clock``
    gives the epoch seconds used for log timestamps and event wall times, and
    ``ci_record_name`` replaces miles' ``<pid>-<uuid4 hex>.jsonl`` of the trainer (both for
    reproducible output). :attr:`event_files` maps ``driver``/``rollout_manager``/``trainer``
    to their event files, :attr:`event_file` is the trainer's, :attr:`ci_file` the trainer's
    CI history and :attr:`driver_ci_file` the driver's (``None`` when off). Call
    :meth:`close` once at the end.
    """

    def __init__(
        self,
        tensorboard_dir: str | os.PathLike[str] | None,
        ci_history_dir: str | os.PathLike[str] | None,
        stream: TextIO,
        *,
        pids: ActorPids | None = None,
        clock: Callable[[], float] = time.time,
        ci_record_name: str | None = None,
    ) -> None:
        self._stream = stream
        self._pids = pids or ActorPids.around(os.getpid())
        self._clock = clock
        self._ci_series: dict[str, list[tuple[int, float]]] = {}
        self.ci_file: Path | None = None
        self.driver_ci_file: Path | None = None
        if ci_history_dir is not None:
            name = ci_record_name or f"{self._pids.trainers[0]}-{uuid.uuid4().hex}.jsonl"
            self.ci_file = Path(ci_history_dir) / name
            self.driver_ci_file = Path(ci_history_dir) / f"{os.getpid()}-{uuid.uuid4().hex}.jsonl"
        self._event_writers: dict[str, Any] = {}  # role -> tensorboard's EventFileWriter
        self.event_files: dict[str, Path] = {}
        if tensorboard_dir is not None:
            for role in ("driver", "rollout_manager", "trainer"):
                self._open_event_file(Path(tensorboard_dir), role)

    @property
    def pids(self) -> ActorPids:
        return self._pids

    @property
    def event_file(self) -> Path | None:
        """The trainer's event file (the one with the training scalars)."""
        return self.event_files.get("trainer")

    def _open_event_file(self, directory: Path, role: str) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        directory.mkdir(parents=True, exist_ok=True)
        before = set(directory.iterdir())
        # flush_secs is irrelevant: every rollout ends with an explicit flush.
        writer = EventFileWriter(str(directory))
        self._event_writers[role] = writer
        created = sorted(set(directory.iterdir()) - before)
        # EventFileWriter creates its file (with the file_version event) on construction and
        # does not expose the name; it is the one new file in the directory.
        if len(created) == 1:
            self.event_files[role] = created[0]

    def print_line(self, line: str) -> None:
        """Print one line of the driver (miles' ``main`` process) and flush."""
        self._stream.write(line + "\n")
        self._stream.flush()

    def print_actor_line(self, actor: str, body: str, rank: int = 0) -> None:
        """Print ``body`` as Ray forwards a line of ``actor`` (trainer rank ``rank``), flush."""
        pid = {SGLANG_ACTOR: self._pids.sglang_engine, TRAINER_ACTOR: self._pids.trainers[rank]}
        self.print_line(ray_line(actor, pid[actor], body))

    def emit_rollout(self, rollout: int, metrics: Mapping[str, float]) -> None:
        """Rollout ``rollout`` (0-based): log lines, then TensorBoard, then CI history."""
        now = self._clock()
        for line in metric_log_lines(rollout, metrics, self._pids, now):
            self._stream.write(line + "\n")
        self._stream.flush()
        if self._event_writers:
            self._write_scalars(rollout, metrics, now)
        if self.ci_file is not None:
            self._capture_ci(rollout, metrics)

    def _write_scalars(self, rollout: int, metrics: Mapping[str, float], now: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        groups = group_metrics(metrics)
        step = _step_dict(groups["step"], rollout) if groups["step"] else {}
        step.pop("train/step", None)
        # Each process's tracking.log calls, in miles' order.
        per_role = {
            "rollout_manager": [groups["perf"]],
            "trainer": [groups["rollout"], step, groups["trainer_perf"], groups["tb_only"]],
        }
        for role, dicts in per_role.items():
            writer = self._event_writers[role]
            for values in dicts:
                for key, value in values.items():
                    summary = Summary(value=[Summary.Value(tag=key, simple_value=value)])
                    writer.add_event(Event(wall_time=now, step=rollout, summary=summary))
            writer.flush()

    def _capture_ci(self, rollout: int, metrics: Mapping[str, float]) -> None:
        captured = False
        # One log() call for the trainer's rollout metrics, then one for the training step.
        for kind in ("rollout", "step"):
            for key in CI_CAPTURED_KEYS:
                if key in metrics and log_kind(key) == kind:
                    self._ci_series.setdefault(key, []).append((rollout, float(metrics[key])))
                    captured = True
        if captured:
            self._write_ci_snapshot()

    def _write_ci_snapshot(self) -> None:
        assert self.ci_file is not None
        self.ci_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ci_file.with_name(self.ci_file.name + ".tmp")
        tmp.write_text(ci_history_text(self._ci_series), encoding="utf-8")
        os.replace(tmp, self.ci_file)

    def close(self) -> None:
        """The driver's finish_tracking: close its event file, leave its 0-byte CI record.

        The actors' event files are flushed (after every rollout) but, as in miles, never
        closed by a finish(); they are closed here only to release the handles.
        """
        for writer in self._event_writers.values():
            writer.close()
        self._event_writers = {}
        if self.driver_ci_file is not None:
            self.driver_ci_file.parent.mkdir(parents=True, exist_ok=True)
            self.driver_ci_file.write_bytes(b"")

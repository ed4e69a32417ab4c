"""Writes a run's metrics in miles' three output formats, one rollout at a time.

Decides: the exact form of what miles leaves behind for one rollout, so the CPU rehearsal's
replay and the embedded example produce evidence that the readers cannot tell from a real
run's:

- **Job log** (stdout of the Ray job): miles' logger lines with Ray's actor prefix,
  ``(<Actor> pid=<pid>) [YYYY-MM-DD HH:MM:SS.mmm ] <file>:<line> - <message>``, local time.
  Per rollout ``k``, in the order miles prints them: the rollout manager's
  ``perf k: {...}`` (``perf/*``, ``rollout/response_len/*``, ``rollout/truncated_ratio``),
  the trainer's ``rollout k: {...}`` (every other ``rollout/*`` key) and the trainer's
  ``step k: {..., 'train/step': k}`` (``train/*``). A message kind without keys is not
  printed. The dicts are Python reprs, so a non-finite value prints as ``nan``/``inf``,
  exactly as miles prints it.
- **TensorBoard** (``TENSORBOARD_DIR``): one event per scalar, ``Summary.Value(tag,
  simple_value)`` -- the form ``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes
  (miles' ``_TensorboardAdapter`` calls it; torch is not needed here, tensorboard's own
  ``EventFileWriter`` writes the same records). ``train/*`` are logged at ``train/step``,
  ``rollout/*`` and ``perf/*`` at ``rollout/step``; with one optimizer step per rollout both
  are ``k``. The step key itself is not a scalar (miles drops it before logging). The file
  is flushed after every rollout, so a watcher sees each rollout promptly.
  Quirk: ``simple_value`` is a float32, so a value read back is the float32 rounding of the
  value written (the log line and the CI history keep the float64).
- **CI history** (``MILES_CI_GATE_RECORD_DIR``): ``<pid>-<uuid32>.jsonl``, one line per
  captured metric, ``{"metric": key, "series": [[step, value], ...]}``, non-finite values as
  the strings ``"NaN"``/``"Infinity"``/``"-Infinity"``. Only :data:`CI_CAPTURED_KEYS` are
  captured. Like miles' ``CiHistoryBackend`` (``miles/utils/tracking_utils/ci_history.py``),
  the whole file is rewritten atomically (temp file + ``os.replace``) after every rollout
  that captured a value, because miles' training actor never calls ``finish()``: the file
  is always the latest complete snapshot, also after a crash. No file is written until a
  captured key was logged. Lines appear in first-capture order (the trainer logs
  ``rollout/raw_reward`` before the training step).

Does not decide: which values are written (the caller's), whether they are good (the gate's),
or anything about faults (``faults``).
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
from typing import Literal, TextIO

LogKind = Literal["perf", "rollout", "step"]

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

TRAINER_ACTOR = "MegatronTrainRayActor"
ROLLOUT_ACTOR = "RolloutManager"
SGLANG_ACTOR = "SGLangEngine"

# Source locations miles' logger prints for the three metric messages (they vary by miles
# version; readers must not depend on them).
PERF_SOURCE = "rollout.py:689"
ROLLOUT_SOURCE = "log_utils.py:126"
STEP_SOURCE = "log_utils.py:542"

_PERF_ROLLOUT_KEYS = ("rollout/response_len/", "rollout/truncated_ratio")


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


def log_kind(key: str) -> LogKind:
    """Which miles message carries ``key``; a key of no miles message is a ``ValueError``.

    The step keys (:data:`STEP_KEYS`) are no metrics: the writer adds ``train/step`` itself.
    """
    if key in STEP_KEYS:
        raise ValueError(f"{key!r} is miles' step key, not a metric; the writer adds it")
    if key.startswith("perf/") or key.startswith(_PERF_ROLLOUT_KEYS):
        return "perf"
    if key.startswith("rollout/"):
        return "rollout"
    if key.startswith("train/"):
        return "step"
    raise ValueError(
        f"metric {key!r}: miles logs only train/*, rollout/* and perf/* keys per rollout"
    )


def format_log_time(epoch_seconds: float) -> str:
    """``[YYYY-MM-DD HH:MM:SS.mmm ]`` in local time, as miles' log format renders it."""
    moment = datetime.fromtimestamp(epoch_seconds)
    return f"[{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d} ]"


def ray_line(actor: str, pid: int, body: str) -> str:
    """A worker's line as the Ray driver prints it: ``(<actor> pid=<pid>) <body>``."""
    return f"({actor} pid={pid}) {body}"


def metric_log_lines(
    rollout: int, metrics: Mapping[str, float], pids: ActorPids, epoch_seconds: float
) -> list[str]:
    """The perf / rollout / step lines miles prints for one rollout (kinds without keys left out).

    Keys keep the caller's order within each message; ``ValueError`` for a key of no message.
    """
    groups: dict[LogKind, dict[str, float | int]] = {"perf": {}, "rollout": {}, "step": {}}
    for key, value in metrics.items():
        groups[log_kind(key)][key] = value
    stamp = format_log_time(epoch_seconds)
    lines = []
    if groups["perf"]:
        body = f"{stamp} {PERF_SOURCE} - perf {rollout}: {groups['perf']}"
        lines.append(ray_line(ROLLOUT_ACTOR, pids.rollout_manager, body))
    if groups["rollout"]:
        body = f"{stamp} {ROLLOUT_SOURCE} - rollout {rollout}: {groups['rollout']}"
        lines.append(ray_line(TRAINER_ACTOR, pids.trainers[0], body))
    if groups["step"]:
        step = {**groups["step"], "train/step": rollout}
        body = f"{stamp} {STEP_SOURCE} - step {rollout}: {step}"
        lines.append(ray_line(TRAINER_ACTOR, pids.trainers[0], body))
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
    ``ci_record_name`` replaces miles' ``<pid>-<uuid4 hex>.jsonl`` (both for reproducible
    output). :attr:`event_file` and :attr:`ci_file` are where it writes (``None`` when
    off). Call :meth:`close` once at the end.
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
        if ci_history_dir is not None:
            name = ci_record_name or f"{os.getpid()}-{uuid.uuid4().hex}.jsonl"
            self.ci_file = Path(ci_history_dir) / name
        self._event_writer = None
        self.event_file: Path | None = None
        if tensorboard_dir is not None:
            self._open_event_file(Path(tensorboard_dir))

    @property
    def pids(self) -> ActorPids:
        return self._pids

    def _open_event_file(self, directory: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        directory.mkdir(parents=True, exist_ok=True)
        before = set(directory.iterdir())
        # flush_secs is irrelevant: every rollout ends with an explicit flush.
        self._event_writer = EventFileWriter(str(directory))
        created = sorted(set(directory.iterdir()) - before)
        # EventFileWriter creates its file (with the file_version event) on construction and
        # does not expose the name; it is the one new file in the directory.
        self.event_file = created[0] if len(created) == 1 else None

    def print_line(self, line: str) -> None:
        """Print one job-log line and flush (a watcher reads the log as it grows)."""
        self._stream.write(line + "\n")
        self._stream.flush()

    def emit_rollout(self, rollout: int, metrics: Mapping[str, float]) -> None:
        """Rollout ``rollout`` (0-based): log lines, then TensorBoard, then CI history."""
        now = self._clock()
        for line in metric_log_lines(rollout, metrics, self._pids, now):
            self._stream.write(line + "\n")
        self._stream.flush()
        if self._event_writer is not None:
            self._write_scalars(rollout, metrics, now)
        if self.ci_file is not None:
            self._capture_ci(rollout, metrics)

    def _write_scalars(self, rollout: int, metrics: Mapping[str, float], now: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        assert self._event_writer is not None
        # miles logs the rollout metrics (rollout/step) before the training step (train/step).
        ordered = sorted(metrics.items(), key=lambda item: log_kind(item[0]) == "step")
        for key, value in ordered:
            summary = Summary(value=[Summary.Value(tag=key, simple_value=value)])
            self._event_writer.add_event(Event(wall_time=now, step=rollout, summary=summary))
        self._event_writer.flush()

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
        """Flush and close the event file; write the final CI-history snapshot (if any)."""
        if self._event_writer is not None:
            self._event_writer.close()
            self._event_writer = None
        if self.ci_file is not None and self._ci_series:
            self._write_ci_snapshot()

"""miles' three output formats, written one rollout at a time without torch or miles (the
imitation): job-log lines behind Ray's actor prefix, one TensorBoard event file per miles
process, the trainer's CI-history snapshot. The form only, never the values.
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

# miles' CiHistoryBackend.TARGET_METRIC_KEYS, in its order (newer miles adds two multi-turn
# TITO rates this single-turn recipe never logs).
CI_CAPTURED_KEYS: tuple[str, ...] = (
    "train/grad_norm", "train/ppo_kl", "train/train_rollout_logprob_abs_diff",
    "train/train_rollout_kl", "rollout/raw_reward",
)  # fmt: skip
STEP_KEYS: tuple[str, ...] = ("train/step", "rollout/step")  # the step, never a scalar
# Logged by the trainer's log_cpu_memory with tracking.log only: TensorBoard, never the log.
TENSORBOARD_ONLY_KEYS: tuple[str, ...] = ("perf/cpu_memory_after_offload_train_gb",)

TRAINER_ACTOR = "MegatronTrainRayActor"
ROLLOUT_ACTOR = "RolloutManager"
SGLANG_ACTOR = "SGLangEngine"

_ROLLOUT_MANAGER_KEYS = (
    "rollout/response_len/", "rollout/truncated_ratio", "rollout/repetition_frac",
    "rollout/zero_std/", "rollout/prefix_cache_hit_rate", "rollout/avg_cached_tokens_per_sample",
    "rollout/weight_version/",
)  # fmt: skip
_TRAINER_PERF_NAMES = ("actor_train_tok_per_s", "step_time", "wait_time_ratio", "mfu_peak_tflops")
_TRAINER_PERF_SUFFIXES = ("_time", "_tflops", "_mfu")
_ROLLOUT_PERF_PREFIXES = ("rollout_time", "longest_", "non_generation_time")


@dataclass(frozen=True)
class ActorPids:
    """The pids in Ray's line prefixes."""

    trainers: tuple[int, ...]
    rollout_manager: int
    sglang_engine: int

    @classmethod
    def around(cls, pid: int, trainer_ranks: int = 8) -> ActorPids:
        return cls(tuple(pid + 10 + rank for rank in range(trainer_ranks)), pid + 5, pid + 30)


def log_kind(key: str) -> LogKind:
    """Which miles message carries ``key``; a key of no miles message is a ``ValueError``."""
    if key in STEP_KEYS:
        raise ValueError(f"{key!r} is miles' step key, not a metric; the writer adds it")
    if key in TENSORBOARD_ONLY_KEYS:
        return "tb_only"
    if key.startswith("perf/"):
        name = key.removeprefix("perf/")
        trainer = not name.startswith(_ROLLOUT_PERF_PREFIXES) and (
            name in _TRAINER_PERF_NAMES or name.endswith(_TRAINER_PERF_SUFFIXES)
        )
        return "trainer_perf" if trainer else "perf"
    if key.startswith(_ROLLOUT_MANAGER_KEYS):
        return "perf"
    if key.startswith("rollout/"):
        return "rollout"
    if key.startswith("train/"):
        return "step"
    raise ValueError(f"metric {key!r}: miles logs only train/*, rollout/* and perf/* per rollout")


def format_log_time(epoch_seconds: float, identity: str = "main") -> str:
    """``[YYYY-MM-DD HH:MM:SS.mmm <identity>]`` in local time, as miles logs it."""
    moment = datetime.fromtimestamp(epoch_seconds)
    return f"[{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d} {identity}]"


def ray_line(actor: str, pid: int, body: str) -> str:
    return f"\x1b[36m({actor} pid={pid})\x1b[0m {body}"  # colorama CYAN, RESET_ALL


def group_metrics(metrics: Mapping[str, float]) -> dict[LogKind, dict[str, float]]:
    """``metrics`` by the message that carries each key; the step group in ``log_train_step``'s
    order (the losses, then ``train/grad_norm``)."""
    groups: dict[LogKind, dict[str, float]] = {
        "perf": {}, "rollout": {}, "step": {}, "trainer_perf": {}, "tb_only": {},
    }  # fmt: skip
    for key, value in metrics.items():
        groups[log_kind(key)][key] = value
    if "train/grad_norm" in groups["step"]:
        groups["step"]["train/grad_norm"] = groups["step"].pop("train/grad_norm")
    return groups


def metric_log_lines(
    rollout: int, metrics: Mapping[str, float], pids: ActorPids, epoch_seconds: float
) -> list[str]:
    """The metric lines miles prints for one rollout, in its order."""
    groups = group_metrics(metrics)
    manager = format_log_time(epoch_seconds, "rollout_manager")
    trainer = format_log_time(epoch_seconds, "actor_cell0_rank0")
    step = {**groups["step"], "train/step": rollout} if groups["step"] else {}
    messages = [  # where the pinned miles logs each (readers must not depend on it)
        (ROLLOUT_ACTOR, manager, "metrics.py:89", "perf", groups["perf"]),
        (TRAINER_ACTOR, trainer, "log_utils.py:123", "rollout", groups["rollout"]),
        (TRAINER_ACTOR, trainer, "log_utils.py:542", "step", step),
        (TRAINER_ACTOR, trainer, "model.py:854", "step", step),
        (TRAINER_ACTOR, trainer, "train_metric_utils.py:56", "perf", groups["trainer_perf"]),
    ]
    return [
        ray_line(actor, pids.rollout_manager if actor == ROLLOUT_ACTOR else pids.trainers[0],
                 f"{stamp} {source} - {word} {rollout}: {values}")
        for actor, stamp, source, word, values in messages
        if values
    ]  # fmt: skip


def encode_ci_value(value: float) -> float | str:  # non-finite: miles' string markers
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def ci_history_text(series: Mapping[str, list[tuple[int, float]]]) -> str:
    """The CI-history file: one strict-JSON line a metric."""
    return "".join(
        json.dumps(
            {"metric": key, "series": [[step, encode_ci_value(v)] for step, v in points]},
            allow_nan=False,
        )
        + "\n"
        for key, points in series.items()
    )


class MilesRunWriter:
    """Log lines to ``stream``, TensorBoard, CI history (a ``None`` dir: off); ``clock`` and
    ``ci_record_name`` make the output reproducible. Call :meth:`close` once."""

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
        self.pids = pids or ActorPids.around(os.getpid())
        self._clock = clock
        self._ci_series: dict[str, list[tuple[int, float]]] = {}
        self.ci_file: Path | None = None
        self.driver_ci_file: Path | None = None
        if ci_history_dir is not None:
            name = ci_record_name or f"{self.pids.trainers[0]}-{uuid.uuid4().hex}.jsonl"
            self.ci_file = Path(ci_history_dir) / name
            self.driver_ci_file = Path(ci_history_dir) / f"{os.getpid()}-{uuid.uuid4().hex}.jsonl"
        self._event_writers: dict[str, Any] = {}  # role -> tensorboard's EventFileWriter
        self.event_files: dict[str, Path] = {}
        if tensorboard_dir is not None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            directory = Path(tensorboard_dir)
            directory.mkdir(parents=True, exist_ok=True)
            for role in ("driver", "rollout_manager", "trainer"):
                before = set(directory.iterdir())
                # It writes its file (the file_version event) at once, and does not name it.
                self._event_writers[role] = EventFileWriter(str(directory))
                created = sorted(set(directory.iterdir()) - before)
                if len(created) == 1:
                    self.event_files[role] = created[0]

    @property
    def event_file(self) -> Path | None:  # the trainer's: the training scalars
        return self.event_files.get("trainer")

    def print_line(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

    def print_actor_line(self, actor: str, body: str, rank: int = 0) -> None:
        pid = {SGLANG_ACTOR: self.pids.sglang_engine, TRAINER_ACTOR: self.pids.trainers[rank]}
        self.print_line(ray_line(actor, pid[actor], body))

    def emit_rollout(self, rollout: int, metrics: Mapping[str, float]) -> None:
        now = self._clock()
        for line in metric_log_lines(rollout, metrics, self.pids, now):
            self._stream.write(line + "\n")
        self._stream.flush()
        if self._event_writers:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary

            groups = group_metrics(metrics)
            per_role = {  # each process's tracking.log calls, in miles' order
                "rollout_manager": [groups["perf"]],
                "trainer": [groups["rollout"], groups["step"], groups["trainer_perf"],
                            groups["tb_only"]],
            }  # fmt: skip
            for role, dicts in per_role.items():
                for values in dicts:
                    for key, value in values.items():
                        summary = Summary(value=[Summary.Value(tag=key, simple_value=value)])
                        self._event_writers[role].add_event(
                            Event(wall_time=now, step=rollout, summary=summary)
                        )
                self._event_writers[role].flush()
        if self.ci_file is not None:
            # One log() call for the trainer's rollout metrics, then one for the training step.
            captured = [
                key
                for kind in ("rollout", "step")
                for key in CI_CAPTURED_KEYS
                if key in metrics and log_kind(key) == kind
            ]
            for key in captured:
                self._ci_series.setdefault(key, []).append((rollout, float(metrics[key])))
            if captured:
                self.ci_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.ci_file.with_name(self.ci_file.name + ".tmp")
                tmp.write_text(ci_history_text(self._ci_series), encoding="utf-8")
                os.replace(tmp, self.ci_file)

    def close(self) -> None:
        """The driver's finish_tracking: its event file closed, its 0-byte CI record left."""
        for writer in self._event_writers.values():
            writer.close()
        self._event_writers = {}
        if self.driver_ci_file is not None:
            self.driver_ci_file.parent.mkdir(parents=True, exist_ok=True)
            self.driver_ci_file.write_bytes(b"")

"""Fail-fast: when a running job is already lost (what counts as lost is the gate's).

A trip at a look stops the job as ``look``, any other as ``fail-fast``. A fault appeared at the
job's own clock (the stamp on that rollout's or the sentinel's log line, local time); the stop
time minus it is the fail-fast latency.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from miles_amd.evidence.types import RunEvidence
from miles_amd.redact import redact
from miles_amd.run_dir import RunDir

# miles: "[2026-11-20 10:03:50.007 ]"; SGLang: "[2026-11-20 10:03:50 TP0]" (whole seconds).
LOG_TIME = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(\.\d{3})?[^\]]*\]")
METRIC_LINE = re.compile(r" - (?:step|rollout|perf) (\d+): \{")


@dataclass(frozen=True)
class Trip:
    rule: str
    detail: str
    step: int | None
    line: int | None  # the sentinel's 1-based line in job.log
    fault_time: float | None  # seconds since the epoch, from the job's own log line
    detected_at: float
    look: int | None = None  # the look (rollouts judged) of a spending rule's crossing
    alpha_spent: float | None = None  # the rate that rule had spent by the look

    @property
    def reason(self) -> str:  # the driver's stop reason (``JobRecord.stopped_by``)
        return "fail-fast" if self.look is None else "look"

    def timed_from(self, log_lines: Sequence[str]) -> Trip:
        """With ``fault_time`` read from the log when not known yet."""
        if self.fault_time is not None:
            return self
        when = None
        if self.line is not None and 0 < self.line <= len(log_lines):
            when = line_time(log_lines[self.line - 1])
        elif self.step is not None:
            when = first_metric_line_time(log_lines, self.step)
        return replace(self, fault_time=when)


def line_time(line: str) -> float | None:
    match = LOG_TIME.search(line)
    if not match:
        return None
    stamp = match.group(1) + (match.group(2) or ".000")
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def first_metric_line_time(log_lines: Sequence[str], step: int) -> float | None:
    for line in log_lines:
        match = METRIC_LINE.search(line)
        if match and int(match.group(1)) == step:
            return line_time(line)
    return None


class FailFastWatcher:
    """``judge`` maps partial evidence to the checks it fails; the first trips it, once."""

    def __init__(self, run_dir: Path, judge: Callable[[RunEvidence], Sequence[Any]]) -> None:
        self.run_dir, self.judge = run_dir, judge
        self.trip: Trip | None = None

    def poll(self) -> Trip | None:
        if self.trip is not None or not self.run_dir.exists():
            return self.trip
        from miles_amd.evidence.load import load_run

        failures = list(self.judge(load_run(self.run_dir, live=True)))
        if not failures:
            return None
        check = failures[0]
        steps = getattr(check, "failing_steps", ())
        numbers = getattr(check, "numbers", {})
        look = getattr(check, "look", None)
        trip = Trip(
            rule=str(getattr(check, "name", check)),
            detail=redact(str(getattr(check, "detail", ""))),  # job.json keeps it
            step=steps[0] if steps else (look - 1 if look else None),
            line=int(numbers.get("first_line", 0)) or None,
            fault_time=None,
            detected_at=time.time(),
            look=look,
            alpha_spent=numbers.get("alpha_spent") if look is not None else None,
        )
        self.trip = trip.timed_from(read_lines(RunDir(self.run_dir).job_log))
        return self.trip


def read_lines(path: Path) -> list[str]:
    """The log's lines split on ``\\n`` (as sentinel line numbers count); [] if unreadable."""
    from miles_amd.evidence.job_log import line_blocks
    from miles_amd.files import JOB_LOG, RefusedFile, open_regular

    try:
        handle, size = open_regular(path, JOB_LOG)
        with handle:
            lines = "".join(text for _first, text in line_blocks(handle, size)).split("\n")
    except (OSError, RefusedFile):
        return []
    return lines if lines[-1] else lines[:-1]

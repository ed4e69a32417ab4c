"""The shared vocabulary between reading a run and judging it.

A run directory (``tensorboard/``, ``ci_history/*.jsonl``, ``job.log``, ``job.json``,
``env.json``) is read into one :class:`RunEvidence`. This module only names the shapes;
it reads nothing and judges nothing.

Rules every producer of these types keeps:

- A series is the points of one metric key, ordered by step, exactly as read: a duplicated
  step stays duplicated (the gate names it), nothing is dropped or interpolated.
- Evidence that could not be read is a :class:`SourceProblem` naming the file and the
  offset or line, never an empty series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from miles_amd.run_dir import JobRecord  # job.json's one model, written by the driver

Point = tuple[int, float]
Series = tuple[Point, ...]
SeriesMap = dict[str, Series]

SourceName = Literal["tensorboard", "ci_history", "job_log"]
Severity = Literal["fatal", "known"]


@dataclass(frozen=True)
class SourceProblem:
    """Evidence that exists but cannot be trusted (corrupt, truncated, malformed)."""

    source: SourceName | Literal["job_json", "env_json", "run_dir"]
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.detail}"


@dataclass(frozen=True)
class Conflict:
    """Two sources carry the same metric at the same step with values that disagree."""

    metric: str
    step: int
    values: dict[str, float]


@dataclass(frozen=True)
class SentinelHit:
    """A known log signature found in ``job.log``."""

    name: str
    severity: Severity
    count: int
    first_line: int  # 1-based line number in job.log
    first_text: str
    reference: str  # issue / PR / doc the signature is tracked in, or ""


@dataclass(frozen=True)
class RunEvidence:
    """Everything read from one run directory, before any judgement."""

    run_dir: str
    series: SeriesMap  # merged across sources, TensorBoard preferred
    sources: dict[str, SourceName]  # metric -> source its series came from
    problems: tuple[SourceProblem, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    job: JobRecord | None = None
    env: dict[str, object] | None = None
    sentinels: tuple[SentinelHit, ...] = ()


__all__ = [
    "Conflict",
    "JobRecord",
    "Point",
    "RunEvidence",
    "SentinelHit",
    "Series",
    "SeriesMap",
    "Severity",
    "SourceName",
    "SourceProblem",
]

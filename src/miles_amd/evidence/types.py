"""The shared vocabulary between reading a run and judging it.

A run directory (``tensorboard/``, ``ci_history/*.jsonl``, ``job.log``, and the records
``job.json``, ``env.json``, ``plan.json``, ``canary.json``: ``miles_amd.records``) is read
into one :class:`RunEvidence`. This module only names the shapes; it reads nothing and
judges nothing.

Rules every producer of these types keeps:

- A series is the points of one metric key, ordered by step, exactly as read: a duplicated
  step stays duplicated (the gate names it), nothing is dropped or interpolated.
- Evidence that could not be read is a :class:`SourceProblem` naming the file and the
  offset or line, not an empty series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from miles_amd.records.canary import CanaryRecord
from miles_amd.records.env import EnvRecord
from miles_amd.records.job import JobRecord
from miles_amd.records.plan import PlanRecord

Point = tuple[int, float]
Series = tuple[Point, ...]
SeriesMap = dict[str, Series]

SourceName = Literal["tensorboard", "ci_history", "job_log"]
RecordName = Literal["job_json", "env_json", "plan_json", "canary_json"]
Severity = Literal["fatal", "known"]


@dataclass(frozen=True)
class SourceProblem:
    """Evidence that exists but cannot be trusted (corrupt, truncated, malformed)."""

    source: SourceName | RecordName | Literal["run_dir"]
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
    advice: str = ""  # what to do about it (the sentinel table's)


@dataclass(frozen=True)
class RunEvidence:
    """Everything read from one run directory, before any judgement."""

    run_dir: str
    series: SeriesMap  # merged across sources, TensorBoard preferred
    sources: dict[str, SourceName]  # metric -> source its series came from
    problems: tuple[SourceProblem, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    job: JobRecord | None = None
    env: EnvRecord | None = None
    plan: PlanRecord | None = None
    canary: CanaryRecord | None = None
    sentinels: tuple[SentinelHit, ...] = ()

    @property
    def variant(self) -> str | None:
        """Which aiter variant the run is: env.json's ``aiter_variant`` (the preflight's), else
        plan.json's (what the job's env was set for); None when neither records one."""
        if self.env is not None and self.env.aiter_variant is not None:
            return self.env.aiter_variant
        return self.plan.aiter_variant if self.plan is not None else None


__all__ = [
    "CanaryRecord",
    "Conflict",
    "EnvRecord",
    "JobRecord",
    "PlanRecord",
    "Point",
    "RecordName",
    "RunEvidence",
    "SentinelHit",
    "Series",
    "SeriesMap",
    "Severity",
    "SourceName",
    "SourceProblem",
]

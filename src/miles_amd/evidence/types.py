"""The shared vocabulary between reading a run and judging it, and the normal form of a series:
:data:`SeriesMap`, ``metric -> ((step, value), ...)``, sorted by step (stable), duplicates
kept, a metric without points absent. Evidence that cannot be read is a named error and then
a :class:`SourceProblem`, never an empty series.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from miles_amd.records.canary import CanaryRecord
from miles_amd.records.env import EnvRecord
from miles_amd.records.job import JobRecord
from miles_amd.records.plan import PlanRecord

Point = tuple[int, float]
Series = tuple[Point, ...]
SeriesMap = dict[str, Series]
Columns = tuple[list[int], array]  # (steps, values as array("d")) of one metric, read order

SourceName = Literal["tensorboard", "ci_history", "job_log"]
RecordName = Literal["job_json", "env_json", "plan_json", "canary_json"]
Severity = Literal["fatal", "known"]


class MetricsFormatError(ValueError):
    """A line-oriented metrics file (JSONL, job log) that cannot be read as written; ``line``
    is 1-based and counts ``\\n`` only, so it matches ``grep -n``."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}")


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
        """The run's aiter variant: env.json's (the preflight's), else plan.json's."""
        if self.env is not None and self.env.aiter_variant is not None:
            return self.env.aiter_variant
        return self.plan.aiter_variant if self.plan is not None else None


def new_columns() -> Columns:
    return ([], array("d"))


def columns_to_series(columns_by_metric: Mapping[str, Columns]) -> SeriesMap:
    """Every metric's parallel steps and values (read order) as a series, sorted by step
    (stable); metrics without points left out."""
    series: SeriesMap = {}
    for metric, (steps, values) in sorted(columns_by_metric.items()):
        if steps:
            order = sorted(range(len(steps)), key=steps.__getitem__)
            if order != list(range(len(steps))):
                steps, values = [steps[i] for i in order], array("d", [values[i] for i in order])
            series[metric] = tuple(zip(steps, values, strict=True))
    return series

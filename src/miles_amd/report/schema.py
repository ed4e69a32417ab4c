"""report.json's model: the shape ``miles-amd gate`` writes, from which its JSON Schema
(``report/report.schema.json``, package data) is generated (``records.model.json_schema``).

Decides what a consumer of report.json may rely on (``docs/cli.md``, "The report"); the
writer is ``report.render.to_json`` and ``tests/unit/test_report.py`` holds the gate's
reports to this schema. Imported only to generate or check the schema (it imports pydantic).
"""

from __future__ import annotations

from typing import Annotated, Literal

from annotated_types import Ge, MinLen
from pydantic import BaseModel, ConfigDict, Field

# a finite number, or one of miles' markers for a non-finite one
Number = float | Literal["NaN", "Infinity", "-Infinity"]
Count = Annotated[int, Ge(0)]
Status = Literal["pass", "fail", "error", "not_measured"]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Baseline(_Closed):
    name: str
    path: str
    run_id: str
    sha256: str | None = None
    shipped_sha256: str | None = None
    matches_shipped: bool | None = None


class ExpectedFailure(_Closed):
    reason: Literal["ROCm/aiter#5694 reproduced"]
    canary: str
    """the canary's evidence: its wrong sums"""
    checks: Annotated[list[str], MinLen(1)]


class Counts(_Closed):
    pass_: Count = Field(alias="pass")
    fail: Count
    error: Count
    not_measured: Count


class CheckRow(_Closed):
    name: Annotated[str, MinLen(1)]
    metric: str | None
    kind: str
    required: bool
    status: Status
    observed: Number | str | None
    expected: str
    detail: str
    """why: for a not_measured check, what was missing"""
    rationale: str
    failing_steps: list[int]
    numbers: dict[str, Number]


class SentinelHit(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    severity: Literal["fatal", "known"]
    count: Annotated[int, Ge(1)]
    first_line: Annotated[int, Ge(1)]
    first_text: str
    reference: str


class Problem(_Closed):
    source: str
    path: str
    detail: str


class Conflict(_Closed):
    metric: str
    step: int
    values: dict[str, Number]


class Evidence(_Closed):
    sources: dict[str, str]
    problems: list[Problem]
    conflicts: list[Conflict]


class Report(_Closed):
    """What `miles-amd gate` writes as report.json (miles_amd.report.render.to_json).
    Non-finite numbers are miles' markers "NaN", "Infinity", "-Infinity". A change of shape
    bumps schema_version."""

    schema_version: Literal[3]
    verdict: Literal["pass", "fail", "error"]
    reason: str
    summary: str
    exit_code: Literal[0, 1, 2]
    run_dir: str
    baseline: Baseline
    expected_rollouts: Annotated[int, Ge(1)]
    looks: list[Annotated[int, Ge(1)]]
    """the rollouts the run was judged at (the baseline's run_shape.looks, the last one
    expected_rollouts); empty with --no-looks"""
    decided_at_rollout: Annotated[int, Ge(1)] | None
    """a red run: the rollouts after which it was decided (a look, a failing value's rollout
    plus one, or the rollouts it reached); null for a pass"""
    decided_by: str | None
    """the check that decided a red run; null for a pass"""
    alpha_spent: Number | None
    """the false-alarm rate the deciding rule had spent by its look (a spending rule); null
    otherwise"""
    expected_failure: ExpectedFailure | None
    """a red stock run whose failing checks are the logprob rules the canary's reproduced
    ROCm/aiter#5694 explains (judge.canary); null otherwise"""
    counts: Counts
    checks: list[CheckRow]
    sentinels: list[SentinelHit]
    evidence: Evidence

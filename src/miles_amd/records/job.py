"""``job.json``: the Ray job's end state (:class:`JobRecord`, read by ``records.model``), and
:func:`json_object`, the strict JSON object reader of every run-dir record.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, get_args

from annotated_types import Ge, Gt, Le, MinLen

from miles_amd import strict_json
from miles_amd.records.model import As, checked, parse

_JobState = Literal["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]
_StopReason = Literal["timeout", "interrupt", "fail-fast", "look"]
JOB_STATES = frozenset(get_args(_JobState))
STOP_REASONS = frozenset(get_args(_StopReason))


@dataclass(frozen=True)
class LookStop:
    """Why the driver stopped a job at a look (``stopped_by: "look"``): after ``rollout``
    rollouts, rule ``rule`` crossed its boundary, having spent ``alpha_spent`` of its
    false-alarm rate (``miles_amd.rules.looks``)."""

    rollout: Annotated[int, Ge(1)]
    rule: Annotated[str, MinLen(1)]
    alpha_spent: Annotated[float, Gt(0), Le(1)]


@dataclass(frozen=True)
class JobRecord:
    """``job.json``: the Ray job's end state and why the driver stopped it: ``job_id`` and
    ``status`` required, any other field absent or null, unknown keys ignored, ``look`` present
    exactly when ``stopped_by`` is ``look``."""

    job_id: Annotated[str, MinLen(1)]
    status: Annotated[str, As(_JobState)]
    message: str = ""
    start_time: float | None = None  # epoch seconds (Ray reports milliseconds)
    end_time: float | None = None
    driver_exit_code: int | None = None
    stopped_by: Annotated[str, As(_StopReason)] | None = None
    stop_requested_at: float | None = None  # when the driver asked Ray to stop (epoch s)
    # the watcher's trip: rule, detail, step, line, fault_time, detected_at (+ look, alpha_spent)
    failfast: dict[str, Any] | None = None
    failfast_latency_s: float | None = None  # stop request minus the fault, on the job's clock
    final_log_error: str | None = None  # why Ray gave no full log (job.log: what was streamed)
    look: LookStop | None = None

    __get_pydantic_core_schema__ = checked

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @property
    def contradiction(self) -> str | None:
        """Why a ``SUCCEEDED`` record contradicts itself (a non-zero driver exit code, a driver
        stop or a fail-fast trip: the ``job_status`` rule fails it), or ``None``."""
        if self.status != "SUCCEEDED":
            return None
        if self.driver_exit_code not in (None, 0):
            return f"status SUCCEEDED but driver exit code {self.driver_exit_code}"
        if self.stopped_by is not None:
            return f"status SUCCEEDED but stopped by the driver ({self.stopped_by})"
        if self.failfast is not None:
            return "status SUCCEEDED but a fail-fast trip is recorded"
        return None

    def _check(self) -> str | None:
        if (self.stopped_by == "look") != (self.look is not None):
            return (
                f'"look" must be an object exactly when "stopped_by" is "look", found '
                f"stopped_by {self.stopped_by!r} and look {self.look!r}"
            )
        return None

    @classmethod
    def from_json(cls, text: str | bytes) -> JobRecord:
        """Parse ``job.json``'s text; ``ValueError`` for bad JSON or a bad field."""
        return cls.from_dict(json_object(text))

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> JobRecord:
        """The record of job.json's object; a null field is an absent one (its default)."""
        return parse(cls, {key: value for key, value in data.items() if value is not None})


def json_object(text: str | bytes) -> dict[str, object]:
    """The JSON object in a run-dir file's ``text``, read by ``miles_amd.strict_json``;
    ``ValueError`` saying what is wrong and where (its JSON path)."""
    data = strict_json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    return data

"""``job.json``: the Ray job's end state, as the driver writes it and evidence/ reads it.

Decides :class:`JobRecord`'s fields and their validation (strict: a wrong type is a
``ValueError`` naming the field) and :func:`json_object`, the strict JSON object reader of
every run-dir record (``miles_amd.strict_json``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import TypeVar

from miles_amd import strict_json

__all__ = ["JOB_STATES", "STOP_REASONS", "JobRecord", "LookStop", "json_object"]

JOB_STATES = frozenset({"PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"})
STOP_REASONS = frozenset({"timeout", "interrupt", "fail-fast", "look"})
T = TypeVar("T")


@dataclass(frozen=True)
class LookStop:
    """Why the driver stopped a job at a look (``stopped_by: "look"``): after ``rollout``
    rollouts, rule ``rule`` crossed its boundary, having spent ``alpha_spent`` of its
    false-alarm rate (``miles_amd.rules.looks``)."""

    rollout: int
    rule: str
    alpha_spent: float

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> LookStop:
        rollout, rule, alpha = data.get("rollout"), data.get("rule"), data.get("alpha_spent")
        if isinstance(rollout, bool) or not isinstance(rollout, int) or rollout < 1:
            raise ValueError(f'"look.rollout" must be an integer >= 1, found {rollout!r}')
        if not isinstance(rule, str) or not rule:
            raise ValueError(f'"look.rule" must be a non-empty string, found {rule!r}')
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, (int, float))
            or not 0 < alpha <= 1  # NaN fails too
        ):
            raise ValueError(f'"look.alpha_spent" must be a rate in (0, 1], found {alpha!r}')
        return cls(rollout, rule, float(alpha))


@dataclass(frozen=True)
class JobRecord:
    """``job.json``: the Ray job's end state and why the driver stopped it, if it did.

    Written by the driver (:meth:`to_json`), read back by :meth:`from_json`, which is strict:
    ``job_id`` (non-empty string) and ``status`` (one of Ray's :data:`JOB_STATES`) are
    required; every other field may be absent or null; a wrong type raises ``ValueError``
    naming the field. Keys this model does not know are ignored.

    - ``start_time``/``end_time``: seconds since the epoch (Ray reports milliseconds).
    - ``stopped_by``: ``None`` or one of :data:`STOP_REASONS`; ``stop_requested_at`` is when
      the driver asked Ray to stop the job (epoch seconds).
    - ``failfast``: the watcher's trip (``rule``, ``detail``, ``step``, ``line``,
      ``fault_time``, ``detected_at``, and ``look``, ``alpha_spent`` for a look's);
      ``failfast_latency_s``: the stop request minus the moment the fault appeared on the
      job's own clock (for a look: its last rollout's log line).
    - ``look``: a :class:`LookStop`, present exactly when ``stopped_by`` is ``look`` (a rule
      crossed its boundary at a look; ``tests/unit/test_job_record_hardening.py``).
    - ``final_log_error``: why Ray could not give the job's full log at its end (its node
      was lost); ``job.log`` is then only what was streamed, so the run cannot pass.
    - :attr:`contradiction`: a record at odds with itself (``SUCCEEDED`` with a non-zero
      driver exit code, a driver stop or a fail-fast trip); the ``job_status`` rule fails it
      (``tests/unit/test_job_record_hardening.py``).
    """

    job_id: str
    status: str
    message: str = ""
    start_time: float | None = None
    end_time: float | None = None
    driver_exit_code: int | None = None
    stopped_by: str | None = None
    stop_requested_at: float | None = None
    failfast: dict[str, object] | None = None
    failfast_latency_s: float | None = None
    final_log_error: str | None = None
    look: LookStop | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @property
    def contradiction(self) -> str | None:
        """Why this record contradicts itself, or ``None`` (class doc)."""
        if self.status != "SUCCEEDED":
            return None
        if self.driver_exit_code not in (None, 0):
            return f"status SUCCEEDED but driver exit code {self.driver_exit_code}"
        if self.stopped_by is not None:
            return f"status SUCCEEDED but stopped by the driver ({self.stopped_by})"
        if self.failfast is not None:
            return "status SUCCEEDED but a fail-fast trip is recorded"
        return None

    @classmethod
    def from_json(cls, text: str | bytes) -> JobRecord:
        """Parse ``job.json``'s text; ``ValueError`` for bad JSON or a bad field."""
        return cls.from_dict(json_object(text))

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> JobRecord:
        job_id, status = data.get("job_id"), data.get("status")
        stopped_by, look = _stop_reason(data), _optional(data, "look", dict, "an object")
        if (stopped_by == "look") != (look is not None):
            raise ValueError(
                f'"look" must be an object exactly when "stopped_by" is "look", found '
                f"stopped_by {stopped_by!r} and look {look!r}"
            )
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f'"job_id" must be a non-empty string, found {job_id!r}')
        if not isinstance(status, str) or status not in JOB_STATES:
            raise ValueError(f'"status" must be one of {sorted(JOB_STATES)}, found {status!r}')
        return cls(
            job_id=job_id,
            status=status,
            message=_optional(data, "message", str, "a string") or "",
            start_time=_number(data, "start_time"),
            end_time=_number(data, "end_time"),
            driver_exit_code=_optional(data, "driver_exit_code", int, "an integer"),
            stopped_by=stopped_by,
            stop_requested_at=_number(data, "stop_requested_at"),
            failfast=_optional(data, "failfast", dict, "an object"),
            failfast_latency_s=_number(data, "failfast_latency_s"),
            final_log_error=_optional(data, "final_log_error", str, "a string"),
            look=LookStop.from_dict(look) if look is not None else None,
        )


def _optional(data: dict[str, object], name: str, kind: type[T], what: str) -> T | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f'"{name}" must be {what} or null, found {value!r}')
    return value


def _stop_reason(data: dict[str, object]) -> str | None:
    value = data.get("stopped_by")
    if value is not None and value not in STOP_REASONS:
        raise ValueError(
            f'"stopped_by" must be null or one of {sorted(STOP_REASONS)}, found {value!r}'
        )
    return value


def _number(data: dict[str, object], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f'"{name}" must be a finite number or null, found {value!r}')
    return float(value)


def json_object(text: str | bytes) -> dict[str, object]:
    """The JSON object in a run-dir file's ``text``, read by ``miles_amd.strict_json`` (no
    duplicate key, no non-finite number, bounded depth and integers); ``ValueError`` saying
    what is wrong and where (its JSON path)."""
    data = strict_json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    return data

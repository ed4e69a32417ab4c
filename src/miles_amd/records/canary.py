"""``canary.json``: what a canary run tested, with what power, and what it found.

Decides the record's model (:class:`CanaryRecord`, frozen) and its JSON: :meth:`to_json`
writes it, :meth:`CanaryRecord.from_json` reads it strictly (``miles_amd.strict_json``: no
duplicate key, no non-finite number), like ``JobRecord`` (``job.json``): every field is required
unless marked optional, a wrong type or value raises ``ValueError`` naming the field's path
(``results[2].first_mismatch.index``); keys the model does not know are ignored. The same
shape as JSON Schema ships as ``canary/canary.schema.json`` (a test holds the writer's
output to it). ``canary.record.write_canary`` writes it into a run dir; ``miles_amd.evidence``
reads it into ``RunEvidence.canary``.

Fields (``schema_version`` 1): ``implementation`` (``variants.IMPLEMENTATIONS``) and
``reducer`` (the seam's ``FILE:FUNCTION``, else null); ``variant`` (null on CPU);
``aiter_version``/``aiter_commit`` (null when unknown); ``dispatch_source`` (where the
thresholds came from); ``shape`` (``plan.RecipeShape``); ``plan`` (``plan.PlanEntry``);
``results`` per size (calls made, ``mismatches`` = calls whose result was wrong on at least
one rank, ``wrong_elements`` summed over ranks, the first mismatch, the mean latency per
call in microseconds, the largest rate the clean calls do not exclude at 99 %); ``power``
(the detect rate, the confidence, the affected calls made, the detection probability, the
estimated node seconds and the latency model's source); ``repeats`` and
``repeats_with_mismatch``; ``start_time``/``end_time`` (epoch seconds); ``world_size``,
``groups`` (TP groups side by side), ``backend``, ``device``, ``tensor_dtype``; optional
``control`` (the positive control's broken build run first on the node, ``canary.control``;
absent or null when none ran).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from miles_amd import strict_json, variants
from miles_amd.variants import IMPLEMENTATIONS

__all__ = [
    "SCHEMA_VERSION",
    "CanaryRecord",
    "ControlResult",
    "FirstMismatch",
    "PowerRecord",
    "SizeResult",
]

SCHEMA_VERSION = 1
T = TypeVar("T")


def _field(data: Mapping[str, Any], path: str, name: str) -> tuple[Any, str]:
    where = f"{path}.{name}" if path else name
    if name not in data:
        raise ValueError(f'"{where}" is missing')
    return data[name], where


def _int(data: Mapping[str, Any], path: str, name: str, minimum: int = 0) -> int:
    value, where = _field(data, path, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f'"{where}" must be an integer >= {minimum}, found {value!r}')
    return value


def _num(data: Mapping[str, Any], path: str, name: str, optional: bool = False) -> float | None:
    value, where = _field(data, path, name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        kind = "a finite number or null" if optional else "a finite number"
        raise ValueError(f'"{where}" must be {kind}, found {value!r}')
    return float(value)


def _str(
    data: Mapping[str, Any],
    path: str,
    name: str,
    optional: bool = False,
    choices: tuple[str, ...] = (),
) -> str | None:
    value, where = _field(data, path, name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (choices and value not in choices):
        kind = f"one of {list(choices)}" if choices else "a string"
        raise ValueError(
            f'"{where}" must be {kind}{" or null" if optional else ""}, found {value!r}'
        )
    return value


def _bool(data: Mapping[str, Any], path: str, name: str) -> bool:
    value, where = _field(data, path, name)
    if not isinstance(value, bool):
        raise ValueError(f'"{where}" must be true or false, found {value!r}')
    return value


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f'"{where}" must be an object, found {type(value).__name__}')
    return value


def _list(
    data: Mapping[str, Any], path: str, name: str, item: Callable[[Any, str], T]
) -> tuple[T, ...]:
    value, where = _field(data, path, name)
    if not isinstance(value, list):
        raise ValueError(f'"{where}" must be a list, found {type(value).__name__}')
    return tuple(item(entry, f"{where}[{i}]") for i, entry in enumerate(value))


@dataclass(frozen=True)
class FirstMismatch:
    """The first wrong element seen: which repeat, call and rank, where, and its values."""

    repeat: int
    call: int
    rank: int
    index: int
    expected: float
    seen: float

    @classmethod
    def from_dict(cls, value: Any, where: str) -> FirstMismatch:
        data = _obj(value, where)
        return cls(
            repeat=_int(data, where, "repeat"),
            call=_int(data, where, "call"),
            rank=_int(data, where, "rank"),
            index=_int(data, where, "index"),
            expected=_num(data, where, "expected") or 0.0,
            seen=_num(data, where, "seen") or 0.0,
        )


@dataclass(frozen=True)
class SizeResult:
    """One size's outcome over every repeat and TP group."""

    tokens: int
    kernel: str
    affected: bool
    calls: int
    mismatches: int
    wrong_elements: int
    first_mismatch: FirstMismatch | None
    latency_us: float | None
    rate_upper_99: float | None

    @classmethod
    def from_dict(cls, value: Any, where: str) -> SizeResult:
        data = _obj(value, where)
        first, first_where = _field(data, where, "first_mismatch")
        return cls(
            tokens=_int(data, where, "tokens", 1),
            kernel=_str(data, where, "kernel") or "",
            affected=_bool(data, where, "affected"),
            calls=_int(data, where, "calls"),
            mismatches=_int(data, where, "mismatches"),
            wrong_elements=_int(data, where, "wrong_elements"),
            first_mismatch=None if first is None else FirstMismatch.from_dict(first, first_where),
            latency_us=_num(data, where, "latency_us", optional=True),
            rate_upper_99=_num(data, where, "rate_upper_99", optional=True),
        )


@dataclass(frozen=True)
class PowerRecord:
    """The budget as power: a per-call rate >= ``detect_rate`` is caught with ``probability``."""

    detect_rate: float
    confidence: float
    affected_calls: int
    probability: float
    estimated_seconds: float
    latency_source: str

    @classmethod
    def from_dict(cls, value: Any, where: str) -> PowerRecord:
        data = _obj(value, where)
        rate = _num(data, where, "detect_rate") or 0.0
        if not 0.0 < rate < 1.0:
            raise ValueError(f'"{where}.detect_rate" must be in (0, 1), found {rate!r}')
        return cls(
            detect_rate=rate,
            confidence=_num(data, where, "confidence") or 0.0,
            affected_calls=_int(data, where, "affected_calls"),
            probability=_num(data, where, "probability") or 0.0,
            estimated_seconds=_num(data, where, "estimated_seconds") or 0.0,
            latency_source=_str(data, where, "latency_source") or "",
        )


@dataclass(frozen=True)
class ControlResult:
    """The broken control build's run: its calls, those caught wrong, the first fingerprint."""

    implementation: str
    calls: int
    mismatched_calls: int
    caught: bool
    fingerprint: str | None

    @classmethod
    def from_dict(cls, value: Any, where: str) -> ControlResult:
        data = _obj(value, where)
        result = cls(
            implementation=_str(data, where, "implementation", choices=IMPLEMENTATIONS) or "",
            calls=_int(data, where, "calls"),
            mismatched_calls=_int(data, where, "mismatched_calls"),
            caught=_bool(data, where, "caught"),
            fingerprint=_str(data, where, "fingerprint", optional=True),
        )
        if result.caught != (result.mismatched_calls > 0) or result.mismatched_calls > result.calls:
            raise ValueError(
                f'"{where}": caught={result.caught} contradicts '
                f"{result.mismatched_calls} mismatched of {result.calls} calls"
            )
        return result


def _plan_entry(value: Any, where: str) -> dict[str, Any]:
    data = _obj(value, where)
    return {
        "tokens": _int(data, where, "tokens", 1),
        "bytes": _int(data, where, "bytes", 1),
        "kernel": _str(data, where, "kernel"),
        "naive": _bool(data, where, "naive"),
        "uniform_trip_count": _bool(data, where, "uniform_trip_count"),
        "affected": _bool(data, where, "affected"),
        "blocks": _int(data, where, "blocks"),
        "role": _str(data, where, "role", choices=("decode", "prefill", "control")),
        "calls": _int(data, where, "calls"),
        "implementation": _str(data, where, "implementation", choices=IMPLEMENTATIONS),
    }


def _shape(value: Any, where: str) -> dict[str, Any]:
    data = _obj(value, where)
    return {
        "hidden": _int(data, where, "hidden", 1),
        "dtype": _str(data, where, "dtype"),
        "tp": _int(data, where, "tp", 1),
        "engines": _int(data, where, "engines", 1),
        "requests_per_engine": _int(data, where, "requests_per_engine", 1),
        "chunked_prefill_size": _int(data, where, "chunked_prefill_size", 1),
    }


@dataclass(frozen=True)
class CanaryRecord:
    """``canary.json`` (module doc)."""

    schema_version: int
    implementation: str
    reducer: str | None
    variant: str | None
    aiter_version: str | None
    aiter_commit: str | None
    dispatch_source: str
    shape: dict[str, Any]
    plan: tuple[dict[str, Any], ...]
    results: tuple[SizeResult, ...]
    power: PowerRecord
    repeats: int
    repeats_with_mismatch: int
    start_time: float
    end_time: float
    world_size: int
    groups: int
    backend: str
    device: str
    tensor_dtype: str
    control: ControlResult | None = None

    @property
    def mismatches(self) -> int:
        """Calls with a wrong result, over every size."""
        return sum(r.mismatches for r in self.results)

    @property
    def clean(self) -> bool:
        return self.mismatches == 0

    def first_bad(self) -> SizeResult | None:
        """The smallest size that had a mismatch; None when clean."""
        return next((r for r in self.results if r.mismatches), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plan"] = [dict(entry) for entry in self.plan]
        data["results"] = [asdict(r) for r in self.results]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> CanaryRecord:
        """Parse ``canary.json``'s text; ``ValueError`` for bad JSON or a bad field."""
        data = strict_json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CanaryRecord:
        version = _int(data, "", "schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f'"schema_version" must be {SCHEMA_VERSION}, found {version}')
        repeats = _int(data, "", "repeats", 1)
        with_mismatch = _int(data, "", "repeats_with_mismatch")
        if with_mismatch > repeats:
            raise ValueError(f'"repeats_with_mismatch" {with_mismatch} exceeds "repeats" {repeats}')
        return cls(
            schema_version=version,
            implementation=_str(data, "", "implementation", choices=IMPLEMENTATIONS) or "",
            reducer=_str(data, "", "reducer", optional=True),
            variant=_str(data, "", "variant", optional=True, choices=variants.AITER_VARIANTS),
            aiter_version=_str(data, "", "aiter_version", optional=True),
            aiter_commit=_str(data, "", "aiter_commit", optional=True),
            dispatch_source=_str(data, "", "dispatch_source") or "",
            shape=_shape(_field(data, "", "shape")[0], "shape"),
            plan=_list(data, "", "plan", _plan_entry),
            results=_list(data, "", "results", SizeResult.from_dict),
            power=PowerRecord.from_dict(_field(data, "", "power")[0], "power"),
            repeats=repeats,
            repeats_with_mismatch=with_mismatch,
            start_time=_num(data, "", "start_time") or 0.0,
            end_time=_num(data, "", "end_time") or 0.0,
            world_size=_int(data, "", "world_size", 1),
            groups=_int(data, "", "groups", 1),
            backend=_str(data, "", "backend") or "",
            device=_str(data, "", "device") or "",
            tensor_dtype=_str(data, "", "tensor_dtype") or "",
            control=None
            if data.get("control") is None
            else ControlResult.from_dict(data["control"], "control"),
        )

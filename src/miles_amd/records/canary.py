"""``canary.json``: what a canary run tested, with what power, and what it found.

Decides the record's model (:class:`CanaryRecord`, frozen) and its JSON: :meth:`to_json`
writes it, :meth:`CanaryRecord.from_json` reads it strictly (``miles_amd.strict_json``: no
duplicate key, no non-finite number): every field is required unless marked optional, a wrong
type or value raises ``ValueError`` naming the field's path; keys the model does not know are
ignored. JSON Schema: ``canary/canary.schema.json``; ``miles_amd.evidence`` reads it into
``RunEvidence.canary``.

Beyond types the fields must agree with each other (:meth:`CanaryRecord.from_dict`, each
refusal names its reason): calls were made, at least one exposed size ran, no size has more
mismatches than calls, wrong elements or kept mismatches only with a mismatch count (and the
other way round), arms and blocks that add up, a fingerprint that follows the kept
mismatches, power bought (``power.exposed_calls`` > 0, its probability recomputed), and a
``control`` whose ``caught`` follows its mismatched calls. A record that buys no power is
not evidence.

Fields (``schema_version`` 2): docs/node.md ("What canary.json holds").
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
    "ArmResult",
    "CanaryRecord",
    "ControlRecord",
    "Mismatch",
    "PowerRecord",
    "SizeResult",
]

SCHEMA_VERSION = 2
STALE_READ = "stale-read"
FINGERPRINTS = (STALE_READ, "other")
WAVE_CLASSES = ("exposed", "early-no-read", "waves-agree", "uniform", "not-2stage")
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


def _opt_int(data: Mapping[str, Any], path: str, name: str) -> int | None:
    value, _ = _field(data, path, name)
    return None if value is None else _int(data, path, name)


@dataclass(frozen=True)
class Mismatch:
    """One wrong element kept (or a call whose result had another shape or dtype: ``returned``
    says what came back, and ``index``/``expected``/``seen`` are null); ``matches``: it fits
    the fingerprint of ROCm/aiter#5694's stale read (``canary.fingerprint``)."""

    repeat: int
    call: int
    arm: str
    rank: int
    index: int | None
    expected: float | None
    seen: float | None
    returned: str | None
    matches: bool

    @classmethod
    def from_dict(cls, value: Any, where: str) -> Mismatch:
        data = _obj(value, where)
        index = _opt_int(data, where, "index")
        expected = _num(data, where, "expected", optional=True)
        seen = _num(data, where, "seen", optional=True)
        returned = _str(data, where, "returned", optional=True)
        if (returned is None) != (None not in (index, expected, seen)):
            raise ValueError(
                f'"{where}": either "returned" or all of "index", "expected", "seen" is set'
            )
        return cls(
            repeat=_int(data, where, "repeat"),
            call=_int(data, where, "call"),
            arm=_str(data, where, "arm") or "",
            rank=_int(data, where, "rank"),
            index=index,
            expected=expected,
            seen=seen,
            returned=returned,
            matches=_bool(data, where, "matches"),
        )


@dataclass(frozen=True)
class ArmResult:
    """One rollout condition's share of a size: calls, calls wrong, blocks and blocks with one."""

    arm: str
    calls: int
    mismatches: int
    blocks: int
    blocks_with_mismatch: int

    @classmethod
    def from_dict(cls, value: Any, where: str) -> ArmResult:
        data = _obj(value, where)
        return cls(
            arm=_str(data, where, "arm") or "",
            calls=_int(data, where, "calls"),
            mismatches=_int(data, where, "mismatches"),
            blocks=_int(data, where, "blocks"),
            blocks_with_mismatch=_int(data, where, "blocks_with_mismatch"),
        )


@dataclass(frozen=True)
class SizeResult:
    """One size's outcome over every arm, repeat and TP group."""

    tokens: int
    kernel: str
    affected: bool
    wave_class: str
    exposed: bool
    calls: int
    mismatches: int
    wrong_elements: int
    blocks: int
    blocks_with_mismatch: int
    arms: tuple[ArmResult, ...]
    mismatches_kept: tuple[Mismatch, ...]
    fingerprint: str | None
    latency_us: float | None
    cost_us: float | None
    rate_upper_99: float | None
    block_rate_upper_99: float | None

    @property
    def first_mismatch(self) -> Mismatch | None:
        return self.mismatches_kept[0] if self.mismatches_kept else None

    @classmethod
    def from_dict(cls, value: Any, where: str) -> SizeResult:
        data = _obj(value, where)
        result = cls(
            tokens=_int(data, where, "tokens", 1),
            kernel=_str(data, where, "kernel") or "",
            affected=_bool(data, where, "affected"),
            wave_class=_str(data, where, "wave_class", choices=WAVE_CLASSES) or "",
            exposed=_bool(data, where, "exposed"),
            calls=_int(data, where, "calls"),
            mismatches=_int(data, where, "mismatches"),
            wrong_elements=_int(data, where, "wrong_elements"),
            blocks=_int(data, where, "blocks"),
            blocks_with_mismatch=_int(data, where, "blocks_with_mismatch"),
            arms=_list(data, where, "arms", ArmResult.from_dict),
            mismatches_kept=_list(data, where, "mismatches_kept", Mismatch.from_dict),
            fingerprint=_str(data, where, "fingerprint", optional=True, choices=FINGERPRINTS),
            latency_us=_num(data, where, "latency_us", optional=True),
            cost_us=_num(data, where, "cost_us", optional=True),
            rate_upper_99=_num(data, where, "rate_upper_99", optional=True),
            block_rate_upper_99=_num(data, where, "block_rate_upper_99", optional=True),
        )
        problem = result.contradiction()
        if problem:
            raise ValueError(f'"{where}": {problem}')
        return result

    def contradiction(self) -> str | None:
        """Why this size's fields disagree with each other; None when they agree."""
        if self.exposed != (self.wave_class == "exposed"):
            return f'"exposed" {self.exposed} disagrees with "wave_class" {self.wave_class}'
        if self.mismatches > self.calls:
            return f"{self.mismatches} mismatches exceed its {self.calls} calls"
        if (self.wrong_elements > 0) != (self.mismatches > 0):
            return (
                f"{self.wrong_elements} wrong elements recorded with {self.mismatches} "
                "mismatched calls: a wrong call has wrong elements and only a wrong call has"
            )
        if bool(self.mismatches_kept) != (self.mismatches > 0):
            return (
                f"{len(self.mismatches_kept)} mismatches kept with {self.mismatches} mismatched "
                "calls"
            )
        if self.blocks_with_mismatch > self.blocks or (self.blocks_with_mismatch > 0) != (
            self.mismatches > 0
        ):
            return (
                f"{self.blocks_with_mismatch} blocks with a mismatch of {self.blocks} blocks "
                f"disagree with {self.mismatches} mismatched calls"
            )
        if self.calls and not self.blocks:
            return f"{self.calls} calls in no block"
        sums = (
            sum(a.calls for a in self.arms),
            sum(a.mismatches for a in self.arms),
            sum(a.blocks for a in self.arms),
            sum(a.blocks_with_mismatch for a in self.arms),
        )
        if sums != (self.calls, self.mismatches, self.blocks, self.blocks_with_mismatch):
            return "its arms do not add up to its calls, mismatches and blocks"
        if any(a.mismatches > a.calls or a.blocks_with_mismatch > a.blocks for a in self.arms):
            return "an arm has more mismatches than calls or blocks with one than blocks"
        want = (
            None
            if not self.mismatches_kept
            else STALE_READ
            if all(m.matches for m in self.mismatches_kept)
            else "other"
        )
        if self.fingerprint != want:
            return f'"fingerprint" {self.fingerprint} disagrees with its kept mismatches ({want})'
        return None


@dataclass(frozen=True)
class PowerRecord:
    """The budget as power: a per-call rate >= ``detect_rate`` at the exposed sizes is caught
    with ``probability``; ``rate_source`` says where the rate comes from."""

    detect_rate: float
    rate_source: str
    confidence: float
    exposed_calls: int
    probability: float
    estimated_seconds: float
    latency_source: str

    @classmethod
    def from_dict(cls, value: Any, where: str) -> PowerRecord:
        data = _obj(value, where)
        rate = _num(data, where, "detect_rate") or 0.0
        if not 0.0 < rate < 1.0:
            raise ValueError(f'"{where}.detect_rate" must be in (0, 1), found {rate!r}')
        confidence = _num(data, where, "confidence") or 0.0
        if not 0.0 < confidence < 1.0:
            raise ValueError(f'"{where}.confidence" must be in (0, 1), found {confidence!r}')
        record = cls(
            detect_rate=rate,
            rate_source=_str(data, where, "rate_source") or "",
            confidence=confidence,
            exposed_calls=_int(data, where, "exposed_calls"),
            probability=_num(data, where, "probability") or 0.0,
            estimated_seconds=_num(data, where, "estimated_seconds") or 0.0,
            latency_source=_str(data, where, "latency_source") or "",
        )
        if record.exposed_calls == 0:
            raise ValueError(
                f'"{where}.exposed_calls" is 0: a canary that buys no power is not evidence'
            )
        bought = -math.expm1(record.exposed_calls * math.log1p(-rate))
        if abs(bought - record.probability) > 1e-9:
            raise ValueError(
                f'"{where}.probability" {record.probability!r} is not what {record.exposed_calls}'
                f" exposed calls buy at rate {rate:g} ({bought:.6f})"
            )
        return record


@dataclass(frozen=True)
class ControlRecord:
    """The positive control: a deliberately broken all-reduce the canary must catch."""

    implementation: str
    calls: int
    mismatched_calls: int
    caught: bool
    fingerprint: str | None

    @classmethod
    def from_dict(cls, value: Any, where: str) -> ControlRecord:
        data = _obj(value, where)
        record = cls(
            implementation=_str(data, where, "implementation") or "",
            calls=_int(data, where, "calls", 1),
            mismatched_calls=_int(data, where, "mismatched_calls"),
            caught=_bool(data, where, "caught"),
            fingerprint=_str(data, where, "fingerprint", optional=True),
        )
        if record.mismatched_calls > record.calls:
            raise ValueError(
                f'"{where}.mismatched_calls" {record.mismatched_calls} exceeds its '
                f"{record.calls} calls"
            )
        if record.caught != (record.mismatched_calls > 0):
            raise ValueError(
                f'"{where}.caught" {record.caught} disagrees with {record.mismatched_calls} '
                "mismatched calls"
            )
        return record


def _plan_entry(value: Any, where: str) -> dict[str, Any]:
    data = _obj(value, where)
    return {
        "tokens": _int(data, where, "tokens", 1),
        "bytes": _int(data, where, "bytes", 1),
        "kernel": _str(data, where, "kernel"),
        "naive": _bool(data, where, "naive"),
        "uniform_trip_count": _bool(data, where, "uniform_trip_count"),
        "affected": _bool(data, where, "affected"),
        "wave_class": _str(data, where, "wave_class", choices=WAVE_CLASSES),
        "exposed": _bool(data, where, "exposed"),
        "blocks": _int(data, where, "blocks"),
        "role": _str(data, where, "role", choices=("decode", "prefill", "control")),
        "calls": _int(data, where, "calls"),
        "arms": _arms(_field(data, where, "arms")[0], f"{where}.arms"),
        "implementation": _str(data, where, "implementation", choices=IMPLEMENTATIONS),
    }


def _arms(value: Any, where: str) -> dict[str, int]:
    data = _obj(value, where)
    return {str(arm): _int(data, where, str(arm)) for arm in data}


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
    wave_size: int
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
    control: ControlRecord | None

    @property
    def mismatches(self) -> int:
        """Calls with a wrong result, over every size."""
        return sum(r.mismatches for r in self.results)

    @property
    def clean(self) -> bool:
        return self.mismatches == 0

    @property
    def matches_stale_read(self) -> bool:
        """Every size with a mismatch has the stale-read fingerprint (none: False)."""
        bad = [r for r in self.results if r.mismatches]
        return bool(bad) and all(r.fingerprint == STALE_READ for r in bad)

    def first_bad(self) -> SizeResult | None:
        """The smallest size that had a mismatch; None when clean."""
        return next((r for r in self.results if r.mismatches), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plan"] = [dict(entry) for entry in self.plan]
        data["results"] = [asdict(r) for r in self.results]
        for result in data["results"]:
            result["arms"] = list(result["arms"])
            result["mismatches_kept"] = list(result["mismatches_kept"])
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
        control, control_where = _field(data, "", "control")
        record = cls(
            schema_version=version,
            implementation=_str(data, "", "implementation", choices=IMPLEMENTATIONS) or "",
            reducer=_str(data, "", "reducer", optional=True),
            variant=_str(data, "", "variant", optional=True, choices=variants.AITER_VARIANTS),
            aiter_version=_str(data, "", "aiter_version", optional=True),
            aiter_commit=_str(data, "", "aiter_commit", optional=True),
            dispatch_source=_str(data, "", "dispatch_source") or "",
            shape=_shape(_field(data, "", "shape")[0], "shape"),
            wave_size=_int(data, "", "wave_size", 1),
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
            control=None if control is None else ControlRecord.from_dict(control, control_where),
        )
        problem = record.contradiction()
        if problem:
            raise ValueError(problem)
        return record

    def contradiction(self) -> str | None:
        """Why the record as a whole is not evidence; None when its fields agree."""
        if not any(r.calls for r in self.results):
            return '"results": no calls were made; a canary without calls is not evidence'
        if not any(r.exposed and r.calls for r in self.results):
            return (
                '"results": no size of the suspect class (wave_class "exposed") was run; '
                "such a canary cannot see ROCm/aiter#5694's race"
            )
        exposed = sum(r.calls for r in self.results if r.exposed)
        if self.power.exposed_calls > exposed:
            return (
                f'"power.exposed_calls" {self.power.exposed_calls} exceeds the {exposed} calls '
                "the exposed sizes made"
            )
        if (self.repeats_with_mismatch > 0) != (self.mismatches > 0):
            return (
                f'"repeats_with_mismatch" {self.repeats_with_mismatch} disagrees with '
                f"{self.mismatches} mismatched calls"
            )
        return None

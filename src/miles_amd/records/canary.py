"""``canary.json``: what a canary run tested, with what power, and what it found. Frozen
dataclasses read strictly by ``records.model`` (the shipped schema is generated from them); each
class's ``_check`` refuses fields that disagree, since a record that buys no power, or whose
counts contradict each other, is not evidence. Fields: docs/node.md ("What canary.json holds").
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Lt
from typing_extensions import TypedDict  # pydantic reads its fields on Python < 3.12

from miles_amd.records.job import json_object
from miles_amd.records.model import CONFIG, As, checked, parse
from miles_amd.variants import AiterVariant, Implementation

SCHEMA_VERSION = 2
STALE_READ = "stale-read"
WaveClass = Literal["exposed", "early-no-read", "waves-agree", "uniform", "not-2stage"]
Count = Annotated[int, Ge(0)]
Positive = Annotated[int, Ge(1)]
Rate = Annotated[float, Gt(0), Lt(1)]
_COUNTS = ("calls", "mismatches", "blocks", "blocks_with_mismatch")


def _first(*rules: tuple[bool, str]) -> str | None:
    return next((why for broken, why in rules if broken), None)


@dataclass(frozen=True)
class Mismatch:
    """One wrong element kept, or a call that returned another shape or dtype (``returned``);
    ``matches``: it fits ROCm/aiter#5694's stale-read fingerprint."""

    repeat: Count
    call: Count
    arm: str
    rank: Count
    index: Count | None
    expected: float | None
    seen: float | None
    returned: str | None
    matches: bool

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    def _check(self) -> str | None:
        if (self.returned is None) != (None not in (self.index, self.expected, self.seen)):
            return 'either "returned" or all of "index", "expected", "seen" is set'
        return None


def fingerprint_of(kept: tuple[Mismatch, ...]) -> str | None:
    """None without a kept mismatch, stale-read when all match, else other."""
    return None if not kept else STALE_READ if all(m.matches for m in kept) else "other"


@dataclass(frozen=True)
class ArmResult:
    """One rollout condition's share of a size."""

    arm: str
    calls: Count
    mismatches: Count
    blocks: Count
    blocks_with_mismatch: Count

    __pydantic_config__ = CONFIG


@dataclass(frozen=True)
class SizeResult:
    """One size's outcome over every arm, repeat and TP group."""

    tokens: Positive
    kernel: str
    affected: bool
    wave_class: Annotated[str, As(WaveClass)]
    exposed: bool
    calls: Count
    mismatches: Count
    """Calls wrong on at least one rank."""
    wrong_elements: Count
    blocks: Count
    blocks_with_mismatch: Count
    arms: tuple[ArmResult, ...]
    mismatches_kept: tuple[Mismatch, ...]
    """The first wrong elements (at most 16 per size), earliest first."""
    fingerprint: Annotated[str, As(Literal["stale-read", "other"])] | None
    latency_us: float | None
    """The calls alone (block-timed), us per call."""
    cost_us: float | None
    """Whole blocks (inputs, calls, check), us per call."""
    rate_upper_99: float | None
    block_rate_upper_99: float | None

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    @property
    def first_mismatch(self) -> Mismatch | None:
        return self.mismatches_kept[0] if self.mismatches_kept else None

    def _check(self) -> str | None:
        bad, arms, hits = self.mismatches, self.arms, self.blocks_with_mismatch
        counts = (self.calls, bad, self.blocks, hits)
        want = fingerprint_of(self.mismatches_kept)
        return _first(
            (self.exposed != (self.wave_class == "exposed"), f'"exposed" {self.exposed} '
             f'disagrees with "wave_class" {self.wave_class}'),
            (bad > self.calls, f"{bad} mismatches exceed its {self.calls} calls"),
            ((self.wrong_elements > 0) != (bad > 0),
             f"{self.wrong_elements} wrong elements recorded with {bad} mismatched calls"),
            (bool(self.mismatches_kept) != (bad > 0),
             f"{len(self.mismatches_kept)} mismatches kept with {bad} mismatched calls"),
            (hits > self.blocks or (hits > 0) != (bad > 0), f"{hits} blocks with a mismatch of "
             f"{self.blocks} blocks disagree with {bad} mismatched calls"),
            (self.calls > 0 and not self.blocks, f"{self.calls} calls in no block"),
            (counts != tuple(sum(getattr(a, k) for a in arms) for k in _COUNTS),
             "its arms do not add up to its calls, mismatches and blocks"),
            (any(a.mismatches > a.calls or a.blocks_with_mismatch > a.blocks for a in arms),
             "an arm has more mismatches than calls or blocks with one than blocks"),
            (self.fingerprint != want,
             f'"fingerprint" {self.fingerprint} disagrees with its kept mismatches ({want})'),
        )  # fmt: skip


@dataclass(frozen=True)
class PowerRecord:
    """A per-call rate >= ``detect_rate`` at the exposed sizes is caught with ``probability``."""

    detect_rate: Rate
    rate_source: str
    confidence: Rate
    exposed_calls: Count
    """Calls at exposed sizes in one repeat."""
    probability: float
    estimated_seconds: float
    latency_source: str

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    def _check(self) -> str | None:
        bought = -math.expm1(self.exposed_calls * math.log1p(-self.detect_rate))
        return _first(
            (self.exposed_calls == 0,
             '"exposed_calls" is 0: a canary that buys no power is not evidence'),
            (abs(bought - self.probability) > 1e-9,
             f'"probability" {self.probability!r} is not what {self.exposed_calls} exposed '
             f"calls buy at rate {self.detect_rate:g} ({bought:.6f})"),
        )  # fmt: skip


@dataclass(frozen=True)
class ControlRecord:
    """The positive control: a deliberately broken all-reduce the canary must catch."""

    implementation: str
    calls: Positive
    mismatched_calls: Count
    caught: bool
    fingerprint: str | None

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    def _check(self) -> str | None:
        bad = self.mismatched_calls
        return _first(
            (bad > self.calls, f'"mismatched_calls" {bad} exceeds its {self.calls} calls'),
            (self.caught != (bad > 0),
             f'"caught" {self.caught} disagrees with {bad} mismatched calls'),
        )  # fmt: skip


class PlanEntry(TypedDict):
    """One size of the canary's plan (``canary.plan``)."""

    tokens: Positive
    bytes: Positive
    kernel: str
    naive: bool
    uniform_trip_count: bool
    affected: bool
    wave_class: WaveClass
    exposed: bool
    blocks: Count
    role: Literal["decode", "prefill", "control"]
    calls: Count
    arms: dict[str, Count]
    implementation: Implementation


class Shape(TypedDict):
    """The recipe's all-reduce shape the plan was built for."""

    hidden: Positive
    dtype: str
    tp: Positive
    engines: Positive
    requests_per_engine: Positive
    chunked_prefill_size: Positive


@dataclass(frozen=True)
class CanaryRecord:
    """``canary.json`` (module doc)."""

    schema_version: Annotated[int, As(Literal[2])]
    implementation: Annotated[str, As(Implementation)]
    reducer: str | None
    """FILE:FUNCTION of the CPU test seam; null otherwise."""
    variant: Annotated[str, As(AiterVariant)] | None
    aiter_version: str | None
    aiter_commit: str | None
    dispatch_source: str
    """Where the dispatch thresholds were read (installed source or the pinned commit)."""
    shape: Annotated[dict[str, Any], As(Shape)]
    wave_size: Positive
    plan: tuple[Annotated[dict[str, Any], As(PlanEntry)], ...]
    results: tuple[SizeResult, ...]
    power: PowerRecord
    repeats: Positive
    repeats_with_mismatch: Count
    start_time: float
    end_time: float
    world_size: Positive
    groups: Positive
    backend: str
    device: str
    tensor_dtype: str
    control: ControlRecord | None
    aiter_fix: str | None = None
    """Whether the ranks' aiter holds ROCm/aiter#5694's fix (miles_amd.aiter_fix)."""

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    @property
    def mismatches(self) -> int:
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
        """The smallest size that had a mismatch."""
        return next((r for r in self.results if r.mismatches), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> CanaryRecord:
        """``ValueError`` for bad JSON or a bad field."""
        return cls.from_dict(json_object(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryRecord:
        return parse(cls, data)

    def _check(self) -> str | None:
        exposed = sum(r.calls for r in self.results if r.exposed)
        rwm, power = self.repeats_with_mismatch, self.power
        return _first(
            (rwm > self.repeats, f'"repeats_with_mismatch" {rwm} exceeds "repeats" {self.repeats}'),
            (not any(r.calls for r in self.results),
             '"results": no calls were made; a canary without calls is not evidence'),
            (not exposed, '"results": no size of the suspect class (wave_class "exposed") was '
             "run; such a canary cannot see ROCm/aiter#5694's race"),
            (power.exposed_calls > exposed, f'"power.exposed_calls" {power.exposed_calls} '
             f"exceeds the {exposed} calls the exposed sizes made"),
            ((rwm > 0) != (self.mismatches > 0),
             f'"repeats_with_mismatch" {rwm} disagrees with {self.mismatches} mismatched calls'),
        )  # fmt: skip

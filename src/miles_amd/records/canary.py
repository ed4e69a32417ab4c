"""``canary.json``: what a canary run tested, with what power, and what it found.

:class:`CanaryRecord`: frozen dataclasses whose hints carry each field's constraints, read
strictly by ``records.model`` (its JSON Schema, ``canary/canary.schema.json``, is generated
from them). Beyond types the fields must agree (each class's ``_check``):
calls made, an exposed size run, counts that add up, a fingerprint following the kept
mismatches, power bought and recomputed, a control whose ``caught`` follows its mismatched
calls. A record that buys no power is not evidence. Fields: docs/node.md ("What canary.json
holds").
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
# the size's class when barriers count waves (canary.kernel.wave_class)
WaveClass = Literal["exposed", "early-no-read", "waves-agree", "uniform", "not-2stage"]
Count = Annotated[int, Ge(0)]
Positive = Annotated[int, Ge(1)]
Rate = Annotated[float, Gt(0), Lt(1)]


@dataclass(frozen=True)
class Mismatch:
    """One wrong element kept (or a call whose result had another shape or dtype: ``returned``
    says what came back, and ``index``/``expected``/``seen`` are null); ``matches``: it fits
    the fingerprint of ROCm/aiter#5694's stale read (``canary.kernel``)."""

    repeat: Count
    call: Count
    arm: str
    rank: Count
    index: Count | None
    expected: float | None
    seen: float | None
    returned: str | None
    """Another shape or dtype returned."""
    matches: bool
    """Fits ROCm/aiter#5694's stale-read fingerprint."""

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    def _check(self) -> str | None:
        if (self.returned is None) != (None not in (self.index, self.expected, self.seen)):
            return 'either "returned" or all of "index", "expected", "seen" is set'
        return None


def fingerprint_of(kept: tuple[Mismatch, ...]) -> str | None:
    """A size's fingerprint: none without a kept mismatch, stale-read when all match."""
    return None if not kept else STALE_READ if all(m.matches for m in kept) else "other"


@dataclass(frozen=True)
class ArmResult:
    """One rollout condition's share of a size: calls, calls wrong, blocks and blocks with one."""

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
    """Blocks of back-to-back calls, summed over groups."""
    blocks_with_mismatch: Count
    arms: tuple[ArmResult, ...]
    mismatches_kept: tuple[Mismatch, ...]
    """The first wrong elements (at most 16 per size), earliest first."""
    fingerprint: Annotated[str, As(Literal["stale-read", "other"])] | None
    latency_us: float | None
    """Seconds per call of the calls alone (block-timed), in us."""
    cost_us: float | None
    """Seconds per call of whole blocks: inputs, calls, check, flags; in us."""
    rate_upper_99: float | None
    block_rate_upper_99: float | None

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    @property
    def first_mismatch(self) -> Mismatch | None:
        return self.mismatches_kept[0] if self.mismatches_kept else None

    def _check(self) -> str | None:
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
        want = fingerprint_of(self.mismatches_kept)
        if self.fingerprint != want:
            return f'"fingerprint" {self.fingerprint} disagrees with its kept mismatches ({want})'
        return None


@dataclass(frozen=True)
class PowerRecord:
    """The budget as power: a per-call rate >= ``detect_rate`` at the exposed sizes is caught
    with ``probability``; ``rate_source`` says where the rate comes from."""

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
        if self.exposed_calls == 0:
            return '"exposed_calls" is 0: a canary that buys no power is not evidence'
        bought = -math.expm1(self.exposed_calls * math.log1p(-self.detect_rate))
        if abs(bought - self.probability) > 1e-9:
            return (
                f'"probability" {self.probability!r} is not what {self.exposed_calls} exposed '
                f"calls buy at rate {self.detect_rate:g} ({bought:.6f})"
            )
        return None


@dataclass(frozen=True)
class ControlRecord:
    """The positive control: a deliberately broken all-reduce the canary must catch; null when
    none ran."""

    implementation: str
    calls: Positive
    mismatched_calls: Count
    caught: bool
    fingerprint: str | None

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

    def _check(self) -> str | None:
        if self.mismatched_calls > self.calls:
            return f'"mismatched_calls" {self.mismatched_calls} exceeds its {self.calls} calls'
        if self.caught != (self.mismatched_calls > 0):
            return f'"caught" {self.caught} disagrees with {self.mismatched_calls} mismatched calls'
        return None


class PlanEntry(TypedDict):
    """One size of the canary's plan, as ``canary.plan`` wrote it: ``exposed`` when a stale
    read is possible (``wave_class`` exposed), ``arms`` the calls per rollout condition."""

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
    """The all-reduce tested (miles_amd.variants.IMPLEMENTATIONS)."""
    reducer: str | None
    """FILE:FUNCTION of the CPU test seam; null otherwise."""
    variant: Annotated[str, As(AiterVariant)] | None
    """The aiter variant the run is for; null on CPU."""
    aiter_version: str | None
    aiter_commit: str | None
    dispatch_source: str
    """Where the dispatch thresholds were read (installed source or the pinned commit)."""
    shape: Annotated[dict[str, Any], As(Shape)]
    wave_size: Positive
    """Lanes a barrier counts as one wave (64 on CDNA)."""
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
    """Whether the aiter the ranks import holds ROCm/aiter#5694's fix (miles_amd.aiter_fix):
    fixed, not fixed or unknown, with its header."""

    __get_pydantic_core_schema__ = checked
    __pydantic_config__ = CONFIG

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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> CanaryRecord:
        """Parse ``canary.json``'s text; ``ValueError`` for bad JSON or a bad field."""
        return cls.from_dict(json_object(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryRecord:
        return parse(cls, data)

    def _check(self) -> str | None:
        """Why the record as a whole is not evidence; None when its fields agree."""
        if self.repeats_with_mismatch > self.repeats:
            return (
                f'"repeats_with_mismatch" {self.repeats_with_mismatch} exceeds "repeats" '
                f"{self.repeats}"
            )
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

"""``env.json``: what ``miles-amd preflight`` found on the node, read into one record whose
``problems`` say what makes it unbelievable (a malformed or repeated fact, an ``ok`` or
``aiter_variant`` that disagrees with the facts, a failed fact); whether one fails a check is
``judge.environment``'s. Fields: ``docs/node.md`` ("What env.json records").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from miles_amd.variants import AITER_VARIANTS

FactStatus = Literal["ok", "missing", "wrong"]
_STATUSES: tuple[FactStatus, ...] = ("ok", "missing", "wrong")
_COMMIT = re.compile(r"^([0-9a-f]{7,64})(?:\s|$)")
_GPUS = re.compile(r"^\s*(\d+)x\s+([A-Za-z0-9_,]+)")
_MAJOR_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")


@dataclass(frozen=True)
class Fact:
    """One preflight fact, as a probe reports it and env.json records it: ``missing`` when a
    thing is not there at all, ``wrong`` when it is there but not what the recipe needs;
    ``message`` says what to do when ``status`` is not ``ok``."""

    name: str
    status: FactStatus
    value: str
    message: str = ""


@dataclass(frozen=True)
class EnvRecord:
    """env.json, read; see the module doc and ``docs/node.md`` ("What env.json records")."""

    facts: Mapping[str, Fact] = field(default_factory=dict)
    ok: bool = False  # env.json's own "ok", True only when it says true and nothing contradicts
    aiter_variant: str | None = None
    written_at: str | None = None  # when the preflight wrote it (UTC, ISO 8601)
    problems: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> EnvRecord:
        """The record of env.json's object; never raises: what is wrong is a problem."""
        facts, problems = _facts(data.get("facts"))
        variant = data.get("aiter_variant")
        fact = facts.get("aiter_variant")
        if variant is not None and (not isinstance(variant, str) or variant not in AITER_VARIANTS):
            problems.append(
                f'"aiter_variant" is {variant!r}, not one of {", ".join(AITER_VARIANTS)}'
            )
            variant = None
        elif variant is not None and fact is not None and fact.value != variant:
            problems.append(
                f'"aiter_variant" is {variant!r} but the aiter_variant fact says {fact.value!r}'
            )
        all_ok = bool(facts) and all(f.status == "ok" for f in facts.values())
        recorded_ok = data.get("ok")
        if not problems and recorded_ok is not all_ok:
            problems.append(f'"ok" is {recorded_ok!r} but the facts say {all_ok}')
        return cls(
            facts=facts,
            ok=recorded_ok is True and all_ok,
            aiter_variant=variant,
            written_at=written if isinstance(written := data.get("written_at"), str) else None,
            problems=tuple(problems),
        )

    def value(self, name: str) -> str:
        """The value of fact ``name``; "" when env.json has no such fact."""
        fact = self.facts.get(name)
        return fact.value if fact is not None else ""

    @property
    def failed(self) -> list[Fact]:
        """The facts whose status is not ``ok``."""
        return [fact for fact in self.facts.values() if fact.status != "ok"]

    @property
    def aiter_version(self) -> str | None:
        fact = self.facts.get("aiter")
        return fact.value if fact is not None and fact.status == "ok" and fact.value else None

    @property
    def aiter_commit(self) -> str | None:
        commit = _COMMIT.match(self.value("aiter_commit"))
        return commit.group(1) if commit else None

    @property
    def gpu_arch(self) -> str | None:
        gpus = _GPUS.match(self.value("gpus"))
        return gpus.group(2).lower() if gpus else None

    @property
    def gpu_count(self) -> int | None:
        gpus = _GPUS.match(self.value("gpus"))
        return int(gpus.group(1)) if gpus else None

    @property
    def rocm(self) -> str | None:
        version = _MAJOR_MINOR.match(self.value("rocm"))
        return f"{version.group(1)}.{version.group(2)}" if version else None


def _facts(raw: object) -> tuple[dict[str, Fact], list[str]]:
    if not isinstance(raw, list):
        return {}, ['"facts" is not a list of the preflight\'s facts']
    facts: dict[str, Fact] = {}
    problems: list[str] = []
    for index, fact in enumerate(raw):
        if not (
            isinstance(fact, Mapping)
            and isinstance(fact.get("name"), str)
            and fact.get("status") in _STATUSES
            and isinstance(fact.get("value"), str)
        ):
            problems.append(f"facts[{index}] is not a fact (name, status ok|missing|wrong, value)")
            continue
        name = str(fact["name"])
        if name in facts:
            problems.append(f"fact {name!r} recorded twice (contradictory)")
            continue
        message = fact.get("message")
        message = message if isinstance(message, str) else ""
        status: FactStatus = fact["status"]
        facts[name] = Fact(name, status, str(fact["value"]), message)
        if fact["status"] != "ok":
            problems.append(f"fact {name!r} is {fact['status']}: {message or 'no message'}")
    return facts, problems

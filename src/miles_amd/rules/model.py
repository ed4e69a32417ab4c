"""The stored shape of a baseline: :class:`Baseline`, :class:`RunShape`, :class:`Rule`, both ways.

The loader and ``baseline record`` share it, so ``Baseline.from_json(b.to_json(), path) ==
b``. It validates nothing and knows no kind: a rule's own fields stay their JSON values
(:attr:`Rule.params`), typed by its kind's :class:`Params`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

SCHEMA_VERSION = 1

# The name of a rule kind, as written in a rule's ``kind`` (a module of miles_amd.rules.kinds).
KindName = str

# The fields every rule has, in the order a file writes them (params go between the two).
_HEAD = ("id", "kind", "metric", "required")
_TAIL = ("rationale", "derivation")
# A spending rule's bound at each look (``miles_amd.rules.looks``): among a rule's params in
# the file, but no kind's own field (its check reads the bound from ``RuleContext.limit``).
BOUNDARIES = "boundaries"

P = TypeVar("P", bound="Params")


@dataclass(frozen=True)
class Rule:
    """One acceptance rule: the fields every rule has, plus its kind's own ``params``."""

    id: str
    kind: KindName
    metric: str | None
    required: bool
    rationale: str
    derivation: str
    # The kind's fields as written in the file (a band is {"low", "high"}), in file order.
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Rule:
        params = {k: v for k, v in entry.items() if k not in _HEAD + _TAIL}
        return cls(
            id=entry["id"],
            kind=entry["kind"],
            metric=entry.get("metric"),
            required=entry["required"],
            rationale=entry["rationale"],
            derivation=entry["derivation"],
            params=params,
        )

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": self.id, "kind": self.kind}
        if self.metric is not None:
            entry["metric"] = self.metric
        entry["required"] = self.required
        entry.update(self.params)
        entry["rationale"] = self.rationale
        entry["derivation"] = self.derivation
        return entry


@dataclass(frozen=True)
class Params:
    """Base of a kind's fields (``Params`` of each ``miles_amd.rules.kinds`` module).

    A subclass is a frozen dataclass whose field names are the rule's JSON keys; override
    ``from_json``/``to_json`` only for a field that is not a plain JSON value.
    """

    @classmethod
    def of(cls: type[P], rule: Rule) -> P:
        """``rule``'s params typed (the loader checked they are this kind's), without the
        look boundaries."""
        return cls.from_json({k: v for k, v in rule.params.items() if k != BOUNDARIES})

    @classmethod
    def from_json(cls: type[P], raw: Mapping[str, Any]) -> P:
        return cls(**raw)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The JSON keys of this kind's fields."""
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class NoParams(Params):
    """The params of a kind without any (``steps_complete``, ``finite``)."""


@dataclass(frozen=True)
class RunShape:
    rollouts: int  # default expected rollouts: rollout/step 0..rollouts-1
    train_steps_per_rollout: int
    samples_per_rollout: int
    prompts_per_rollout: int
    max_response_tokens: int
    # the rollouts at which a run may be decided red, the last one ``rollouts``
    # (``miles_amd.rules.looks``)
    looks: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunShape:
        values = {f.name: raw[f.name] for f in fields(cls) if f.name != "looks"}
        return cls(**values, looks=tuple(raw.get("looks", ())))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["looks"] = list(self.looks)
        return out


@dataclass(frozen=True)
class Baseline:
    """A baseline. ``series[m][i]`` is the reference value of ``m`` at rollout ``i``."""

    name: str
    path: str  # where it was read from (not stored in the file)
    description: str
    provenance: Mapping[str, Any]
    run_shape: RunShape
    series: Mapping[str, tuple[float, ...]]
    summaries: Mapping[str, Mapping[str, Any]]
    rules: tuple[Rule, ...]
    schema_ref: str | None = None  # the file's ``$schema``

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], path: str) -> Baseline:
        """Type a baseline document WITHOUT validating it (``parse_baseline`` validates)."""
        evidence = raw["evidence"]
        return cls(
            name=raw["name"],
            path=path,
            description=raw["description"],
            provenance=dict(raw["provenance"]),
            run_shape=RunShape.from_json(raw["run_shape"]),
            series={m: tuple(float(v) for v in vs) for m, vs in evidence["series"].items()},
            summaries={m: dict(s) for m, s in evidence["summaries"].items()},
            rules=tuple(Rule.from_json(entry) for entry in raw["rules"]),
            schema_ref=raw.get("$schema"),
        )

    def to_json(self) -> dict[str, Any]:
        """The document, in the order a file writes it."""
        doc: dict[str, Any] = {} if self.schema_ref is None else {"$schema": self.schema_ref}
        doc.update(
            {
                "schema_version": SCHEMA_VERSION,
                "name": self.name,
                "description": self.description,
                "provenance": dict(self.provenance),
                "run_shape": self.run_shape.to_json(),
                "evidence": {
                    "series": {m: list(vs) for m, vs in self.series.items()},
                    "summaries": {m: dict(s) for m, s in self.summaries.items()},
                },
                "rules": [rule.to_json() for rule in self.rules],
            }
        )
        return doc

    @property
    def run_id(self) -> str:
        return str(self.provenance["run_id"])

    def reference_max(self, metric: str) -> float | None:
        """The reference run's largest value of ``metric``: its series, else its summary's max."""
        if metric in self.series:
            return max(self.series[metric])
        top = self.summaries.get(metric, {}).get("max")
        return None if top is None else float(top)

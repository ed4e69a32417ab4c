"""The rule registry and the baseline schema name the same kinds, with the same fields.

A kind is its entry in ``miles_amd.rules.kinds.KINDS`` plus its entry in
``baseline.schema.json``; these tests fail when either has a kind, or a kind a field, the
other lacks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest

from miles_amd.baseline.model import (
    SCHEMA_PATH,
    BaselineError,
    parse_baseline,
    resolve_baseline_path,
)
from miles_amd.report.plot import HINTS
from miles_amd.rules.model import BOUNDARIES
from miles_amd.rules.registry import KINDS


def schema_kinds(schema: Mapping[str, Any]) -> set[str]:
    return set(schema["$defs"]["rule"]["properties"]["kind"]["enum"])


def schema_fields(schema: Mapping[str, Any], kind: str) -> set[str]:
    """The fields the schema requires of a rule of ``kind`` beyond every rule's own."""
    rule = schema["$defs"]["rule"]
    required: set[str] = set()
    for branch in rule["allOf"]:
        condition = branch["if"]["properties"]["kind"]
        names = condition["enum"] if "enum" in condition else [condition["const"]]
        taken = branch["then"] if kind in names else branch.get("else", {})
        required.update(taken.get("required", ()))
    return required - set(rule["required"]) - {"metric"}


def mismatches(kinds: Mapping[str, tuple[str, ...]], schema: Mapping[str, Any]) -> list[str]:
    """Every disagreement between ``kinds`` (name -> params fields) and the schema."""
    found = [
        f"{k}: in the registry, not in the schema"
        for k in sorted(set(kinds) - schema_kinds(schema))
    ]
    found += [
        f"{k}: in the schema, not in the registry"
        for k in sorted(schema_kinds(schema) - set(kinds))
    ]
    properties = set(schema["$defs"]["rule"]["properties"])
    for name in sorted(set(kinds) & schema_kinds(schema)):
        required = sorted(schema_fields(schema, name))
        if sorted(kinds[name]) != required:
            found.append(f"{name}: fields {sorted(kinds[name])}, schema requires {required}")
        found += [
            f"{name}: field {f} not in the schema's properties"
            for f in kinds[name]
            if f not in properties
        ]
    return found


def registry() -> dict[str, tuple[str, ...]]:
    """Each kind's required fields: its params without a default (an optional field, such as
    ``paired_mean_diff``'s ``side``, has one; the schema lists it but does not require it),
    and a spending kind's ``boundaries`` (its bound at each look: ``miles_amd.rules.looks``)."""
    return {
        name: tuple(
            f.name
            for f in dataclasses.fields(spec.params)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        + ((BOUNDARIES,) if spec.looks == "spending" else ())
        for name, spec in KINDS.items()
    }


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def test_the_registry_and_the_schema_agree_on_kinds_and_their_fields() -> None:
    assert len(KINDS) >= 11
    assert mismatches(registry(), load_schema()) == []
    assert mismatches({**registry(), "my_kind": ("gamma",)}, load_schema()) == [
        "my_kind: in the registry, not in the schema"
    ]
    properties = set(load_schema()["$defs"]["rule"]["properties"])
    optional = {f for spec in KINDS.values() for f in spec.params.names()} - {
        f for fields in registry().values() for f in fields
    }
    assert optional <= properties, optional - properties


def test_every_plot_hint_names_a_kind() -> None:
    assert set(HINTS) <= set(KINDS)


def test_a_field_of_another_kind_is_refused_naming_the_rule_and_field() -> None:
    text = resolve_baseline_path("patched").read_text(encoding="utf-8")
    raw = json.loads(text)
    index = next(i for i, r in enumerate(raw["rules"]) if r["kind"] == "all_below")
    raw["rules"][index]["z"] = 3
    with pytest.raises(
        BaselineError,
        match=rf"\$\.rules\[{index}\]\.z: all_below takes threshold, not z; fix: remove z",
    ):
        parse_baseline(json.dumps(raw), path="edited.json")

"""The rule registry and the baseline schema name the same kinds, with the same fields.

A kind is its entry in ``miles_amd.rules.kinds.KINDS`` plus its entry in
``baseline.schema.json``; these tests fail when either has a kind, or a kind a field, the
other lacks.
"""

from __future__ import annotations

import dataclasses
import json

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


def test_the_registry_and_the_schema_agree_on_kinds_and_their_fields() -> None:
    """Each kind's required fields: its params without a default (an optional one, such as
    ``paired_mean_diff``'s ``side``, the schema lists but does not require), and a spending
    kind's ``boundaries``; the schema's: its ``allOf`` branches beyond every rule's own."""
    rule = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]["rule"]

    def schema_fields(kind: str) -> list[str]:
        required: set[str] = set()
        for branch in rule["allOf"]:
            condition = branch["if"]["properties"]["kind"]
            names = condition["enum"] if "enum" in condition else [condition["const"]]
            required.update(
                (branch["then"] if kind in names else branch.get("else", {})).get("required", ())
            )
        return sorted(required - set(rule["required"]) - {"metric"})

    registry = {
        name: sorted(
            [f.name for f in dataclasses.fields(spec.params) if f.default is dataclasses.MISSING]
            + ([BOUNDARIES] if spec.looks == "spending" else [])
        )
        for name, spec in KINDS.items()
    }
    assert len(KINDS) >= 11
    assert registry == {kind: schema_fields(kind) for kind in rule["properties"]["kind"]["enum"]}
    every = {f for spec in KINDS.values() for f in spec.params.names()}
    assert every <= set(rule["properties"]), every - set(rule["properties"])


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

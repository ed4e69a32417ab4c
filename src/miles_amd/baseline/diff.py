"""Diff two baselines for review (``miles-amd baseline diff``): per rule, its tolerance (the
gate's ``expected`` sentence) and reference before and after, which of kind, required flag,
tolerance and reference changed, rules added or removed, and every name, provenance and
run-shape field. :attr:`BaselineDiff.differs` is the exit code. A baseline under review is
foreign text: escaped for its sink (``miles_amd.escape``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from miles_amd import escape
from miles_amd.rules.model import Baseline, Rule
from miles_amd.rules.registry import KINDS, expected_text
from miles_amd.wrap import fit

Aspect = Literal["kind", "required", "tolerance", "reference"]
RowChange = Literal["same", "changed", "added", "removed"]
_ASPECTS: tuple[Aspect, ...] = ("kind", "required", "tolerance", "reference")
_SHAPE_FIELDS = (
    *("rollouts", "train_steps_per_rollout", "samples_per_rollout", "prompts_per_rollout"),
    "max_response_tokens",
)


@dataclass(frozen=True)
class RuleView:
    """One rule as a reviewer reads it."""

    kind: str
    metric: str | None
    required: bool
    tolerance: str  # the sentence the gate shows as the check's expected value
    reference: str  # the reference data the tolerance is derived from, "-" when none


@dataclass(frozen=True)
class RuleRow:
    rule_id: str
    before: RuleView | None
    after: RuleView | None

    @property
    def view(self) -> RuleView:
        """The rule as it is now (as it was, when removed)."""
        view = self.after or self.before
        assert view is not None
        return view

    @property
    def aspects(self) -> tuple[Aspect, ...]:
        """What changed between before and after (empty for added/removed/same rows)."""
        if self.before is None or self.after is None:
            return ()
        return tuple(a for a in _ASPECTS if getattr(self.before, a) != getattr(self.after, a))

    @property
    def change(self) -> RowChange:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "changed" if self.aspects else "same"


@dataclass(frozen=True)
class FieldRow:
    field: str
    before: str | None  # None: absent on that side
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class BaselineDiff:
    old: str  # "name (path, run id)"
    new: str
    rules: tuple[RuleRow, ...]
    fields: tuple[FieldRow, ...]

    def rows(self, change: RowChange) -> tuple[RuleRow, ...]:
        return tuple(r for r in self.rules if r.change == change)

    @property
    def differs(self) -> bool:
        """Any rule added, removed or changed, or any field (name, provenance, run shape)."""
        return any(r.change != "same" for r in self.rules) or any(f.changed for f in self.fields)


def _view(rule: Rule | None, baseline: Baseline) -> RuleView | None:
    if rule is None:
        return None
    tolerance = expected_text(rule, baseline, baseline.run_shape.rollouts)
    reference = KINDS[rule.kind].reference(rule, baseline)
    return RuleView(rule.kind, rule.metric, rule.required, tolerance, reference)


def _field_values(baseline: Baseline) -> dict[str, str]:
    values = {"name": baseline.name}
    for key, value in baseline.provenance.items():
        if isinstance(value, dict):
            values.update({f"provenance.{key}.{k}": str(v) for k, v in value.items()})
        else:
            values[f"provenance.{key}"] = str(value)
    values.update({f"run_shape.{k}": str(getattr(baseline.run_shape, k)) for k in _SHAPE_FIELDS})
    return values


def diff_baselines(old: Baseline, new: Baseline) -> BaselineDiff:
    """Rule by rule and field by field, ``old`` against ``new`` (old's order, added last)."""
    old_rules = {r.id: r for r in old.rules}
    new_rules = {r.id: r for r in new.rules}
    rows = tuple(
        RuleRow(rule_id, _view(old_rules.get(rule_id), old), _view(new_rules.get(rule_id), new))
        for rule_id in dict.fromkeys([*old_rules, *new_rules])
    )
    old_fields, new_fields = _field_values(old), _field_values(new)
    fields = tuple(
        FieldRow(key, old_fields.get(key), new_fields.get(key))
        for key in dict.fromkeys([*old_fields, *new_fields])
    )
    old_label, new_label = (f"{b.name} ({b.path}, run {b.run_id})" for b in (old, new))
    return BaselineDiff(old_label, new_label, rows, fields)


def _counts(diff: BaselineDiff) -> str:
    tolerance = sum("tolerance" in r.aspects for r in diff.rules)
    return (
        f"{sum(r.before is not None for r in diff.rules)} rules before, "
        f"{sum(r.after is not None for r in diff.rules)} after: {tolerance} tolerance(s) "
        f"changed, {len(diff.rows('changed'))} row(s) changed, {len(diff.rows('added'))} "
        f"added, {len(diff.rows('removed'))} removed"
    )


def _aspect(view: RuleView, aspect: Aspect) -> str:
    if aspect == "required":
        return "required" if view.required else "optional"
    return str(getattr(view, aspect))


def _pair(before: str | None, after: str | None) -> str:
    if before == after:
        return f"{before} (unchanged)"
    return f"{before if before is not None else '(absent)'} -> {after or '(absent)'}"


def render_text(diff: BaselineDiff) -> str:
    """The diff for a terminal: '*' marks a change; an unchanged rule is one line, a changed
    one shows each changed aspect before -> after."""
    lines = [
        f"baseline diff: {diff.old} -> {diff.new}",
        _counts(diff) + " ('*' marks a change)",
        "",
        "rules:",
    ]
    for row in diff.rules:
        view = row.view
        head = f"{row.rule_id} [{view.kind}, {'required' if view.required else 'optional'}]"
        head += f" {view.metric}" if view.metric else ""
        if row.change == "same":
            lines.append(f"  {head}: {view.tolerance} (unchanged)")
            continue
        if row.change in ("added", "removed"):
            lines.append(f"* {head} RULE {row.change.upper()}")
            lines += [f"    tolerance: {view.tolerance}", f"    reference: {view.reference}"]
            continue
        assert row.before is not None and row.after is not None
        lines.append(f"* {head} CHANGED: {', '.join(row.aspects)}")
        for aspect in ("kind", "required"):
            if aspect in row.aspects:
                before, after = _aspect(row.before, aspect), _aspect(row.after, aspect)
                lines.append(f"    {aspect}: {before} -> {after}")
        lines.append(f"    tolerance: {_pair(row.before.tolerance, row.after.tolerance)}")
        lines.append(f"    reference: {_pair(row.before.reference, row.after.reference)}")
    lines += ["", "provenance and run shape:"]
    for field_row in diff.fields:
        mark = "*" if field_row.changed else " "
        lines.append(f"{mark} {field_row.field}: {_pair(field_row.before, field_row.after)}")
    return fit((escape.terminal(line) for line in lines), indent="      ")


def _cell(text: str | None) -> str:
    return "_(absent)_" if text is None else escape.markdown(text)


def render_markdown(diff: BaselineDiff) -> str:
    """The diff as a PR comment: one table of rules, one of provenance and run shape."""
    lines = [
        f"### Baseline diff: {escape.markdown_code(diff.old)} → {escape.markdown_code(diff.new)}",
        "",
        _counts(diff) + ".",
        "",
        "| | rule | metric | change | tolerance before | tolerance after "
        "| reference before | reference after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in diff.rules:
        mark = "" if row.change == "same" else "**\\***"
        before, after = row.before, row.after
        change = {"same": "", "added": "**added**", "removed": "**removed**"}.get(row.change, "")
        if before is not None and after is not None and row.aspects:
            change = "**changed**: " + ", ".join(
                f"{a} ({_aspect(before, a)} → {_aspect(after, a)})"
                if a in ("kind", "required")
                else a
                for a in row.aspects
            )
        lines.append(
            f"| {mark} | {escape.markdown_code(row.rule_id)} "
            f"| {escape.markdown_code(row.view.metric or '-')} | {change} "
            f"| {_cell(before.tolerance if before else None)} "
            f"| {_cell(after.tolerance if after else None)} "
            f"| {_cell(before.reference if before else None)} "
            f"| {_cell(after.reference if after else None)} |"
        )
    lines += ["", "| | field | before | after |", "|---|---|---|---|"]
    for field_row in diff.fields:
        mark = "**\\***" if field_row.changed else ""
        lines.append(
            f"| {mark} | {escape.markdown_code(field_row.field)} | {_cell(field_row.before)} "
            f"| {_cell(field_row.after)} |"
        )
    return "\n".join(lines) + "\n"


def to_json(diff: BaselineDiff) -> dict[str, object]:
    """The diff as data: each rule's change, aspects and views, each field before -> after."""
    return {
        "old": diff.old,
        "new": diff.new,
        "differs": diff.differs,
        "rules": [
            {
                "id": r.rule_id,
                "change": r.change,
                "aspects": list(r.aspects),
                "before": r.before and asdict(r.before),
                "after": r.after and asdict(r.after),
            }
            for r in diff.rules
        ],
        "fields": [
            {"field": f.field, "before": f.before, "after": f.after, "changed": f.changed}
            for f in diff.fields
        ],
    }


def render_diff(diff: BaselineDiff, fmt: str) -> str:
    """``text``, ``markdown`` or ``json``."""
    if fmt == "json":
        return json.dumps(to_json(diff), indent=2) + "\n"
    return render_markdown(diff) if fmt == "markdown" else render_text(diff)

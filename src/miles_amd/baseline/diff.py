"""Diff two baselines for review (``miles-amd baseline diff``): per rule, its tolerance (the
gate's ``expected`` sentence) and reference before and after, which of kind, required flag,
tolerance and reference changed, rules added or removed, and every name, provenance and
run-shape field; :attr:`BaselineDiff.differs` is the exit code. Foreign text is escaped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from miles_amd import escape
from miles_amd.rules.model import Baseline, Rule
from miles_amd.rules.registry import KINDS, expected_text
from miles_amd.wrap import fit

_ASPECTS = ("kind", "required", "tolerance", "reference")
_SHAPE_FIELDS = (
    *("rollouts", "train_steps_per_rollout", "samples_per_rollout", "prompts_per_rollout"),
    "max_response_tokens",
)


@dataclass(frozen=True)
class RuleView:
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
        view = self.after or self.before
        assert view is not None
        return view

    @property
    def aspects(self) -> tuple[str, ...]:
        if self.before is None or self.after is None:
            return ()
        return tuple(a for a in _ASPECTS if getattr(self.before, a) != getattr(self.after, a))

    @property
    def change(self) -> str:
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

    def count(self, change: str) -> int:
        return sum(r.change == change for r in self.rules)

    @property
    def differs(self) -> bool:
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
    old_rules, new_rules = {r.id: r for r in old.rules}, {r.id: r for r in new.rules}
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
        f"changed, {diff.count('changed')} row(s) changed, {diff.count('added')} "
        f"added, {diff.count('removed')} removed"
    )


def _aspect(view: RuleView, aspect: str) -> str:
    if aspect == "required":
        return "required" if view.required else "optional"
    return str(getattr(view, aspect))


def _pair(before: str | None, after: str | None) -> str:
    if before == after:
        return f"{before} (unchanged)"
    return f"{before if before is not None else '(absent)'} -> {after or '(absent)'}"


def render_text(diff: BaselineDiff) -> str:
    """'*' marks a change; an unchanged rule is one line, a changed one each changed aspect."""
    lines = [f"baseline diff: {diff.old} -> {diff.new}", _counts(diff) + " ('*' marks a change)"]
    lines += ["", "rules:"]
    for row in diff.rules:
        view, before, after = row.view, row.before, row.after
        head = f"{row.rule_id} [{view.kind}, {_aspect(view, 'required')}]"
        head += f" {view.metric}" if view.metric else ""
        if before is None or after is None:
            lines.append(f"* {head} RULE {row.change.upper()}")
            lines += [f"    tolerance: {view.tolerance}", f"    reference: {view.reference}"]
        elif not row.aspects:
            lines.append(f"  {head}: {view.tolerance} (unchanged)")
        else:
            lines.append(f"* {head} CHANGED: {', '.join(row.aspects)}")
            lines += [
                f"    {a}: {_aspect(before, a)} -> {_aspect(after, a)}"
                for a in ("kind", "required")
                if a in row.aspects
            ]
            lines += [
                f"    {a}: {_pair(_aspect(before, a), _aspect(after, a))}" for a in _ASPECTS[2:]
            ]
    lines += ["", "provenance and run shape:"]
    for f in diff.fields:
        lines.append(f"{'*' if f.changed else ' '} {f.field}: {_pair(f.before, f.after)}")
    return fit((escape.terminal(line) for line in lines), indent="      ")


def _cell(text: str | None) -> str:
    return "_(absent)_" if text is None else escape.markdown(text)


def render_markdown(diff: BaselineDiff) -> str:
    """The diff as a PR comment: one table of rules, one of provenance and run shape."""
    code = escape.markdown_code
    lines = [
        f"### Baseline diff: {code(diff.old)} → {code(diff.new)}",
        "",
        _counts(diff) + ".",
        "",
        "| | rule | metric | change | tolerance before | tolerance after "
        "| reference before | reference after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in diff.rules:
        before, after = row.before, row.after
        change = "" if row.change in ("same", "changed") else f"**{row.change}**"
        if before is not None and after is not None and row.aspects:
            change = "**changed**: " + ", ".join(
                f"{a} ({_aspect(before, a)} → {_aspect(after, a)})" if a in _ASPECTS[:2] else a
                for a in row.aspects
            )
        cells = [getattr(v, a) if v else None for a in _ASPECTS[2:] for v in (before, after)]
        mark = "" if row.change == "same" else "**\\***"
        lines.append(
            f"| {mark} | {code(row.rule_id)} "
            f"| {code(row.view.metric or '-')} | {change} | "
            + " | ".join(_cell(c) for c in cells)
            + " |"
        )
    lines += ["", "| | field | before | after |", "|---|---|---|---|"]
    for f in diff.fields:
        mark = "**\\***" if f.changed else ""
        lines.append(f"| {mark} | {code(f.field)} | {_cell(f.before)} | {_cell(f.after)} |")
    return "\n".join(lines) + "\n"


def to_json(diff: BaselineDiff) -> dict[str, object]:
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
        "fields": [{**asdict(f), "changed": f.changed} for f in diff.fields],
    }


def render_diff(diff: BaselineDiff, fmt: str) -> str:
    """``text``, ``markdown`` or ``json``."""
    if fmt == "json":
        return json.dumps(to_json(diff), indent=2) + "\n"
    return render_markdown(diff) if fmt == "markdown" else render_text(diff)

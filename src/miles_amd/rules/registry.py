"""The rule registry: every kind in ``miles_amd.rules.kinds``, and judging one rule by it.

Decides which kinds exist (:data:`KINDS`: one per module of ``miles_amd.rules.kinds``,
found by listing that package, so a new module is a new kind) and applies a rule through
its kind: :func:`evaluate_rule` (a missing metric is ``not_measured``, or a failure when the rule is
required), :func:`expected_text` (the sentence stating a tolerance, the same in the gate and
in ``baseline diff``: ``tests/unit/test_gate_rules.py``) and
:func:`validate_rule` (the loader's check of a rule's fields and tolerance). It decides no
verdict (``miles_amd.judge.gate``) and reads no file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from miles_amd.rules import kinds
from miles_amd.rules.check import Check, Problem, RuleContext, Status, rule_check
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, KindName, Rule


def _discover() -> dict[KindName, KindSpec]:
    found = {}
    for module in sorted(pkgutil.iter_modules(kinds.__path__), key=lambda m: m.name):
        spec = importlib.import_module(f"{kinds.__name__}.{module.name}").SPEC
        if spec.name != module.name:
            raise ImportError(f"{kinds.__name__}.{module.name} declares kind {spec.name!r}")
        found[spec.name] = spec
    return found


KINDS: Mapping[KindName, KindSpec] = _discover()


def evaluate_rule(rule: Rule, ctx: RuleContext) -> Check:
    """Apply one baseline rule to the run; a missing metric is never a pass."""
    kind = KINDS[rule.kind]
    if not kind.needs_series:
        return kind.check(rule, (), ctx)
    assert rule.metric is not None
    series = ctx.evidence.series.get(rule.metric, ())
    if series:
        return kind.check(rule, series, ctx)
    detail = f"not measured: no {rule.metric} in any source (TensorBoard, CI history, job.log)"
    status: Status = "fail" if rule.required else "not_measured"
    return rule_check(rule, status, None, expected_text(rule, ctx.baseline, ctx.rollouts), detail)


def expected_text(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    """The one sentence stating ``rule``'s tolerance for a run of ``rollouts``."""
    return KINDS[rule.kind].expected(rule, baseline, rollouts)


def validate_rule(rule: Rule, baseline: Baseline) -> Problem | None:
    """Whether ``rule`` has exactly its kind's fields, and its tolerance is derived as
    declared or lies in its sane range. ``(JSON path below the rule, what, fix)``."""
    kind = KINDS[rule.kind]
    names = kind.params.names()
    for key in rule.params:
        if key not in names:
            takes = ", ".join(names) or "no other field"
            return (f".{key}", f"{rule.kind} takes {takes}, not {key}", f"remove {key}")
    return kind.validate(rule, baseline)

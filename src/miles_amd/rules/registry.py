"""Judging one rule through its kind (``miles_amd.rules.kinds.KINDS``).

Decides :func:`evaluate_rule` (the whole run, or its first ``k`` rollouts at a look as the
kind's ``looks`` says, a spending rule with its bound there; a missing metric is
``not_measured``, or a failure when the rule is required), :func:`expected_text` (the
tolerance sentence, the same in the gate and ``baseline diff``) and :func:`validate_rule`
(the loader's check of a rule's fields and tolerance). Decides no verdict; reads no file.
"""

from __future__ import annotations

from dataclasses import replace

from miles_amd.evidence.types import Series
from miles_amd.rules import looks
from miles_amd.rules.check import Check, Problem, RuleContext, Status, rule_check, step_range
from miles_amd.rules.kinds import KINDS, KindSpec
from miles_amd.rules.looks import rule_boundaries
from miles_amd.rules.model import BOUNDARIES, Baseline, Rule

__all__ = ["KINDS", "evaluate_rule", "expected_text", "rule_boundaries", "validate_rule"]


def evaluate_rule(rule: Rule, ctx: RuleContext, look: int | None = None) -> Check | None:
    """Apply one baseline rule to the whole run (``look`` None; a missing metric is never a
    pass), or to its first ``look`` rollouts: ``None`` when the kind judges nothing there
    (a ``final`` kind, a metric not logged that far, a spending rule without a bound there)."""
    kind = KINDS[rule.kind]
    if look is not None:
        return _at_look(kind, rule, ctx, look)
    if not kind.needs_series:
        return kind.check(rule, (), ctx)
    assert rule.metric is not None
    series = ctx.evidence.series.get(rule.metric, ())
    if series and kind.looks == "spending" and ctx.looks is not None:
        return _spending(kind, rule, series, ctx, None)
    if series:
        return kind.check(rule, series, ctx)
    detail = f"not measured: no {rule.metric} in any source (TensorBoard, CI history, job.log)"
    status: Status = "fail" if rule.required else "not_measured"
    return rule_check(rule, status, None, expected_text(rule, ctx.baseline, ctx.rollouts), detail)


def _at_look(kind: KindSpec, rule: Rule, ctx: RuleContext, look: int) -> Check | None:
    if kind.looks == "final" or rule.metric is None or look >= ctx.rollouts:
        return None
    steps = step_range(rule.metric, ctx.baseline, look)
    series = tuple(p for p in ctx.evidence.series.get(rule.metric, ()) if p[0] < len(steps))
    if not series:
        return None
    if kind.looks == "at_once":
        return kind.check(rule, series, replace(ctx, look=look))
    if not set(steps) <= {s for s, _ in series}:  # a spending look needs its rollouts whole
        return None
    return _spending(kind, rule, series, ctx, look)


def _spending(
    kind: KindSpec, rule: Rule, series: Series, ctx: RuleContext, look: int | None
) -> Check | None:
    """A spending rule at ``look`` (None: the last look, the whole run) with its bound there."""
    assert ctx.looks is not None
    at = ctx.rollouts if look is None else look
    bound = looks.boundary_at(rule, ctx.baseline, ctx.rollouts, ctx.looks, at)
    if bound is None:  # a look that spends nothing; the last look always spends the rest
        return None if look is not None else kind.check(rule, series, ctx)
    check = kind.check(rule, series, replace(ctx, look=look, limit=bound.z))
    where = f"look at rollout {at}" if look is not None else f"last look (rollout {at})"
    detail = check.detail if look is None else f"{where}: {check.detail}"
    numbers = check.numbers
    if look is not None:  # an interim look's check says which look and what it had spent
        numbers = {**numbers, "look": look, "alpha_spent": bound.alpha_spent}
    expected = f"{check.expected} at the {where}, α spent {bound.alpha_spent:.3g}"
    return replace(check, detail=detail, expected=expected, numbers=numbers, look=look)


def expected_text(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    """The one sentence stating ``rule``'s tolerance for a run of ``rollouts``."""
    return KINDS[rule.kind].expected(rule, baseline, rollouts)


def validate_rule(rule: Rule, baseline: Baseline) -> Problem | None:
    """Whether ``rule`` has exactly its kind's fields, and its tolerance is derived as
    declared or lies in its sane range. ``(JSON path below the rule, what, fix)``."""
    kind = KINDS[rule.kind]
    names = kind.params.names() + ((BOUNDARIES,) if kind.looks == "spending" else ())
    for key in rule.params:
        if key not in names:
            takes = ", ".join(names) or "no other field"
            return (f".{key}", f"{rule.kind} takes {takes}, not {key}", f"remove {key}")
    return kind.validate(rule, baseline) or looks.boundaries_problem(rule, baseline)

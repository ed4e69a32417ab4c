"""The rules' checks of a run, at its looks, for the gate and the watcher.

Decides the gate's rule checks (a ``spending`` rule's first failing look is its check), the
watcher's (``at_once`` rules on what is read, ``spending`` rules at each look reached) and when a
red run was decided. A look only fails a run. The rccl control arm is judged against stock's
baseline by the rules that take no tolerance from the reference run (the others
``not_measured``, naming ``miles-amd compare``); a record-only run by ``EVIDENCE_KINDS`` only.
``docs/gate-and-statistics.md`` ("Judging a run at its looks"), ``docs/node.md``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from miles_amd.evidence.types import RunEvidence, Series
from miles_amd.rules.check import Check, RuleContext, rule_check
from miles_amd.rules.looks import run_looks
from miles_amd.rules.model import Baseline, Rule
from miles_amd.rules.registry import KINDS, evaluate_rule, expected_text

__all__ = ["CONTROL_ARM", "Decision", "decision", "early_rule_failures", "rule_checks"]

CONTROL_ARM = "rccl"
# The rule kinds a record-only run is judged by: evidence, not statistics (the job's end,
# every step, finite values, the absolute spike threshold, the reward's k/64 grid of the batch
# shape); every other kind is recorded, not judged.
EVIDENCE_KINDS = frozenset({"job_status", "steps_complete", "finite", "all_below", "multiple_of"})


def reference_bound(rule: Rule) -> bool:
    """Whether ``rule``'s tolerance comes from the reference run (module doc)."""
    kind = KINDS[rule.kind]
    return kind.rederive is not None or kind.reference_series


@dataclass(frozen=True)
class Decision:
    """When a red run was decided: after ``rollout`` rollouts, by ``check``."""

    rollout: int
    check: str
    alpha_spent: float | None  # the rate the check's rule had spent (a spending rule)
    at_look: bool  # decided by a look before the last rollout


def rule_checks(ctx: RuleContext, *, control: bool, record_only: str | None = None) -> list[Check]:
    """The rules' checks of a run (``docs/gate-and-statistics.md``, "Judging a run at its
    looks"); the control arm's reference-bound rules, and a record-only key's statistical ones
    (all but ``EVIDENCE_KINDS``), are recorded, not judged."""
    checks = []
    for rule in ctx.baseline.rules:
        statistical = rule.kind not in EVIDENCE_KINDS
        if (control and reference_bound(rule)) or (record_only and statistical):
            detail = (
                f"no reviewed baseline for {record_only}: recorded, not judged"
                if record_only
                else f"not measured: the {CONTROL_ARM} control arm has no baseline, and this "
                f"tolerance comes from the {ctx.baseline.name} reference run; measure it with "
                "`miles-amd compare --run-dir <stock run of this node> --run-dir <this run> "
                "--baseline stock`"
            )
            expected = expected_text(rule, ctx.baseline, ctx.rollouts)
            check = rule_check(rule, "not_measured", None, expected, detail)
            checks.append(replace(check, required=False))  # optional: recorded, not judged
            continue
        final = evaluate_rule(rule, ctx)
        assert final is not None  # the whole run always gets a check
        checks.append(_first_failing_look(rule, ctx) or final)
    return checks


def _first_failing_look(rule: Rule, ctx: RuleContext) -> Check | None:
    if ctx.looks is None or KINDS[rule.kind].looks != "spending":
        return None
    for look in ctx.looks[:-1]:
        check = evaluate_rule(rule, ctx, look=look)
        if check is not None and check.failed:
            return check
    return None


def early_rule_failures(
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    looks: bool = True,
    reference_free: bool = False,
) -> list[Check]:
    """The rule checks a run read so far has already failed; [] while none
    (``docs/gate-and-statistics.md``, "Judging a run at its looks")."""
    rollouts = baseline.run_shape.rollouts
    declared = run_looks(baseline.run_shape, rollouts) if looks else None
    ctx = RuleContext(evidence, baseline, rollouts, looks=declared)
    skip_bound = reference_free or evidence.variant == CONTROL_ARM
    failed = []
    for rule in baseline.rules:
        kind = KINDS[rule.kind]
        series = evidence.series.get(rule.metric, ()) if rule.metric is not None else ()
        if not series or kind.looks == "final" or (skip_bound and reference_bound(rule)):
            continue
        if kind.looks == "at_once":
            seen = _rollouts_seen(series, rule.metric or "", baseline)
            check = evaluate_rule(rule, ctx, look=seen if seen < rollouts else None)
        else:
            check = _first_failing_look(rule, ctx)
        if check is not None and check.failed:
            failed.append(check)
    return failed


def _rollouts_seen(series: Series, metric: str, baseline: Baseline) -> int:
    """The rollouts a series has reached: its last step's rollout plus one."""
    last = max(step for step, _ in series)
    return _rollout_of(last, metric, baseline) + 1


def _rollout_of(step: int, metric: str, baseline: Baseline) -> int:
    per = baseline.run_shape.train_steps_per_rollout if metric.startswith("train/") else 1
    return max(step, 0) // per


def decision(
    checks: Sequence[Check], evidence: RunEvidence, baseline: Baseline, rollouts: int
) -> Decision | None:
    """When the failed ``checks`` decided the run; None when none failed
    (``docs/gate-and-statistics.md``, "Judging a run at its looks")."""
    gated = {r.metric for r in baseline.rules if r.metric is not None}
    seen = [
        _rollouts_seen(series, metric, baseline)
        for metric, series in evidence.series.items()
        if metric in gated and series
    ]
    reached = min(max(seen), rollouts) if seen else rollouts
    best: tuple[int, bool, Check] | None = None
    for check in checks:
        if not check.failed:
            continue
        at, specific = reached, True
        if check.look is not None:
            at = check.look
        elif check.failing_steps and check.metric is not None:
            at = min(_rollout_of(s, check.metric, baseline) for s in check.failing_steps) + 1
        else:  # what only the run's end (or its stop) shows: decided where it got to
            specific = False
        found = (min(at, reached), not specific, check)  # a look or a value before a stop
        if best is None or found[:2] < best[:2]:
            best = found
    if best is None:
        return None
    at, _, check = best
    alpha = check.numbers.get("alpha_spent")
    return Decision(at, check.name, alpha, check.look is not None)

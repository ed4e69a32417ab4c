"""The rccl control arm: which baseline rules judge a run that has no baseline of its own.

A ``rccl`` run is gated against stock's baseline with only what takes no tolerance from the
reference run; a rule whose kind re-derives from or pairs with it (``rederive``,
``reference_series``) is ``not_measured``, naming ``miles-amd compare``. A record-only run
(no reviewed baseline for its key) is judged by :data:`EVIDENCE_KINDS` only. Pure.
``docs/node.md``.
"""

from __future__ import annotations

from dataclasses import replace

from miles_amd.rules.check import Check, rule_check
from miles_amd.rules.model import Baseline, Rule
from miles_amd.rules.registry import KINDS, expected_text

CONTROL_ARM = "rccl"
# The rule kinds a record-only run (no reviewed baseline for its key) is judged by: evidence,
# not statistics (the job's end, every step, finite values, the absolute spike threshold, the
# reward's k/64 grid of the batch shape); every other kind is recorded, not judged.
EVIDENCE_KINDS = frozenset({"job_status", "steps_complete", "finite", "all_below", "multiple_of"})


def reference_bound(rule: Rule) -> bool:
    """Whether ``rule``'s tolerance comes from the reference run (module doc)."""
    kind = KINDS[rule.kind]
    return kind.rederive is not None or kind.reference_series


def control_arm_check(
    rule: Rule, baseline: Baseline, rollouts: int, record_only: str | None = None
) -> Check:
    """A reference-bound rule not applied to the control arm, or a statistical rule not
    applied to a run whose key has no reviewed baseline (``record_only``: the key,
    ``miles_amd.baseline.keys``): optional, not measured."""
    detail = (
        f"no reviewed baseline for {record_only}: recorded, not judged"
        if record_only
        else f"not measured: the {CONTROL_ARM} control arm has no baseline, and this tolerance "
        f"comes from the {baseline.name} reference run; measure it with `miles-amd compare "
        "--run-dir <stock run of this node> --run-dir <this run> --baseline stock`"
    )
    check = rule_check(rule, "not_measured", None, expected_text(rule, baseline, rollouts), detail)
    return replace(check, required=False)

"""The rccl control arm: which baseline rules judge a run that has no baseline of its own.

Decides how a run labelled ``rccl`` (``miles_amd.variants``: aiter as installed, SGLang's own
all-reduce) is gated. It is gated against the stock baseline (the same aiter, the same node
kind) with only the checks that do not take their tolerance from the reference run: the
built-in evidence, environment (hardware, ROCm, aiter build; not the variant name), sentinel
and all-reduce checks, and the rules whose kind derives nothing from the reference
(``job_status``, ``steps_complete``, ``finite``, the spike threshold ``all_below``, the reward
grid ``multiple_of``, ``near_zero``, ``no_rising_trend``). A rule whose kind re-derives from
or pairs with the reference run (``KindSpec.rederive`` or ``reference_series``: the mean and
max bands, the reward's paired difference and its sd floor) is shown as not measured, with
the command that measures the control arm: ``miles-amd compare`` against a stock run of the
same node. Which variant a run is: ``RunEvidence.variant``.

Pure; reads nothing.

Explained for people in ``docs/node.md``.
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

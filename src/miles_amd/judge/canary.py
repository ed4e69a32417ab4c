"""The all-reduce canary, judged for the run, and a stock run's red that ROCm/aiter#5694 explains.

Decides ``allreduce.canary``: no canary.json, one that is not evidence for this run, or a clean
one whose positive control went uncaught is ``not_measured`` (a failure with ``require_env``);
a wrong sum fails, except on a stock run whose canary saw only #5694's stale read: that passes,
its spike failures are named the known bug, and a red run all of whose failures the bug
explains is an expected failure (the verdict stays ``fail``). ``docs/node.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from miles_amd.evidence.types import CanaryRecord, EnvRecord, RunEvidence
from miles_amd.rules.check import BuiltinCheck, Check, listed
from miles_amd.variants import AITER_FIX, AITER_VARIANTS, rollout_implementation

NAME = "allreduce.canary"
SPIKE_KIND = "all_below"
KNOWN = f"known: {AITER_FIX} reproduced by the canary ({NAME})"
_RATIONALE = (
    "a canary call whose exact sum is known proves the kernel wrong when it comes back "
    f"different; {AITER_FIX} is intermittent in a run, deterministic evidence in a canary"
)
_check = BuiltinCheck(NAME, "allreduce", _RATIONALE)
_LABELS = {
    "aiter": "aiter's CustomAllreduce",
    "sglang": "SGLang's own CustomAllreduce",
    "rccl": "RCCL (torch.distributed, the reference)",
    "reducer": "the CPU harness's --reducer",
}


def _label(implementation: str) -> str:
    return _LABELS.get(implementation, implementation)


def rollouts_use(variant: str | None) -> str:
    """The implementation the run's rollouts use (``variants.rollout_implementation``); aiter's when
    the run names no known variant."""
    return rollout_implementation(variant) if variant in AITER_VARIANTS else "aiter"


def canary_check(evidence: RunEvidence, variant: str | None, *, require_env: bool) -> Check:
    """``allreduce.canary`` of ``evidence`` for ``variant``; see the module doc."""
    record, want = evidence.canary, rollouts_use(variant)
    stock = variant == "stock"
    expected = f"{_label(want)}: 0 wrong sums" + (
        f" (a wrong sum reproduces {AITER_FIX})" if stock else ""
    )
    if record is None:
        detail = (
            "not measured: no canary.json in the run dir; run `miles-amd canary --variant "
            f"{variant or 'VARIANT'} --run-dir RUN` on the node (`miles-amd train` runs it "
            "before the job unless --no-canary)"
        )
        return _check.absent(None, expected, detail, require_env)
    foreign = not_evidence(record, variant, evidence.env)
    if not record.clean:
        if stock and not foreign and record.matches_stale_read:
            detail = (
                f"reproduced: {_wrong(record)}: the bug {AITER_FIX} fixes is on this node, so "
                "the A/B is meaningful on this node (not a failure of the change under test)"
            )
            return _check("pass", record.mismatches, expected, detail, require_env)
        detail = "; ".join([f"{_wrong(record)}: the all-reduce is wrong", *foreign])
        return _check("fail", record.mismatches, expected, detail, True)
    if foreign:
        detail = f"not evidence for this run: {'; '.join(foreign)} (it was clean: {_power(record)})"
        return _check.absent(0, expected, detail, require_env)
    control = record.control
    if control is not None and not control.caught:
        detail = (
            "not measured: the canary could not see this class of race here: its positive "
            f"control {control.implementation} made {control.calls} calls and none was wrong, "
            f"so a clean result says nothing (it was clean: {_power(record)})"
        )
        return _check.absent(0, expected, detail, require_env)
    detail = f"clean: {_power(record)}; " + (
        "no positive control ran, so whether the canary can see this race here is not shown"
        if control is None
        else f"its positive control {control.implementation} was caught ({control.mismatched_calls}"
        f" of {control.calls} calls wrong), so it can see this race here"
    )
    if stock:
        detail += (
            f"; the canary did not reproduce the bug {AITER_FIX} fixes, so the A/B says nothing "
            f"about {AITER_FIX} on this node"
        )
    return _check("pass", 0, expected, detail, require_env)


def not_evidence(record: CanaryRecord, variant: str | None, env: EnvRecord | None) -> list[str]:
    """Why ``record`` does not test what the run's rollouts ran; empty when it does."""
    want = rollouts_use(variant)
    run = f"the {variant} run" if variant else "the run"
    reasons = []
    if record.implementation != want:
        reasons.append(
            f"canary.json tested {_label(record.implementation)}, {run}'s rollouts use "
            f"{_label(want)}"
        )
    if record.variant is not None and variant is not None and record.variant != variant:
        reasons.append(f"canary.json was run for the {record.variant} variant, this is {run}")
    ours = env.aiter_commit if env is not None else None
    theirs = record.aiter_commit
    if (
        want == "aiter"
        and ours
        and theirs
        and not (ours.startswith(theirs) or theirs.startswith(ours))
    ):
        reasons.append(f"canary.json tested aiter {theirs}, env.json's aiter is {ours}")
    return reasons


def reproduced(evidence: RunEvidence, variant: str | None) -> bool:
    """Whether a stock run's canary of its rollouts' all-reduce found a wrong sum."""
    record = evidence.canary
    return (
        variant == "stock"
        and record is not None
        and not record.clean
        and record.matches_stale_read
        and not not_evidence(record, variant, evidence.env)
    )


def explain_known_bug(
    checks: Sequence[Check], evidence: RunEvidence, variant: str | None
) -> list[Check]:
    """``checks`` with a reproduced bug's spikes said to be it (module doc); else unchanged."""
    if not reproduced(evidence, variant):
        return list(checks)
    spikes = [c.name for c in checks if c.kind == SPIKE_KIND and c.failed]
    if not spikes:
        return list(checks)
    tripped = f"; it trips {listed(spikes)}: that failure is this known bug, not a surprise"
    return [
        replace(c, detail=f"{KNOWN}: {c.detail}")
        if c.name in spikes
        else replace(c, detail=c.detail + tripped)
        if c.name == NAME
        else c
        for c in checks
    ]


def _wrong(record: CanaryRecord) -> str:
    """The wrong sums: how many, from what, and the first: N, kernel path, element."""
    bad = record.first_bad()
    assert bad is not None  # only called on a record with a mismatch
    sizes = sum(1 for r in record.results if r.mismatches)
    path = f"aiter's {bad.kernel} path" + (
        ", non-uniform stage-1 trip count" if bad.affected else ""
    )
    first = bad.first_mismatch
    element = ""
    if first is not None and first.returned is not None:
        element = f"; first bad call: repeat {first.repeat} call {first.call} rank {first.rank} "
        element += f"returned {first.returned}"
    elif first is not None:
        element = (
            f"; first bad element: repeat {first.repeat} call {first.call} rank {first.rank} "
            f"index {first.index}: expected {first.expected:g}, seen {first.seen:g}"
        )
    reading = f"matches {AITER_FIX}'s stale read" if record.matches_stale_read else "another fault"
    return (
        f"{record.mismatches} wrong sum(s) from {_label(record.implementation)} at {sizes} "
        f"size(s) ({reading}), first at N={bad.tokens} ({path}, {bad.wave_class}){element}"
    )


def _power(record: CanaryRecord) -> str:
    power = record.power
    calls = sum(r.calls for r in record.results)
    return (
        f"{calls} calls over {len(record.results)} sizes from {_label(record.implementation)}; "
        f"a per-call rate >= {power.detect_rate:.3g} at the exposed sizes ({power.rate_source}) "
        f"is caught with probability {power.probability:.4f}"
    )


LOGPROB_METRIC = "train/train_rollout_logprob_abs_diff"
# spikes, mean, max, step, trend: the rule kinds a corrupted all-reduce moves
EXPLAINED_KINDS = ("all_below", "mean_within", "max_within", "step_rise", "no_rising_trend")
STOP_KINDS = ("job_status", "steps_complete")  # what a driver's stop leaves red by itself
REPRODUCED = f"{AITER_FIX} reproduced"


@dataclass(frozen=True)
class ExpectedFailure:
    """Why a red stock run is expected: the canary's evidence and the checks it explains."""

    canary: str
    checks: tuple[str, ...]

    @property
    def line(self) -> str:
        return (
            f"{REPRODUCED}: the canary found {self.canary}; the failing checks "
            f"({listed(list(self.checks))}) are the bug's, so this stock run is the A/B's "
            "control failing as expected"
        )


def expected_failure(
    checks: Sequence[Check], evidence: RunEvidence, variant: str | None
) -> ExpectedFailure | None:
    """The expected failure of a red stock run (module doc); None for any other run."""
    failing = [c for c in checks if c.failed]
    if not failing or not reproduced(evidence, variant) or evidence.canary is None:
        return None
    explained = {
        c.name for c in failing if c.metric == LOGPROB_METRIC and c.kind in EXPLAINED_KINDS
    }
    job = evidence.job  # the check the driver stopped the job for: a fail-fast trip or a look
    stopped_for = None
    if job is not None and job.stopped_by == "look" and job.look is not None:
        stopped_for = job.look.rule
    elif job is not None and job.stopped_by == "fail-fast" and job.failfast is not None:
        stopped_for = job.failfast.get("rule")
    stopped = isinstance(stopped_for, str) and stopped_for in explained
    if any(c.name not in explained and not (stopped and c.kind in STOP_KINDS) for c in failing):
        return None
    record = evidence.canary
    bad = record.first_bad()
    first = f", first at N={bad.tokens} ({bad.kernel} path)" if bad is not None else ""
    found = f"{record.mismatches} wrong sum(s) from {record.implementation}'s all-reduce{first}"
    return ExpectedFailure(found, tuple(c.name for c in failing))

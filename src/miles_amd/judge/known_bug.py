"""A stock run's red that ROCm/aiter#5694 explains: the A/B's control doing its job.

Decides :func:`expected_failure`. The stock leg runs the aiter without the fix, and the bug is
intermittent: when it shows, the stock baseline's logprob rules go red, which is exactly when
the A/B means something. So a red ``stock`` run is an expected failure when both hold:

- its canary reproduced the bug (``judge.canary.reproduced``: a wrong sum from the all-reduce
  the rollouts use, in a canary.json that is evidence for this run);
- every failing check is a rule of the metric the bug moves
  (:data:`LOGPROB_METRIC`) of a kind it explains (:data:`EXPLAINED_KINDS`: spikes, mean, max,
  step, trend), or a consequence of the driver stopping the job for one of those
  (``job.json``'s fail-fast trip or look names it): the job's status and the missing steps
  (:data:`STOP_KINDS`). On the node the watcher stops a stock run at its first spike, so the
  bug's red usually comes with both.

Anything else red on stock (the environment, a sentinel, a missing or non-finite step, the
reward, a canary that is absent, clean or not this run's) is a failure like any other. The
verdict stays ``fail`` and its exit code 1; the gate puts the answer on the verdict
(``Verdict.expected_failure``), the report and the verdict line say "ROCm/aiter#5694
reproduced", and the node's pytest marks the run xfail with it. Pure: reads nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.canary import reproduced
from miles_amd.rules.check import Check, listed
from miles_amd.variants import AITER_FIX

__all__ = ["EXPLAINED_KINDS", "LOGPROB_METRIC", "ExpectedFailure", "expected_failure"]

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
    stopped = _stopped_for(evidence) in explained
    if any(c.name not in explained and not (stopped and c.kind in STOP_KINDS) for c in failing):
        return None
    record = evidence.canary
    bad = record.first_bad()
    first = f", first at N={bad.tokens} ({bad.kernel} path)" if bad is not None else ""
    found = f"{record.mismatches} wrong sum(s) from {record.implementation}'s all-reduce{first}"
    return ExpectedFailure(found, tuple(c.name for c in failing))


def _stopped_for(evidence: RunEvidence) -> str | None:
    """The check the driver stopped the job for (a fail-fast trip or a look); None if none."""
    job = evidence.job
    if job is None:
        return None
    if job.stopped_by == "look" and job.look is not None:
        return job.look.rule
    if job.stopped_by == "fail-fast" and job.failfast is not None:
        rule = job.failfast.get("rule")
        return rule if isinstance(rule, str) else None
    return None

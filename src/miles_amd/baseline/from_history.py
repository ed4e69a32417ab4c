"""A baseline for a record-only key, derived from the trusted runs the history kept of it.

Decides, for ``miles-amd baseline record --from-history`` (``cli/baseline.py`` reads the
history and the run dirs; this module judges what they hold):

- which runs count: trusted (a gate pass not marked untrusted) runs of the key (shape, GPU
  model, variant: ``miles_amd.baseline.keys.run_key`` of each run dir, read again), each
  other one named with why it does not count;
- how many: at least :data:`MIN_TRUSTED_RUNS` (3). A band is derived from one reference
  run's per-rollout series with a declared run-level term; one run cannot show its level is
  typical of the key, two cannot say which of them is. With three the reference is the
  median run by the mean of ``train/train_rollout_logprob_abs_diff`` (one outlier run on
  either side cannot be it), and the other runs must pass the recorded baseline, or it is
  refused naming the run and its failing checks: a window whose runs disagree with each
  other is not one a reviewer should approve.

Pure; the recording itself is ``miles_amd.baseline.record``'s.

Explained in ``docs/ci.md`` ("Baselines per shape and GPU").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from miles_amd import numeric
from miles_amd.baseline.refusals import RecordError
from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.gate import judge
from miles_amd.rules.model import Baseline

__all__ = ["MIN_TRUSTED_RUNS", "Candidate", "check_window", "pick_reference"]

MIN_TRUSTED_RUNS = 3
PRIMARY = "train/train_rollout_logprob_abs_diff"


@dataclass(frozen=True)
class Candidate:
    """A trusted run of the key, as read back: its history id and its evidence."""

    run_id: int
    evidence: RunEvidence


def _level(candidate: Candidate) -> float:
    values = [v for _, v in candidate.evidence.series.get(PRIMARY, ())]
    return numeric.mean(values) if values else float("inf")


def pick_reference(
    candidates: Sequence[Candidate], key: str, *, passed_over: Sequence[str] = ()
) -> tuple[Candidate, list[Candidate]]:
    """The reference run (the median level) and the others; ``RecordError`` with fewer
    than :data:`MIN_TRUSTED_RUNS` (``passed_over``: why other runs did not count)."""
    if len(candidates) < MIN_TRUSTED_RUNS:
        why = f" ({'; '.join(passed_over)})" if passed_over else ""
        raise RecordError(
            f"--from-history: {len(candidates)} trusted run(s) of {key}{why}; a baseline needs "
            f"{MIN_TRUSTED_RUNS} (the median one is the reference, the others must pass it); "
            "fix: gate more runs of this key with --baseline auto into the history"
        )
    ordered = sorted(candidates, key=lambda c: (_level(c), c.run_id))
    reference = ordered[(len(ordered) - 1) // 2]
    return reference, [c for c in ordered if c is not reference]


def check_window(recorded: Baseline, others: Sequence[Candidate], key: str) -> None:
    """Every other trusted run passes the recorded baseline, else ``RecordError``."""
    rollouts = recorded.run_shape.rollouts
    for other in others:
        verdict = judge(other.evidence, recorded, expected_rollouts=rollouts)
        if verdict.verdict != "pass":
            failed = ", ".join(c.name for c in verdict.failures) or verdict.reason
            raise RecordError(
                f"--from-history: run {other.run_id} ({other.evidence.run_dir}), a trusted run "
                f"of {key}, fails the baseline recorded from the median run: {failed}; fix: "
                "mark it untrusted (miles-amd history mark-untrusted ID) if it is not a healthy "
                "run, or wait for more runs"
            )

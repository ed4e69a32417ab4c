"""What a judged run becomes in the history, and the append of it. Its identity comes from
the run, never the baseline that judged it (``recipe_digest`` plan.json's, ``variant`` and
``aiter_commit`` the run's, null when unrecorded); ``image`` ``$MILES_AMD_IMAGE``, ``commit``
``$GITHUB_SHA``; every point of the gated metrics; ``run_key`` (job id and evidence digest) so a
run gated again counts once; a red run's decision.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path

from miles_amd.baseline.model import RECIPE_DIR
from miles_amd.evidence.types import RunEvidence
from miles_amd.history.drift import metric_count, threshold
from miles_amd.history.store import HistoryRecord, HistoryStore, Identity, StoredRun
from miles_amd.judge.gate import Verdict
from miles_amd.rules.model import Baseline


def history_record(
    verdict: Verdict,
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    environ: Mapping[str, str],
    now: datetime | None = None,
) -> HistoryRecord:
    env, plan = evidence.env, evidence.plan
    metrics = dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None)
    run_dir = str(Path(verdict.run_dir).resolve())  # undecodable bytes (SQLite refuses) as \\xNN
    return HistoryRecord(
        created_at=(now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        recipe=RECIPE_DIR,
        recipe_digest=plan.identity_digest if plan is not None else None,
        variant=evidence.variant,
        aiter_commit=env.aiter_commit if env is not None else None,
        baseline=baseline.name,
        image=environ.get("MILES_AMD_IMAGE") or None,
        commit_sha=environ.get("GITHUB_SHA") or None,
        run_dir=run_dir.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"),
        verdict=verdict.verdict,
        reason=verdict.reason,
        rollouts=verdict.expected_rollouts,
        failed_checks=tuple(c.name for c in verdict.failures),
        series={m: evidence.series[m] for m in metrics if evidence.series.get(m)},
        run_key=run_key(evidence),
        decided_at_rollout=verdict.decision.rollout if verdict.decision else None,
        decided_by=verdict.decision.check if verdict.decision else None,
    )


def run_key(evidence: RunEvidence) -> str:
    """Which run this is: ``<job id>:<digest>``, the digest (sha256, 12 hex) of every
    per-rollout series read, whatever the baseline gates; ``no-job`` without job.json."""
    job_id = evidence.job.job_id if evidence.job is not None and evidence.job.job_id else "no-job"
    canonical = json.dumps(
        {m: [[step, repr(v)] for step, v in points] for m, points in evidence.series.items()},
        sort_keys=True,
    )
    return f"{job_id}:{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


@contextlib.contextmanager
def appending_verdict(
    path: Path, record: HistoryRecord
) -> Iterator[tuple[int, list[StoredRun], int, list[str]]]:
    """Append ``record``, committed when the block ends; yields its id, the runs of its
    identity (oldest first), their drift threshold and the rows skipped as unreadable."""
    identity = Identity(record.recipe, record.recipe_digest, record.variant, record.aiter_commit)
    with HistoryStore(path) as store, store.appending(record) as run_id:
        read = store.read_runs(variant=record.variant)
        same = [r for r in read.runs if r.identity == identity]
        yield run_id, same, threshold(metric_count(same)), read.skipped

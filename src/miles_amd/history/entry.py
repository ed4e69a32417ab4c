"""What a judged run becomes in the history, and the gate's append at the CLI edge.

:func:`history_record` (pure) decides the record's fields from the verdict, the evidence,
the baseline and the process environment: ``recipe`` is the baselines' recipe directory
(``gpt_oss_20b_lora``); ``variant`` is env.json's ``aiter_variant``, else the baseline's
name when it names a variant (the run was judged as that variant); ``image`` is
``$MILES_AMD_IMAGE`` (the CI workflow sets it to the container image), ``commit`` is
``$GITHUB_SHA``; both null when unset (not recorded, not guessed). The series kept are the
baseline's gated metrics.

:func:`append_verdict` opens the store, appends, and returns the runs of that identity
including the new one with the k :func:`~miles_amd.history.drift.calibrated_k` gives for
the metrics they hold, for the drift check (``miles_amd.history.drift``). Only the
CLI calls it (``miles-amd gate`` and ``train --gate``, when a history is named), so judging
stays free of side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from miles_amd.baseline.model import RECIPE_DIR
from miles_amd.evidence.types import RunEvidence
from miles_amd.history.drift import calibrated_k, metric_count
from miles_amd.history.store import HistoryRecord, HistoryStore, StoredRun
from miles_amd.judge.gate import Verdict
from miles_amd.rules.model import Baseline
from miles_amd.variants import AITER_VARIANTS


def gated_metrics(baseline: Baseline) -> list[str]:
    return list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))


def history_record(
    verdict: Verdict,
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    environ: Mapping[str, str],
    now: datetime | None = None,
) -> HistoryRecord:
    """The record of one judged run; see the module doc."""
    variant = (evidence.env or {}).get("aiter_variant")
    if not isinstance(variant, str):
        variant = baseline.name if baseline.name in AITER_VARIANTS else None
    metrics = gated_metrics(baseline)
    return HistoryRecord(
        created_at=(now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        recipe=RECIPE_DIR,
        variant=variant,
        baseline=baseline.name,
        image=environ.get("MILES_AMD_IMAGE") or None,
        commit_sha=environ.get("GITHUB_SHA") or None,
        run_dir=str(Path(verdict.run_dir).resolve()),
        verdict=verdict.verdict,
        reason=verdict.reason,
        rollouts=verdict.expected_rollouts,
        failed_checks=tuple(c.name for c in verdict.failures),
        series={m: evidence.series[m] for m in metrics if evidence.series.get(m)},
    )


def append_verdict(
    path: Path, record: HistoryRecord
) -> tuple[int, list[StoredRun], int, list[str]]:
    """Append ``record`` to the store at ``path``; return its id, the runs of its identity
    (oldest first, the new one last), the calibrated k for them and a line per stored row
    that could not be read (skipped)."""
    with HistoryStore(path) as store:
        run_id = store.append(record)
        read = store.read_runs(variant=record.variant, baseline=record.baseline)
    return run_id, read.runs, calibrated_k(metric_count(read.runs)), read.skipped

"""What a judged run becomes in the history, and the gate's append at the CLI edge.

:func:`history_record` (pure) decides the record's fields from the verdict, the evidence,
the run's launch plan, the baseline and the process environment. The run's identity comes
from the run itself, never from the baseline it was judged by: ``recipe`` is the recipe
(``gpt_oss_20b_lora``) and ``recipe_digest`` the first 12 hex digits of the SHA-256 of
plan.json's resolved recipe without its locations and tracking switches
(:data:`NOT_IDENTITY`; null without plan.json); ``variant`` is env.json's ``aiter_variant``
and ``aiter_commit`` the commit of env.json's ``aiter`` fact (``"amd-aiter 0.1.5 @
0123456789ab"``); each null when the run does not record it (not guessed). ``baseline`` is
kept to say what judged it. ``image`` is ``$MILES_AMD_IMAGE`` (the CI workflow sets it to
the container image), ``commit`` is ``$GITHUB_SHA``; both null when unset. The series kept
are the baseline's gated metrics, every point (a non-finite one included).

:func:`append_verdict` opens the store, appends, and returns the runs of the new run's
identity including it, with the drift threshold for the metrics they hold
(``miles_amd.history.drift``). Only the CLI calls it (``miles-amd gate`` and ``train
--gate``, when a history is named), so judging stays free of side effects; :func:`read_plan`
is the CLI's read of plan.json.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from miles_amd import strict_json
from miles_amd.baseline.model import RECIPE_DIR
from miles_amd.evidence.types import RunEvidence
from miles_amd.history.drift import metric_count, threshold
from miles_amd.history.store import HistoryRecord, HistoryStore, Identity, StoredRun
from miles_amd.judge.environment import env_facts
from miles_amd.judge.gate import Verdict
from miles_amd.rules.model import Baseline
from miles_amd.run_dir import RunDir


def gated_metrics(baseline: Baseline) -> list[str]:
    return list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))


# plan.json recipe fields that say where or how a run is recorded, not what it trains
NOT_IDENTITY = frozenset(
    {
        "model_dir", "data_dir", "miles_dir", "megatron_dir",
        "use_wandb", "wandb_project", "wandb_group", "capture_metrics",
    }
)  # fmt: skip


def recipe_digest(plan: Mapping[str, Any] | None) -> str | None:
    """The digest of plan.json's ``recipe`` without :data:`NOT_IDENTITY` (None without one)."""
    recipe = (plan or {}).get("recipe")
    if not isinstance(recipe, Mapping):
        return None
    kept = {k: v for k, v in recipe.items() if k not in NOT_IDENTITY}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def aiter_commit(env: Mapping[str, object] | None) -> str | None:
    """The commit env.json's ``aiter`` fact names after `` @ `` (None when it names none)."""
    value = env_facts(env or {}).get("aiter", {}).get("value")
    if not isinstance(value, str) or " @ " not in value:
        return None
    commit = value.rsplit(" @ ", 1)[1].strip()
    return commit or None


def read_plan(run_dir: Path) -> Mapping[str, Any] | None:
    """plan.json of ``run_dir`` as an object; None when absent or unreadable (no digest)."""
    try:
        plan = strict_json.loads(RunDir(run_dir).plan_json.read_bytes())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, Mapping) else None


def history_record(
    verdict: Verdict,
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    environ: Mapping[str, str],
    plan: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> HistoryRecord:
    """The record of one judged run; see the module doc."""
    variant = (evidence.env or {}).get("aiter_variant")
    metrics = gated_metrics(baseline)
    return HistoryRecord(
        created_at=(now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        recipe=RECIPE_DIR,
        recipe_digest=recipe_digest(plan),
        variant=variant if isinstance(variant, str) and variant else None,
        aiter_commit=aiter_commit(evidence.env),
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
    (oldest first, the new one last), the drift threshold for them and a line per stored
    row that could not be read (skipped)."""
    with HistoryStore(path) as store:
        run_id = store.append(record)
        read = store.read_runs(variant=record.variant)
    identity = Identity(record.recipe, record.recipe_digest, record.variant, record.aiter_commit)
    same = [r for r in read.runs if r.identity == identity]
    return run_id, same, threshold(metric_count(same)), read.skipped
